"""The backward sm_90a family's spec and plan: dQ, dK and dV of softmax(Q K^T * scale) V.

Three kernels in one module (templates/bwd_sm90/):

* `_pre`  per query row: delta = rowsum(dO * O), the logsumexp in log2 units (+inf where the forward's is -inf,
  so a row that saw no key gets P = 0), and the row's fp32 dQ accumulator zeroed;
* main   one CTA per (key block, K/V head, sequence). Warpgroup 0's producer thread loads the block's K and V
  once, then Q, dO, the log2 logsumexps and deltas of every (query head of the group, query block) the keys
  are visible to, through a ring. Consumer warpgroup c owns keys [64c, 64c + 64) of the block and computes,
  per query block, S^T = K Q^T and dP^T = V dO^T (M = keys: the "swapped" products, so P^T and dS^T come out
  as accumulators whose registers are the A operand of the next products), then dV += P^T dO and
  dK += dS^T Q with A in registers, and dQ += dS K with dS^T staged in shared memory, added into the fp32
  accumulator by vector atomics. dK and dV stay in registers over the whole loop (summed over a GQA group's
  query heads) and are stored once;
* `_post` dQ = accumulator * scale in the input dtype (the scale already in, under `stage_under_st`).

Every shared-memory number comes from layouts/: the tiles from derive_operand and each of the tiles' several
reads (K-major and MN-major, 64-row windows) from layouts.operands.read_tile, verified before rendering.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from functools import cached_property

import layouts
from layouts.operands import TileRead, read_tile

from codegen.abi import KernelABI, SiblingKernel
from codegen.spec import SUPPORTED_DTYPES, SpecError

from ..common import descriptor_address_shift, tma_origin_c, window_bounds
from .abi import POST_PARAMS, PRE_PARAMS, kernel_abi, row_abi

ARCHS = ("sm_90a",)
THREADS_PER_WARPGROUP = 128
WARPS_PER_WARPGROUP = 4
CONSUMERS = 2                 # warpgroups of 64 keys each
KEYS_PER_CONSUMER = 64        # the M of S^T = K Q^T (wgmma is m64)
BLOCK_N = CONSUMERS * KEYS_PER_CONSUMER
# Queries per ring slot (the N of S^T, the K of dV += P^T dO), by head dim. dK and dV (head_dim / 2 f32 each per
# thread) live for the whole loop beside S^T and dP^T (block_m / 2 each): 128 queries fit 240 registers only at
# D=64, where they also halve the shared-memory reads per query of S^T's and dP^T's A (K, V) and of dQ's B (K):
# per 128 queries and consumer 112 KB instead of 144 KB (bench/LOG.md "Backward", b6; FA3's hopper/ picks
# 128 x 128 at D=64 and 64 x 128 above). With head dims above 128 dK and dV do not fit beside 64 queries either
# (a split of dK/dV across warpgroups is not written yet).
BLOCK_M_BY_HEAD_DIM = {64: 128, 96: 64, 128: 64}
# Wider head dims are the bwd_sm90_wide family's: it keeps dK and dV transposed (M = the head dim, split among its
# consumers) over 64-query blocks (codegen/families/bwd_sm90_wide/plan.py, SHAPES).
WIDE_BLOCK_M_BY_HEAD_DIM = {192: 64, 256: 64}
HEAD_DIMS = tuple(BLOCK_M_BY_HEAD_DIM) + tuple(WIDE_BLOCK_M_BY_HEAD_DIM)
# A soft cap keeps its tanh slope beside S^T: 128 queries at D=64 then spill 8 bytes (72 of the 120 soft-capped
# D=64 specs of b6's sweep; FA3 also drops to 96 x 128 there), so soft-capped kernels keep 64-query blocks.
SOFTCAP_BLOCK_M = 64
DQ_CHUNK_COLS = 64            # dQ += dS K is issued in chunks of at most this N (registers; whole swizzle atoms)
PRODUCER_REGS, CONSUMER_REGS = 24, 240
SMEM_LIMIT = 227 * 1024
SMEM_ALIGN_SLACK = 1024
MBARRIER_ALIGN = 8
STAGES = 2
# The launch order (KeyBlockGrid): under a banded mask (causal, windows) the first key blocks see the most queries.
# Where the grid is a few waves, launching the key block slowest over every pair (every long CTA first) keeps the
# long ones off the tail; where it is many, that thrashed L2 (bench/LOG.md, "Backward", b4: (1,8192,32,128) GQA
# causal, 512 CTAs, 0.744x -> 0.889x cuDNN; (4,4096,32,128) causal, 4096 CTAs, 0.846x -> 0.678x), so the pairs go in
# sections whose Q, dO and dQ accumulators fit half the L2, longest first within each (b11: a list-scheduling model,
# bench/wip/bwd_dispatch_model.py, has (4,4096,32,128) causal at 0.967 of its bound a pair at a time and 0.999 in
# sections of 4).
LONGEST_FIRST_MAX_WAVES = 4
# Without a band every CTA does the same work, so a grid of W waves plus r CTAs (r small) ends with r CTAs running
# alone for a whole CTA's time: (4,4096,32,128) is 31 waves and 4 CTAs, 3% of its time on 4 of 132 SMs. Those r
# CTAs are split into pieces over their query blocks, each piece's dK and dV added in fp32 and stored by the last
# piece (Plan.tail_split); a piece keeps at least this many query blocks, as its K/V load and fp32 adds cost about one.
TAIL_MIN_BLOCKS_PER_PIECE = 2
# Not at D=64: with 128-query blocks the split kernel spilled (S 1000, 4 bytes) and (16,1024,32,64) measured no gain
# (main kernel 0.802 -> 0.808 ms, b14).
TAIL_SPLIT_MIN_HEAD_DIM = 96
# A varlen kernel keeps its sequence's lengths in registers for the mask; with a soft cap and a band bounded on both
# sides (a left window and causal, or both bounds) that spilled at D=128 (20 bytes), so those are refused above D=96.
VARLEN_BANDED_SOFTCAP_MAX_HEAD_DIM = 96
L2_BYTES = 50 * 1024 * 1024   # H100 and H200
MAX_GRID_DIM = 65535          # gridDim.y and .z
PRE_SUFFIX, POST_SUFFIX = "_pre", "_post"  # the row kernels' names: the main kernel's and these
ROW_WARPS = 4                 # the row kernels (_pre, _post): four warps per block
ROW_THREADS = 32 * ROW_WARPS
# A row kernel's lane moves 16 bytes of the input dtype at a time (8 columns): with a warp per row and 4-byte
# loads, _pre and _post ran at 2.4 TB/s at D=64 (bench/LOG.md, b8), far from the ~4 TB/s a copy gets.
ROW_VECTOR_BYTES = 16


@dataclass(frozen=True)
class BackwardSpec:
    seq_len: int                # S_q
    seq_len_k: int              # S_k
    heads: int
    kv_heads: int
    head_dim: int
    dtype: str = "bf16"
    causal: bool = False
    window: tuple[int, int] = (-1, -1)  # (left, right) around each query's diagonal i + S_k - S_q; -1 unbounded
    softcap: float = 0.0
    stages: int = STAGES
    block_m: int = 0  # queries per ring slot; 0: BLOCK_M_BY_HEAD_DIM (resolve fills it in)
    # dQ's key blocks add in a fixed order (each waits for its turn), so gradients are bit-identical run to run.
    deterministic: bool = False
    # A varlen batch: seq_len and seq_len_k are the longest sequences' (rounded up by the caller), each sequence's
    # own lengths are read from cu_seqlens at run time.
    varlen: bool = False
    arch: str = "sm_90a"

    @property
    def family(self) -> str:
        """Its kernel family (codegen.families.family_for): bwd_sm90_wide for the head dims whose dK and dV do not fit
        beside S^T here."""
        return "bwd_sm90_wide" if self.head_dim in WIDE_BLOCK_M_BY_HEAD_DIM else "bwd_sm90"

    def __post_init__(self) -> None:
        def need(ok: bool, message: str) -> None:
            if not ok:
                raise SpecError(message)

        need(self.arch in ARCHS, f"the backward kernels are written for {ARCHS}, not {self.arch!r}")
        for name in ("seq_len", "seq_len_k", "heads", "kv_heads"):
            value = getattr(self, name)
            need(isinstance(value, int) and value >= 1, f"{name} must be a positive integer, got {value!r}")
        need(self.heads % self.kv_heads == 0, f"heads {self.heads} must be a multiple of kv_heads {self.kv_heads}")
        need(self.head_dim in HEAD_DIMS, f"head_dim {self.head_dim}: the backward kernels support {HEAD_DIMS} so far "
             "(those of the forward with whole 64-column swizzle atoms)")
        need(self.dtype in SUPPORTED_DTYPES, f"dtype {self.dtype!r} is not supported; choose one of "
             f"{', '.join(SUPPORTED_DTYPES)}")
        need(len(self.window) == 2 and all(isinstance(w, int) and w >= -1 for w in self.window),
             f"window must be (left, right), each >= 0 or -1 for unbounded; got {self.window!r}")
        need(self.softcap >= 0, f"softcap must be >= 0 (0: off), got {self.softcap!r}")
        need(isinstance(self.varlen, bool), f"varlen must be True or False, got {self.varlen!r}")
        two_sided = self.window[0] >= 0 and (self.causal or self.window[1] >= 0)
        need(not (self.varlen and self.softcap and two_sided and self.head_dim > VARLEN_BANDED_SOFTCAP_MAX_HEAD_DIM),
             f"head_dim {self.head_dim}: the backward of a variable-length batch with a soft cap and a band bounded on "
             f"both sides is written for head dims up to {VARLEN_BANDED_SOFTCAP_MAX_HEAD_DIM} so far (registers)")
        need(not (self.varlen and self.family != "bwd_sm90"),
             f"head_dim {self.head_dim}: the backward of variable-length batches is written for head dims "
             f"{tuple(d for d in HEAD_DIMS if d not in WIDE_BLOCK_M_BY_HEAD_DIM)} so far")
        need(isinstance(self.stages, int) and 2 <= self.stages <= 4, f"stages must be 2..4, got {self.stages!r}")
        need(self.block_m in (0, KEYS_PER_CONSUMER, 2 * KEYS_PER_CONSUMER),
             f"block_m must be {KEYS_PER_CONSUMER} or {2 * KEYS_PER_CONSUMER} (0: by head dim), got {self.block_m!r}")
        need(self.block_m <= self.max_block_m,
             f"block_m {self.block_m} with head_dim {self.head_dim}{' and a soft cap' if self.softcap else ''}: S^T "
             f"and dP^T of {self.block_m} queries do not fit the registers beside dK and dV; at most "
             f"{self.max_block_m}")

    @property
    def max_block_m(self) -> int:
        """The most queries per ring slot whose S^T and dP^T fit beside dK and dV (the default block_m)."""
        most = {**BLOCK_M_BY_HEAD_DIM, **WIDE_BLOCK_M_BY_HEAD_DIM}[self.head_dim]
        return min(most, SOFTCAP_BLOCK_M) if self.softcap else most

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    @property
    def elem_bytes(self) -> int:
        return SUPPORTED_DTYPES[self.dtype]

    @property
    def name(self) -> str:
        extras = "" if self.window == (-1, -1) else "_win" + "_".join("inf" if w < 0 else str(w) for w in self.window)
        if self.softcap:
            extras += "_cap" + f"{self.softcap:g}".replace(".", "p")
        if self.deterministic:
            extras += "_det"
        if self.varlen:
            extras += "_varlen"
        rows = f"_m{self.block_m}" if self.block_m else ""
        return (f"flashgen_bwd_{self.arch}_s{self.seq_len}_sk{self.seq_len_k}_h{self.heads}_kvh{self.kv_heads}"
                f"_d{self.head_dim}{rows}_{self.dtype}_{'causal' if self.causal else 'full'}_st{self.stages}{extras}")

    def replace(self, **changes) -> "BackwardSpec":
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["window"] = list(self.window)
        return d


@functools.lru_cache(maxsize=256)
def resolve(spec: BackwardSpec) -> BackwardSpec:
    """The spec with its defaults filled, by its own family (BackwardSpec.family: this one, or bwd_sm90_wide through
    the registry); raises SpecError where no kernel can be made."""
    if spec.family != "bwd_sm90":
        from codegen import families

        return families.get(spec.family).resolve(spec)
    return resolve_for(spec, Plan)


def resolve_for(spec: BackwardSpec, planner) -> BackwardSpec:
    """The defaults every backward family fills, and the refusals every one makes, with the family's plan class."""
    # A bound reaching past every key is none: one kernel (and no int overflow) for all of them.
    window = tuple(-1 if w >= spec.seq_len + spec.seq_len_k else w for w in spec.window)
    spec = spec.replace(window=window, block_m=spec.block_m or spec.max_block_m)
    if spec.deterministic and planner(spec).dq_split is None:
        raise SpecError(f"deterministic=True needs dQ added as one tile per key block, which head_dim {spec.head_dim} "
                        "does not have yet (its consumers add their own keys' dQ by atomics)")
    if planner(spec).n_blocks > MAX_GRID_DIM:
        raise SpecError(f"S_k {spec.seq_len_k}: more than {MAX_GRID_DIM} key blocks of {planner(spec).block_n} (the grid's "
                        "z limit)")
    planner(spec).smem  # raises the shared-memory error
    return spec


@dataclass(frozen=True)
class SmemMap:
    k_offset: int
    v_offset: int
    kv_bytes: int    # one K (or V) tile of BLOCK_N keys
    q_offset: int
    do_offset: int
    row_bytes: int   # one ring slot's Q (or dO) tile of block_m queries
    lse_offset: int
    delta_offset: int
    stats_bytes: int  # one ring slot's block_m floats
    ds_offset: int
    ds_bytes: int    # one consumer's dS^T tile
    dq_offset: int   # split mode: the fp32 dQ tile staged for the bulk reduce-add
    bar_offset: int
    total: int


@dataclass(frozen=True)
class DqChunk:
    first: int          # first head-dim column
    cols: int           # N of its wgmma
    reads: tuple        # per consumer: the K tile read as dQ's B (MN-major) over that consumer's keys


@dataclass(frozen=True)
class DqSplit:
    """dQ += dS K split between the consumers and added as one staged fp32 tile per query block. Consumer c
    computes the 64 x cols part of the tile at (row0[c], col0[c]) over all the block's keys: its A is dS read from
    each consumer's dS^T tile in turn (the same read, a[c], of either tile), its B is K read MN-major (b[c])."""
    by: str              # "columns" (64 queries, half the head dim each) or "rows" (128 queries, 64 each)
    cols: int
    a: tuple             # per consumer: TileRead of a dS^T tile as dQ's A (M = its queries, K = 64 keys)
    b: tuple             # per consumer: TileRead of K as dQ's B (N = its columns, K = the block's keys)
    row0: tuple
    col0: tuple

    def __post_init__(self) -> None:
        # The kernel computes consumer c's origin as c times a step (no per-consumer table read at run time).
        for origin in (self.row0, self.col0):
            assert origin == tuple(c * origin[1] for c in range(CONSUMERS)), origin

    @property
    def origins(self) -> tuple[tuple[int, int], ...]:
        return tuple(zip(self.row0, self.col0))

    @property
    def shared_a(self) -> bool:
        """Both consumers read dS the same way (columns): the kernel indexes the A table at compile time."""
        return all(a == self.a[0] for a in self.a)


@dataclass(frozen=True)
class BackwardPlan:
    """What both backward families (bwd_sm90, bwd_sm90_wide) plan alike: the staged Q, dO, K and V tiles, the launch
    shape, the ABIs, the row kernels and the workspaces. A family's Plan adds its products' tiles and reads."""

    spec: BackwardSpec
    dq_split = None  # dQ added as staged tiles (bwd_sm90's DqSplit), else by atomics

    def __post_init__(self) -> None:
        if not self.spec.block_m:
            raise ValueError("Plan needs a resolved spec (block_m filled in): use make_plan or resolve")

    @property
    def block_m(self) -> int:
        return self.spec.block_m

    block_n = BLOCK_N  # keys per CTA

    # ----- the staged tiles (row tiles: rows of the head dim, or of queries for dS^T) -----

    @cached_property
    def q(self) -> layouts.OperandDerivation:
        return _derive("k", self.spec.arch, self.spec.head_dim, self.block_m, self.spec.dtype)

    @property
    def do(self) -> layouts.OperandDerivation:
        return self.q  # dO is staged exactly as Q is, and read the same two ways

    @cached_property
    def k(self) -> layouts.OperandDerivation:
        return _derive("k", self.spec.arch, self.spec.head_dim, self.block_n, self.spec.dtype)

    @property
    def v(self) -> layouts.OperandDerivation:
        return self.k

    @property
    def threads(self) -> int:
        return (1 + CONSUMERS) * THREADS_PER_WARPGROUP

    @property
    def n_blocks(self) -> int:
        return -(-self.spec.seq_len_k // self.block_n)

    @property
    def m_blocks(self) -> int:
        return -(-self.spec.seq_len // self.block_m)

    @property
    def padded_rows(self) -> int:
        """Query rows of the per-row workspaces (log2 logsumexp, delta, dQ accumulator): whole query blocks, so
        the main kernel reads and adds them without bounds checks."""
        return self.m_blocks * self.block_m

    @cached_property
    def abi(self) -> KernelABI:
        return kernel_abi(stages=self.spec.stages, consumer_warps=CONSUMERS * WARPS_PER_WARPGROUP,
                          kv_heads=self.spec.kv_heads, n_blocks=self.n_blocks, split_dq=self.dq_split is not None)

    @property
    def row_vector(self) -> int:
        """Columns a row kernel's lane loads or stores at once (ROW_VECTOR_BYTES of the input dtype)."""
        return ROW_VECTOR_BYTES // self.spec.elem_bytes

    @property
    def row_lanes(self) -> int:
        """Lanes of a row kernel's warp per query row: the largest power of two (at most 32) dividing the row's
        vectors, so each lane takes the same number of them and a row's lanes are an aligned group for the
        shuffle reduction."""
        vectors = self.spec.head_dim // self.row_vector
        assert vectors * self.row_vector == self.spec.head_dim, (self.spec.head_dim, self.row_vector)
        return min(32, vectors & -vectors)

    @property
    def rows_per_row_block(self) -> int:
        rows = ROW_WARPS * (32 // self.row_lanes)
        # Whole warps of valid rows (the shuffle needs every lane), and whole blocks.
        assert self.padded_rows % rows == 0, (self.padded_rows, rows)
        return rows

    @cached_property
    def pre_abi(self) -> KernelABI:
        return row_abi(PRE_PARAMS, heads=self.spec.heads, padded_rows=self.padded_rows,
                       rows_per_block=self.rows_per_row_block)

    @cached_property
    def post_abi(self) -> KernelABI:
        return row_abi(POST_PARAMS, heads=self.spec.heads, padded_rows=self.padded_rows,
                       rows_per_block=self.rows_per_row_block)

    def grid(self, batch: int, tail: tuple[int, int] = (0, 1)) -> tuple[int, int, int]:
        """The main kernel's grid, with `tail` = tail_split(...)'s (units, pieces) where the tail is split."""
        return self.abi.grid.dims(batch=batch, tail_units=tail[0], tail_pieces=tail[1])

    splits_tail = False  # whether the kernel can run a CTA's query blocks as pieces (tail_split)

    def tail_split(self, batch: int, sms: int) -> tuple[int, int]:
        """(units, pieces): the last `units` CTAs of the launch order run as `pieces` CTAs each, splitting their
        query blocks (TAIL_MIN_BLOCKS_PER_PIECE says why); (0, 1) where nothing is split: under a band (the CTAs
        differ and the sections order them), in a varlen batch (its sequences differ too), in deterministic mode
        (the pieces' fp32 sums are in any order), under grouped-query heads (a piece is a run of one head's query blocks: the loops stay as they are, b14), or where
        the last wave is full enough that pieces would not fit beside it."""
        if not self.splits_tail:
            return 0, 1
        units = self.grid(batch)[0]
        tail = units % sms if units > sms else 0
        pieces = min(sms // tail, self.m_blocks // TAIL_MIN_BLOCKS_PER_PIECE) if tail else 1
        return (tail, pieces) if pieces >= 2 else (0, 1)

    @property
    def tail_counters(self) -> int:
        """Counters of a split unit in tail_count: one per consumer warp (each owns its rows of dK and dV)."""
        return CONSUMERS * WARPS_PER_WARPGROUP

    def tail_workspace(self, units: int) -> tuple[int, int]:
        """(floats, ints) of dkv_tail and tail_count for `units` split units."""
        return units * 2 * self.block_n * self.spec.head_dim, units * self.tail_counters

    def sibling_kernels(self) -> tuple[SiblingKernel, ...]:
        """The row kernels before and after the main one (launched in this order: _pre, main, _post)."""
        rows = self.pre_abi.grid.describe("", "batch")
        return (SiblingKernel(self.spec.name + PRE_SUFFIX, self.pre_abi, ROW_THREADS, rows),
                SiblingKernel(self.spec.name + POST_SUFFIX, self.post_abi, ROW_THREADS, rows))

    @property
    def pair_bytes(self) -> int:
        """What a (K/V head, sequence) pair's CTAs share in L2: Q and dO of its query heads, their dQ accumulators."""
        s = self.spec
        return s.group * s.head_dim * (2 * s.seq_len * s.elem_bytes + 4 * self.padded_rows)

    def section(self, batch: int, sms: int) -> int:
        """(K/V head, sequence) pairs per section of the launch order (LONGEST_FIRST_MAX_WAVES and L2_BYTES say
        why): without a band every CTA is alike and a pair's stay together (1); under one, every pair where the grid
        is a few waves, else the largest power of two whose pairs fit half the L2."""
        pairs = self.spec.kv_heads * batch
        if not (self.spec.causal or self.spec.window != (-1, -1)):
            return 1
        if self.grid(batch)[0] <= LONGEST_FIRST_MAX_WAVES * sms:
            return pairs
        section = 1
        while 2 * section <= pairs and 2 * (2 * section) * self.pair_bytes <= L2_BYTES:
            section *= 2
        return section

    def row_grid(self, batch: int) -> tuple[int, int, int]:
        """The row kernels' grid: row_lanes lanes per (sequence, head, padded query row)."""
        return self.pre_abi.grid.dims(batch=batch)

    @property
    def window_bounds(self) -> tuple[int, int]:
        return window_bounds(self.spec)

    # ----- shared memory: the tiles every family stages, placed with its own -----

    def place_tiles(self, tiles, advice: str) -> tuple[dict[str, int], int, int]:
        """(offsets by name, mbarrier offset, total bytes) of K, V, the Q and dO ring, the family's `tiles`
        ((name, align, bytes, count) each, after dO) and the per-row statistics, in this order; SpecError with
        `advice` over the shared-memory limit."""
        s, stats_bytes = self.spec, self.block_m * 4
        offset, placed = 0, {}
        for name, align, nbytes, count in (
                ("k", self.k.smem_align, self.k.smem_bytes, 1), ("v", self.k.smem_align, self.k.smem_bytes, 1),
                ("q", self.q.smem_align, self.q.smem_bytes, s.stages), *tiles,
                ("lse", 16, stats_bytes, s.stages), ("delta", 16, stats_bytes, s.stages)):  # bulk copies: 16 B
            offset = _align(offset, align)
            placed[name] = offset
            offset += count * nbytes
        bar_offset = _align(offset, MBARRIER_ALIGN)
        total = bar_offset + self.abi.barriers.bytes + SMEM_ALIGN_SLACK
        if total > SMEM_LIMIT:
            raise SpecError(f"{s.name} needs {total} bytes of shared memory, over the {SMEM_LIMIT}-byte limit; {advice}")
        return placed, bar_offset, total

    # ----- the launch as the manifest describes it -----

    def origin_c(self, operand: layouts.OperandDerivation, names: tuple[str, str, str], seq_len: int) -> str:
        return tma_origin_c(operand, names, seq_len)

    mapped_operands = ("q", "k", "v", "do")

    def grid_description(self) -> dict:
        return self.abi.grid.describe("", "batch")

    def global_layout(self) -> str:
        s = self.spec
        return (f"q, o, do: (B, {s.seq_len}, {s.heads}, {s.head_dim}); k, v: (B, {s.seq_len_k}, {s.kv_heads}, "
                f"{s.head_dim}), any 16-byte strides with the head dim contiguous; lse: (B, {s.heads}, {s.seq_len}) "
                f"float32; workspaces: log2 lse and delta (B, {s.heads}, {self.padded_rows}) float32, dQ accumulator "
                f"(B, {s.heads}, {self.padded_rows}, {s.head_dim}) float32; dq (B, {s.seq_len}, {s.heads}, "
                f"{s.head_dim}), dk, dv (B, {s.seq_len_k}, {s.kv_heads}, {s.head_dim}) contiguous")


@dataclass(frozen=True)
class Plan(BackwardPlan):
    """bwd_sm90: the swapped products (M = keys), dK and dV in registers beside S^T, dQ split or by atomics."""

    @property
    def splits_tail(self) -> bool:
        s = self.spec
        return (s.group == 1 and s.head_dim >= TAIL_SPLIT_MIN_HEAD_DIM
                and not (s.causal or s.window != (-1, -1) or s.deterministic or s.varlen))

    @cached_property
    def ds(self) -> layouts.OperandDerivation:
        """One consumer's dS^T: its 64 keys (rows) by the block's queries (columns)."""
        return _derive("k", self.spec.arch, self.block_m, KEYS_PER_CONSUMER, self.spec.dtype)

    # ----- the reads of each tile (layouts.operands.read_tile, each verified) -----

    @cached_property
    def kv_as_a(self) -> tuple[TileRead, ...]:
        """K (and V) as the A of S^T = K Q^T (dP^T = V dO^T): consumer c's 64-row window, K over the head dim."""
        return tuple(read_tile(self.k, row_name="n", k_name="k", rows=KEYS_PER_CONSUMER, row0=KEYS_PER_CONSUMER * c)
                     for c in range(CONSUMERS))

    @cached_property
    def q_as_b(self) -> TileRead:
        """Q (and dO) as the B of S^T (dP^T): N = the block's queries, K over the head dim."""
        return read_tile(self.q, row_name="n", k_name="k", rows=self.block_m)

    @cached_property
    def q_as_b_mn(self) -> TileRead:
        """Q (and dO) as the B of dK += dS^T Q (dV += P^T dO): N = the head dim, K over the queries."""
        return read_tile(self.q, row_name="k", k_name="n", rows=self.spec.head_dim)

    @cached_property
    def ds_as_a(self) -> TileRead:
        """dS^T as the A of dQ += dS K (64 queries, the tile's columns, as M; K over the consumer's keys), where
        each consumer adds its own keys' dQ (dq_chunks; block_m is 64 there)."""
        return read_tile(self.ds, row_name="k", k_name="n", rows=KEYS_PER_CONSUMER)

    @cached_property
    def dq_split(self) -> DqSplit | None:
        """How the consumers share dQ, so the block adds one staged tile instead of two:
        * rows (128-query blocks): consumer c computes queries [64c, 64c + 64) x the whole head dim; its A is the
          64-query window at column 64c of each dS^T tile, its B all of K;
        * columns (64-query blocks): consumer c computes the 64 queries x columns [c D/2, (c+1) D/2); its A is all of
          each dS^T tile, its B K read MN-major from column c D/2.
        None where the columns' read of K does not verify (D=96: half the head dim is not on a swizzle atom), and
        each consumer then adds its own keys' dQ by atomics (dq_chunks)."""
        d, rows = self.spec.head_dim, KEYS_PER_CONSUMER
        if self.block_m == CONSUMERS * rows:
            a = tuple(read_tile(self.ds, row_name="k", k_name="n", rows=rows, row0=rows * c) for c in range(CONSUMERS))
            b = read_tile(self.k, row_name="k", k_name="n", rows=d)
            return DqSplit("rows", d, a, (b,) * CONSUMERS, tuple(rows * c for c in range(CONSUMERS)), (0,) * CONSUMERS)
        try:
            b = tuple(read_tile(self.k, row_name="k", k_name="n", rows=d // CONSUMERS, row0=c * d // CONSUMERS)
                      for c in range(CONSUMERS))
        except layouts.LayoutError:
            return None
        return DqSplit("columns", d // CONSUMERS, (self.ds_as_a,) * CONSUMERS, b, (0,) * CONSUMERS,
                       tuple(c * d // CONSUMERS for c in range(CONSUMERS)))

    @property
    def stage_under_st(self) -> bool:
        """Split mode stages block t's dQ while block t + 1's S^T runs (bench/LOG.md, b9) where that compiles without
        spills: the columns split (D=128) without a soft cap. At D=64's 128-query blocks, S^T's 64 registers in
        flight beside the staged dQ spilled (8 of the sweep's D=64 specs), and so did 2 soft-capped D=128 ones."""
        return self.dq_split is not None and self.dq_split.by == "columns" and not self.spec.softcap

    @property
    def dq_stage_bytes(self) -> int:
        """The fp32 dQ tile of a query block, in the accumulator rows' order in global memory (layouts.staging), which
        one bulk reduce-add moves (split mode)."""
        return self.block_m * self.spec.head_dim * 4 if self.dq_split else 0

    @property
    def ds_buffers(self) -> int:
        """dS^T tiles per consumer: split mode reads the other consumer's too, so block t writes buffer t % 2 while
        the other consumer may still read block t - 1's."""
        return 2 if self.dq_split else 1

    @cached_property
    def dq_chunks(self) -> tuple[DqChunk, ...]:
        if self.dq_split:
            return ()
        d = self.spec.head_dim
        atom = self.k.swizzle.span_bytes // self.k.elem_bytes
        step = max(DQ_CHUNK_COLS // atom, 1) * atom  # chunks start on swizzle atoms
        chunks = []
        for first in range(0, d, step):
            cols = min(step, d - first)
            reads = tuple(read_tile(self.k, row_name="k", k_name="n", rows=cols, row0=first,
                                    k_first=KEYS_PER_CONSUMER * c, k_extent=KEYS_PER_CONSUMER)
                          for c in range(CONSUMERS))
            chunks.append(DqChunk(first, cols, reads))
        return tuple(chunks)

    # ----- launch shape -----

    @property
    def smem_align(self) -> int:
        return max(op.smem_align for op in (self.q, self.k, self.ds))

    @cached_property
    def smem(self) -> SmemMap:
        placed, bar_offset, total = self.place_tiles((
            ("do", self.q.smem_align, self.q.smem_bytes, self.spec.stages),
            ("ds", self.ds.smem_align, self.ds.smem_bytes, CONSUMERS * self.ds_buffers),
            ("dq", 16, self.dq_stage_bytes, 1)), "use fewer stages")
        return SmemMap(placed["k"], placed["v"], self.k.smem_bytes, placed["q"], placed["do"], self.q.smem_bytes,
                       placed["lse"], placed["delta"], self.block_m * 4, placed["ds"], self.ds.smem_bytes, placed["dq"],
                       bar_offset, total)

    @property
    def ds_pair_contiguous(self) -> bool:
        """A thread stores dS^T as pairs of adjacent queries (columns), one 32-bit store each."""
        return self.ds.layout.contiguous_run("k", self.ds.elem_bytes) >= 2

    @cached_property
    def desc_address_shift(self) -> int:
        return descriptor_address_shift((self.q, self.k, self.ds))

@functools.lru_cache(maxsize=256)
def _derive(operand: str, arch: str, head_dim: int, rows: int, dtype: str) -> layouts.OperandDerivation:
    return layouts.derive_operand(operand, arch=arch, head_dim=head_dim, block_rows=rows, dtype=dtype)


def make_plan(spec: BackwardSpec) -> Plan:
    return Plan(resolve(spec))


def _align(x: int, a: int) -> int:
    return -(-x // a) * a
