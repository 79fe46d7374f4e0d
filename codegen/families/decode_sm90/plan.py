"""The decode sm_90a family's spec and plan: attention of a few new query tokens over a KV cache.

Decode reads every cached key and value once per step and does little arithmetic on them, so the kernel is
built for bandwidth: the query heads that share a K/V head and the S_q new tokens are packed into one tile's
rows (row r is token r // group of query head head_kv * group + r % group), so each K/V byte is loaded once for
all of them; each CTA streams one split of the cache's key blocks through a TMA ring; splits of one tile are
merged in the kernel by whichever CTA finishes last. The spec holds what changes the source (heads, head dim,
dtype, S_q, page size, masks); the cache's capacity, the batch, the lengths (`cache_seqlens`, on the device)
and the number of splits are run-time values, so no length ever compiles a new kernel.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from functools import cached_property

import layouts
from layouts.operands import WGMMA_M, TileRead, read_tile
from layouts.paged import PagedTile, paged_tile
from layouts.staging import F32_BYTES

from codegen.abi import KernelABI, SiblingKernel
from codegen.spec import MMA_K, ROWS_PER_CONSUMER, SUPPORTED_DTYPES, SUPPORTED_HEAD_DIMS, SpecError

from ..common import descriptor_address_shift, tma_origin_c, window_bounds
from .abi import append_abi, kernel_abi

ARCHS = ("sm_90a",)
THREADS_PER_WARPGROUP = 128
WARPS_PER_WARPGROUP = 4
MAX_CONSUMERS = 2  # warpgroups of 64 rows; a tile holds up to 128 packed rows
PRODUCER_REGS, CONSUMER_REGS = 24, 240  # setmaxnreg split with two consumers (as the forward family's)
# A gathering producer warpgroup computes a source address per 16 bytes: 24 registers spilled there (and 32 at
# D=96 with 128 rows), so it takes 40 and the consumers 232 (40 + 2 x 232: the 504 a 384-thread CTA launches with).
GATHER_PRODUCER_REGS, GATHER_CONSUMER_REGS = 40, 232
MAX_GATHER_BLOCK_N = 128  # the producer's 4 warps x 32 lanes, a lane holding one row's page
# Pages of at most this many rows are gathered unless the caller says otherwise. Shuffled pages against cuDNN's dense
# cache, gathered / by a TMA copy per page, on an H100 (bench/LOG.md, session 45): 8-row pages at 32 x 8k 0.965x /
# 0.950x, 8 x 32k 0.959x / 0.938x, 128 x 8k 0.986x / 0.981x, 1 x 32k 0.70x / 0.62x, 8 x 2k 0.80x / 0.69x, D=256 1.064x
# / 1.054x, D=64 0.939x / 0.940x (a tie); 16-row pages 0.985x / 0.990x at 32 x 8k, 0.984x / 1.009x at 8 x 32k, and at
# batch 1 0.74x / 0.99x: from 16 rows a page's TMA box is big enough. Pages of 1-4 rows are slower still by TMA (d8).
GATHER_MAX_PAGE_ROWS = 8
SM_SMEM_BYTES = 228 * 1024  # an sm_90 SM's shared memory (CUDA programming guide, compute capability 9.0)
CTA_RESERVED_SMEM = 1024    # the system's share of it for each resident CTA
SMEM_LIMIT = SM_SMEM_BYTES - CTA_RESERVED_SMEM  # one CTA per SM: 227 KB, the per-block opt-in maximum
REGISTERS_PER_SM = 64 * 1024
# CTAs resident per SM (DecodeSpec.ctas_per_sm). Two hold one consumer warpgroup each, so an SM still runs two
# consumers but a CTA's start (Q, the first loads) and end (its merge and store) overlap the other's stream; the
# batch policy (codegen.decode) takes them where the tiles fill a wave: at 32 x 2k 66.5 -> 64.5 us, pages of 16
# 258.7 -> 247.6 us, dense 32 x 8k and 32k unchanged; at B=1 they are slower (bench/LOG.md, "Decode", d11).
CTAS_PER_SM = (1, 2)
TWO_CTA_PRODUCER_REGS, TWO_CTA_CONSUMER_REGS = 40, 216  # (40 + 216) x 128 threads x 2 CTAs: the register file
# Keys per ring slot at two CTAs per SM: the widest block with two ring slots in half the SM's shared memory
# (none at D >= 192, whose plain 64-row Q and one slot alone take half; not tried with the swapped tiles' small Q).
TWO_CTA_BLOCK_N = {64: 128, 96: 64, 128: 64}
# ... where the rows are gathered into plain products: 80 keys (the widest two slots that fit) beat 64 with pages of
# 4 rows at 32 x 8k, 0.946x against 0.923x cuDNN in one process, while dense caches and 16-row pages by TMA lost
# 0.5-1.5% (d14). Swapped tiles take TWO_CTA_BLOCK_N's 64 (S^T's M windows): two slots deep 0.959x against 0.930x
# at 32 x 2k, 0.974x against 0.955x at 128 x 8k (three 0.959x / 0.979x; d19).
GATHER_TWO_CTA_BLOCK_N = {**TWO_CTA_BLOCK_N, 128: 80}
MIN_STAGES, MAX_STAGES = 2, 8
# Ring slots of swapped tiles at two CTAs per SM, at most: at D=128 three fit beside their small Q, but pages of 16
# rows by TMA lost 2.5% with them (32 x 8k 0.965x against 0.990x cuDNN in one process; dense and gathered tiles within
# 0.5%), and D=64's three 128-key slots lost 1.1% to two (32 x 8k 0.975x / 0.986x; d19). Plain tiles (and D=96,
# never swapped) take as many as fit, as they did: not measured against fewer.
TWO_CTA_SWAPPED_STAGES = {64: 2, 128: 2}
SMEM_ALIGN_SLACK = 1024
MBARRIER_ALIGN = 8
# Keys per ring slot, by head dim: the widest block whose K and V still leave three slots in shared memory
# (three blocks in flight per SM keep the copy engine busy; see bench/LOG.md, "Decode").
DEFAULT_BLOCK_N = {64: 128, 96: 128, 128: 128, 192: 64, 256: 64}
APPEND_SUFFIX = "_append"  # the append kernel's name: the attention kernel's and this
MAX_SPLITS = 128  # splits of one tile's keys (the merge loops over them; the workspace is sized by them)
# Up to this many splits of a tile (the portable cluster size) launch as one thread-block cluster: they start
# together on one GPC, and merge after the cluster barrier (each split a share of the tile's elements) instead of
# a fence, a counter and the last split merging alone. B=1 x 2k, 8 splits: 8.00 -> 6.96 us (bench/LOG.md,
# "Decode", d10); merging in CTA 0's shared memory over DSMEM measured slower (8.36 us).
MAX_CLUSTER_SPLITS = 8
# A bulk copy between CTAs' shared memories moves whole 16-byte units from and to 16-byte aligned addresses (PTX ISA
# "cp.async.bulk"): a split's staged rows for the push merge (Plan.push_merge) are padded to it.
BULK_COPY_ALIGN = 16
# 0: a dense cache; else rows per page of a paged cache, a TMA load per page and column block (layouts.paged; at
# most a TMA box). Pages of 1 row are refused to TMA at D=96, whose 64-byte rows would put every second page's
# TMA destination off the 128 bytes tensor copies need; gathered (DecodeSpec.gather) they load.
PAGE_SIZES = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256)
# Pages a key block may span with one producer thread reading their page-table entries and issuing their loads;
# a block spanning more has the producer warp's lanes take a page each (one coalesced read of 32 entries). One
# thread issues a tensor copy about every 120 cycles here, a warp's lanes about twice as fast, so every block of
# more than one page goes to the warp: at 32 x 8k, 8-row pages 0.486x -> 0.721x cuDNN, 16-row 0.862x -> 0.952x,
# 32-row 0.990x either way (bench/LOG.md, "Decode", d6).
MAX_PAGES_PER_THREAD = 1
WARP_THREADS = 32
# The K/V maps' L2 promotion: 128 bytes, not the forward's 256. Decode streams every byte once, and with 256 the
# widened fetches cost L2 lookups that capped the stream at 4.0 TB/s; 128 read 4.33-4.51 TB/s, 1.00-1.01x cuDNN
# at 32 x 8k, 128 x 8k and 8 x 32k where 256 gave 0.93-0.94x in the same run (bench/LOG.md, "Decode", d5).
KV_L2_PROMOTION_BYTES = 128
# Tiles of at most this many packed rows run the swapped products (DecodeSpec.swap): S^T = K Q^T and O^T = V^T P^T,
# keys and then the head dim as wgmma's M, the rows (rounded up to 8) as its N, P^T through shared memory. The
# plain S = Q K^T pads the rows to wgmma's M of 64, so at S_q = 1 and 4 query heads per K/V head it computes 16x
# the scores and exponentials it keeps, and batch-1 CTAs streamed at ~57 GB/s an SM behind that (bench/LOG.md d16).
SWAP_MAX_ROWS = 16
SWAP_N_STEP = 8  # wgmma's N comes in steps of 8
# K/V heads one tile may take (DecodeSpec.head_pack). At D=64 a head's piece of a (B, S, H_kv, D) cache row is 128
# bytes, 1 KB from the next key's; a CTA over one head streamed 3.6% slower than over the same bytes stored
# head-major (H100, bench/LOG.md d22), and a bare TMA stream of boxes over two adjacent heads (256-byte pieces) ran
# 4% faster than one head's (2890 against 2780 GB/s, scripts/stream_probe_heads.cu). Two heads' rows then share
# the swapped tiles' N (4 query heads x S_q 1 each: 8 columns either way), the other head's scores masked.
# A paged cache's page holds every head's rows of its keys, one head's 256 bytes 2 KB from the next key's (D=128),
# so a one-head tile loads a page's rows as 2 KB boxes (16-row pages); four heads a tile load 8 KB boxes, measured no
# faster at D=128 (d25): choose_head_pack keeps paged caches at one head.
HEAD_PACKS = (1, 2, 4)
MIN_BLOCK_N, MAX_BLOCK_N = 64, 256  # rows (keys x packed heads) and keys per ring slot


@dataclass(frozen=True)
class DecodeSpec:
    heads: int
    kv_heads: int
    head_dim: int
    q_len: int = 1        # new query tokens per sequence (S_q)
    dtype: str = "bf16"
    causal: bool = True   # among the new tokens: query t sees the cache and new tokens up to its own position
    window: tuple[int, int] = (-1, -1)  # (left, right) keys around each query's position; -1: unbounded
    softcap: float = 0.0
    page_size: int = 0
    gather: bool = False  # paged K/V by the producer warpgroup's 16-byte cp.async, not a TMA copy per page
    block_n: int = 0      # 0: DEFAULT_BLOCK_N
    stages: int = 0       # 0: as many as fit
    ctas_per_sm: int = 1  # CTAS_PER_SM: 2 runs one consumer warpgroup per CTA, two CTAs per SM
    swap: bool | None = None  # the swapped products (SWAP_MAX_ROWS); None: where they apply (resolve)
    head_pack: int = 1    # HEAD_PACKS: adjacent K/V heads per tile, loaded by one box (their rows interleaved)
    arch: str = "sm_90a"

    family = "decode_sm90"  # its kernel family (codegen.families.family_for), not a field

    def __post_init__(self) -> None:
        def need(ok: bool, message: str) -> None:
            if not ok:
                raise SpecError(message)

        need(self.arch in ARCHS, f"the decode kernel is written for {ARCHS}, not {self.arch!r}")
        need(isinstance(self.heads, int) and self.heads >= 1, f"heads must be a positive integer, got {self.heads!r}")
        need(isinstance(self.kv_heads, int) and self.kv_heads >= 1 and self.heads % self.kv_heads == 0,
             f"heads {self.heads} must be a multiple of kv_heads {self.kv_heads!r} (grouped-query attention)")
        need(self.head_dim in SUPPORTED_HEAD_DIMS,
             f"head_dim {self.head_dim} is not supported; choose one of {SUPPORTED_HEAD_DIMS}")
        need(self.dtype in SUPPORTED_DTYPES, f"dtype {self.dtype!r} is not supported; choose one of "
             f"{', '.join(SUPPORTED_DTYPES)}")
        need(isinstance(self.q_len, int) and self.q_len >= 1, f"q_len (S_q) must be a positive integer, got {self.q_len!r}")
        need(len(self.window) == 2 and all(isinstance(w, int) and w >= -1 for w in self.window),
             f"window must be (left, right), each >= 0 or -1 for unbounded; got {self.window!r}")
        need(self.softcap >= 0, f"softcap must be >= 0 (0: off), got {self.softcap!r}")
        need(self.page_size in PAGE_SIZES, f"page_size {self.page_size}: pages of {', '.join(map(str, PAGE_SIZES[1:]))} "
             "rows (a power of two up to a TMA box's 256), or 0 for a dense cache")
        need(not self.gather or self.page_size > 0, "gather loads a paged cache's rows; it needs a page_size")
        need(self.block_n == 0 or (self.block_n % MMA_K == 0 and self.block_n <= MAX_BLOCK_N
                                   and MIN_BLOCK_N <= self.block_n * self.head_pack),
             f"block_n must be a multiple of {MMA_K} up to {MAX_BLOCK_N}, of at least {MIN_BLOCK_N} rows with its "
             f"head pack's {self.head_pack} head(s) ({MIN_BLOCK_N // self.head_pack} keys), got {self.block_n}")
        need(self.stages == 0 or MIN_STAGES <= self.stages <= MAX_STAGES,
             f"stages must be {MIN_STAGES}..{MAX_STAGES} (0: as many as fit), got {self.stages}")
        need(isinstance(self.ctas_per_sm, int) and self.ctas_per_sm in CTAS_PER_SM,
             f"ctas_per_sm must be one of {CTAS_PER_SM}, got {self.ctas_per_sm!r}")
        need(self.ctas_per_sm == 1 or self.rows <= ROWS_PER_CONSUMER,
             f"two CTAs per SM hold one consumer warpgroup of {ROWS_PER_CONSUMER} rows each; this tile packs "
             f"{self.rows} (query heads per K/V head x S_q)")
        need(self.ctas_per_sm == 1 or self.head_dim in TWO_CTA_BLOCK_N,
             f"two CTAs per SM fit head dims {', '.join(map(str, TWO_CTA_BLOCK_N))}, not {self.head_dim}")
        need(self.swap in (None, True, False), f"swap must be True, False or None (chosen), got {self.swap!r}")
        need(self.head_pack in HEAD_PACKS, f"head_pack must be one of {HEAD_PACKS}, got {self.head_pack!r}")
        if self.head_pack > 1:
            need(self.kv_heads % self.head_pack == 0,
                 f"head_pack {self.head_pack} takes K/V heads {self.head_pack} at a time; {self.kv_heads} do not divide")
            need(not self.gather, "head_pack > 1 loads the heads' rows by TMA boxes, not gathered (gather=False)")
            need(self.swap is not False, "head_pack > 1 runs the swapped products (the heads' rows share N)")
        if self.swap:
            why = self.swap_refusal(self.block_n)
            need(why is None, f"the swapped products {why}")

    def swap_refusal(self, block_n: int) -> str | None:
        """Why the swapped products cannot run this tile with `block_n`-key blocks (0: not chosen yet), or None."""
        if self.rows > SWAP_MAX_ROWS:
            return (f"take tiles of at most {SWAP_MAX_ROWS} packed rows (K/V heads per tile x query heads per K/V "
                    f"head x S_q); this one packs {self.rows}")
        if self.head_dim % WGMMA_M:
            return f"take head dims in whole {WGMMA_M}-column windows (O^T's M), not {self.head_dim}"
        if block_n * self.head_pack % WGMMA_M:
            return f"take tiles in whole {WGMMA_M}-row windows (S^T's M), not {block_n * self.head_pack} rows"
        return None

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    @property
    def head_rows(self) -> int:
        """Packed query rows of one (sequence, K/V head): every token of every query head of the group."""
        return self.group * self.q_len

    @property
    def rows(self) -> int:
        """Packed query rows of a tile: head_pack K/V heads' head_rows each, one head's after the other."""
        return self.head_pack * self.head_rows

    @property
    def elem_bytes(self) -> int:
        return SUPPORTED_DTYPES[self.dtype]

    @property
    def fits_two_ctas(self) -> bool:
        """Whether the tile takes the two-CTA layout: one consumer warpgroup's rows, a head dim TWO_CTA_BLOCK_N holds."""
        return self.rows <= ROWS_PER_CONSUMER and self.head_dim in TWO_CTA_BLOCK_N

    @property
    def name(self) -> str:
        extras = "_swap" if self.swap else ""
        if self.window != (-1, -1):
            extras += "_win" + "_".join("inf" if w < 0 else str(w) for w in self.window)
        if self.softcap:
            extras += "_cap" + f"{self.softcap:g}".replace(".", "p")
        if self.page_size:
            extras += f"_page{self.page_size}" + ("_gather" if self.gather else "")
        if self.ctas_per_sm > 1:
            extras += f"_{self.ctas_per_sm}cta"
        if self.head_pack > 1:
            extras += f"_hp{self.head_pack}"
        return (f"flashgen_decode_{self.arch}_h{self.heads}_kvh{self.kv_heads}_d{self.head_dim}_{self.dtype}"
                f"_q{self.q_len}_{'causal' if self.causal else 'full'}_n{self.block_n or 'auto'}"
                f"_st{self.stages or 'auto'}{extras}")

    def replace(self, **changes) -> "DecodeSpec":
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["window"] = list(self.window)
        return d


@dataclass(frozen=True)
class SmemMap:
    q_offset: int
    q_bytes: int   # one row group's Q tile (Plan.q_rows rows)
    k_offset: int
    k_bytes: int   # one ring slot
    v_offset: int
    v_bytes: int
    bar_offset: int
    flag_offset: int  # one int: whether this CTA merges its tile's splits
    total: int
    swap_offset: int = 0  # the swapped products: each consumer's SwapRegion, swap_bytes apart
    swap_bytes: int = 0
    merge_offset: int = 0  # the push merge: MAX_CLUSTER_SPLITS slots of Plan.merge_slot_bytes (0 bytes: none)
    merge_bytes: int = 0


@dataclass(frozen=True)
class SwapRegion:
    """A consumer's shared memory for the swapped products: its P^T tile (O^T's B), then its warps' column maxima
    and column sums (4 x N floats each). At the end its rows' O changes fragment layout through its own K ring slot
    (Plan.swap_stage_bytes)."""
    pt_offset: int
    stats_offset: int
    sums_offset: int
    bytes: int

@functools.lru_cache(maxsize=256)
def resolve(spec: DecodeSpec) -> DecodeSpec:
    swappable = spec.swap is not False and spec.swap_refusal(TWO_CTA_BLOCK_N.get(spec.head_dim, 0)) is None
    two_cta = GATHER_TWO_CTA_BLOCK_N if spec.gather and not swappable else TWO_CTA_BLOCK_N
    # A head pack keeps a slot's bytes: its tile rows (head_pack x block_n) are the default block's.
    block_n = spec.block_n or (two_cta if spec.ctas_per_sm > 1 else DEFAULT_BLOCK_N)[spec.head_dim] // spec.head_pack
    spec = spec.replace(block_n=block_n)
    if spec.swap is None:
        why = spec.swap_refusal(block_n)
        if why and spec.head_pack > 1:
            raise SpecError(f"{spec.name}: head_pack {spec.head_pack} needs the swapped products, which {why}")
        spec = spec.replace(swap=why is None)
    if spec.gather and block_n > MAX_GATHER_BLOCK_N:
        raise SpecError(f"{spec.name}: a gathered block is at most {MAX_GATHER_BLOCK_N} keys (a lane of each producer "
                        f"warp holds one row's page), got block_n {block_n}")
    # With two key groups, block j goes to group j % 2 and sits in slot j % stages: an even ring gives each group
    # slots of its own. An odd one would have a group wait on a slot's next phase while the other group's block
    # before it is still landing, and pass on the older phase of the same parity (a ring of 3 faulted so).
    # tests/test_protocol_decode.py reproduces it on the CPU: this family's protocol.py, run with TMA loads landing
    # in any order (codegen/protocol.py's async_completions), finds the aliased wait on every odd ring from
    # stages + 1 blocks on; the model where loads complete at once passes it.
    step = Plan(spec).key_groups
    if spec.stages % step:
        raise SpecError(f"{spec.name}: with {step} key groups the ring's stages must be a multiple of {step}")
    if not spec.stages:
        capped = spec.ctas_per_sm > 1 and spec.swap
        deepest = TWO_CTA_SWAPPED_STAGES.get(spec.head_dim, MAX_STAGES) if capped else MAX_STAGES
        fitting = [n for n in range(MIN_STAGES, deepest + 1, step) if Plan(spec.replace(stages=n)).fits]
        if not fitting:
            packed = f" of {spec.head_pack} heads" if spec.head_pack > 1 else ""
            raise SpecError(f"{spec.name}: two ring slots of {block_n} keys{packed} do not fit shared memory; use a "
                            "smaller block_n" + (" or head_pack=1" if spec.head_pack > 1 else ""))
        spec = spec.replace(stages=max(fitting))
    plan = Plan(spec)
    plan.smem  # raises the shared-memory error for an explicit stage count
    if plan.moves_registers:  # setmaxnreg moves registers within the CTA's launch-time share of the file
        assert (plan.producer_regs + plan.consumers * plan.consumer_regs) * THREADS_PER_WARPGROUP * spec.ctas_per_sm \
            <= REGISTERS_PER_SM, spec
    plan.k_pages, plan.v_pages  # raises where the pages cannot be loaded into the tiles (1-row pages at D=96)
    return spec


@dataclass(frozen=True)
class Plan:
    spec: DecodeSpec

    @property
    def row_groups(self) -> int:
        """Consumer warpgroups that own 64 packed rows each: two where a tile has more than 64 rows."""
        return min(MAX_CONSUMERS, -(-self.spec.rows // ROWS_PER_CONSUMER))

    @property
    def key_groups(self) -> int:
        """Consumer warpgroups that share the rows and take alternate key blocks: two where the rows fit one
        warpgroup, so two blocks' QK, softmax and PV are in flight at once (one consumer alone kept the loads
        at 3.9-4.0 TB/s whatever the ring depth: bench/LOG.md, "Decode")."""
        return 1 if self.spec.ctas_per_sm > 1 else MAX_CONSUMERS // self.row_groups

    @property
    def consumers(self) -> int:
        return self.row_groups * self.key_groups

    @property
    def block_m(self) -> int:
        return self.row_groups * ROWS_PER_CONSUMER

    @property
    def tile_rows(self) -> int:
        """Rows of a K (and V) ring slot: block_n keys of each of the head pack's heads, interleaved (row
        head_pack * key + head)."""
        return self.spec.head_pack * self.spec.block_n

    @property
    def tiles_m(self) -> int:
        """Row tiles per (sequence, K/V head): more than one where S_q x group exceeds 128 (chunked prefill)."""
        return -(-self.spec.rows // self.block_m)

    @property
    def threads(self) -> int:
        return (1 + self.consumers) * THREADS_PER_WARPGROUP

    @property
    def q_rows(self) -> int:
        """Rows of a row group's Q tile: wgmma's M where Q is the A of S, only the tile's swap_n rows where it is the
        B of S^T (64 rows would waste 14 KB at D=128: room for a third ring slot at two CTAs per SM)."""
        return self.swap_n if self.spec.swap else ROWS_PER_CONSUMER

    @cached_property
    def q(self) -> layouts.OperandDerivation:
        """The row group's Q tile; as the B of S^T it is staged as a K tile is (N rows, K-major: coordinates n, k)."""
        return _derive("k" if self.spec.swap else "q", self.spec.arch, self.spec.head_dim, self.q_rows, self.spec.dtype)

    @cached_property
    def k(self) -> layouts.OperandDerivation:
        return _derive("k", self.spec.arch, self.spec.head_dim, self.tile_rows, self.spec.dtype, KV_L2_PROMOTION_BYTES,
                       self.spec.head_pack)

    @cached_property
    def v(self) -> layouts.OperandDerivation:
        return _derive("v", self.spec.arch, self.spec.head_dim, self.tile_rows, self.spec.dtype, KV_L2_PROMOTION_BYTES,
                       self.spec.head_pack)

    @cached_property
    def k_pages(self) -> PagedTile | None:
        """How a K tile is loaded from a paged cache by TMA (None: dense, or gathered by cp.async), verified against
        the TMA model."""
        return _paged(self.k, self.spec.page_size) if self.spec.page_size and not self.spec.gather else None

    @cached_property
    def v_pages(self) -> PagedTile | None:
        return _paged(self.v, self.spec.page_size) if self.spec.page_size and not self.spec.gather else None

    @property
    def producer_threads(self) -> int:
        """Producer threads that load a block: the whole warpgroup where it gathers, else page_lanes."""
        return THREADS_PER_WARPGROUP if self.spec.gather else self.page_lanes

    @property
    def producer_regs(self) -> int:
        if self.spec.ctas_per_sm > 1:
            return TWO_CTA_PRODUCER_REGS
        return GATHER_PRODUCER_REGS if self.spec.gather else PRODUCER_REGS

    @property
    def consumer_regs(self) -> int:
        if self.spec.ctas_per_sm > 1:
            return TWO_CTA_CONSUMER_REGS
        return GATHER_CONSUMER_REGS if self.spec.gather else CONSUMER_REGS

    @property
    def moves_registers(self) -> bool:
        """Whether the warpgroups rebalance registers by setmaxnreg (with two consumers, or two CTAs per SM)."""
        return self.consumers > 1 or self.spec.ctas_per_sm > 1

    @property
    def smem_limit(self) -> int:
        """Shared memory one CTA may take with spec.ctas_per_sm of them resident on an SM."""
        return SM_SMEM_BYTES // self.spec.ctas_per_sm - CTA_RESERVED_SMEM

    @property
    def page_lanes(self) -> int:
        """Producer threads that issue a paged block's loads, a page each in turn: one where a block spans at most
        MAX_PAGES_PER_THREAD pages (and for a dense cache), else the producer's warp."""
        pages = self.k_pages.pages if self.k_pages else 1
        return 1 if pages <= MAX_PAGES_PER_THREAD else WARP_THREADS

    @property
    def block_pages(self) -> int:
        """Pages a key block's K (and V) tile spans: 1 for a dense cache and for pages of a block or more."""
        pages = {t.pages if t else 1 for t in (self.k_pages, self.v_pages)}
        assert len(pages) == 1, "K and V tiles of a block span the same pages"
        return pages.pop()

    @property
    def pages_per_lane(self) -> int:
        """Pages of a block each issuing producer lane reads and loads."""
        return -(-self.block_pages // self.page_lanes)

    def _abi(self, push_merge: bool) -> KernelABI:
        # A ring slot is read by every row group's warpgroup, and by one key group's.
        return kernel_abi(stages=self.spec.stages, consumer_warps=self.row_groups * WARPS_PER_WARPGROUP,
                          kv_heads=self.spec.kv_heads, head_pack=self.spec.head_pack, tiles_m=self.tiles_m,
                          gather_threads=self.producer_threads if self.spec.gather else 0, push_merge=push_merge)

    @cached_property
    def abi(self) -> KernelABI:
        return self._abi(self.push_merge)

    @property
    def merge_slot_bytes(self) -> int:
        """One split's rows as the push merge stages them: O (the tile's rows x head_dim float32, row-major), then
        the rows' log2 logsumexps, padded to the bulk copy's unit."""
        rows = self.spec.rows
        return _align(rows * (self.spec.head_dim + 1) * F32_BYTES, BULK_COPY_ALIGN)

    @property
    def merge_region_bytes(self) -> int:
        """The push merge's slots: one for each split of a cluster of MAX_CLUSTER_SPLITS."""
        return MAX_CLUSTER_SPLITS * self.merge_slot_bytes

    @cached_property
    def push_merge(self) -> bool:
        """Whether a cluster's splits merge by pushing their rows into split 0's shared memory (one bulk copy each,
        landing on split 0's MergeFull barrier) instead of storing them to the workspace, meeting at the cluster
        barrier and reading them back from L2 (that store, barrier and read were 1.2-1.7 us of a batch-1 call on an
        H100: bench/LOG.md d28). Where the tile is one row tile and the slots of MAX_CLUSTER_SPLITS splits fit
        beside the ring; they never cost a ring slot (resolve picks the stages without them)."""
        if self.tiles_m > 1:
            return False
        try:
            self._layout(self._abi(True), self.merge_region_bytes)
        except SpecError:
            return False
        return True

    @cached_property
    def append_abi(self) -> KernelABI:
        return append_abi(kv_heads=self.spec.kv_heads)

    @property
    def append_threads(self) -> int:
        """One thread per 16 bytes of a new token's K (and V) row."""
        return self.spec.head_dim * self.spec.elem_bytes // 16

    @property
    def early_load(self) -> bool:
        """Whether a split's first key block is known before the sequence's length is read, so that the producer
        can load it first (the read cost ~0.4 us before the first load at batch 1, bench/LOG.md d16): split s starts
        at block s (measure_work) where no left window bound moves the first block with the length. A paged cache's
        TMA loads take that block's page-table entries unclamped by the length (a page past it is masked, one past
        the pool a zero-filled box; d31) where each issuing lane has one page of it (more spill the producer's
        registers: a block of 176 one-row pages); a gathered copy reads by address, so it waits for the length."""
        paged_ok = not self.spec.page_size or (not self.spec.gather and self.pages_per_lane == 1)
        return paged_ok and self.window_bounds[0] < 0

    @property
    def window_bounds(self) -> tuple[int, int]:
        return window_bounds(self.spec)

    @property
    def smem_align(self) -> int:
        return max(op.smem_align for op in self.staged_operands)

    @property
    def staged_operands(self) -> tuple[layouts.OperandDerivation, ...]:
        """Every tile an MMA reads from shared memory: Q, K, V, and P^T where the products are swapped."""
        return (self.q, self.k, self.v) + ((self.pt,) if self.spec.swap else ())

    @property
    def fits(self) -> bool:
        try:
            return self.smem.total <= self.smem_limit
        except SpecError:
            return False

    @cached_property
    def smem(self) -> SmemMap:
        return self._layout(self.abi, self.merge_region_bytes if self.push_merge else 0)

    def _layout(self, abi: KernelABI, merge_bytes: int) -> SmemMap:
        """Q, the K and V rings, the swapped products' regions, the push merge's slots, then the mbarriers of `abi`."""
        s = self.spec
        offset, placed = 0, {}
        for name, op, count in (("q", self.q, self.row_groups), ("k", self.k, s.stages), ("v", self.v, s.stages)):
            offset = _align(offset, op.smem_align)
            placed[name] = offset
            offset += count * op.smem_bytes
        swap_offset = swap_bytes = 0
        if self.swap_region:
            swap_offset = offset = _align(offset, self.pt.smem_align)
            swap_bytes = self.swap_region.bytes
            offset += self.consumers * swap_bytes
        merge_offset = _align(offset, BULK_COPY_ALIGN) if merge_bytes else 0
        offset = merge_offset + merge_bytes if merge_bytes else offset
        bar_offset = _align(offset, MBARRIER_ALIGN)
        flag_offset = bar_offset + abi.barriers.bytes
        total = flag_offset + 8 + SMEM_ALIGN_SLACK
        if total > self.smem_limit:
            raise SpecError(f"{s.name} needs {total} bytes of shared memory, over the {self.smem_limit}-byte limit; use "
                            "fewer stages or a smaller block_n")
        rings = s.stages * (self.k.smem_bytes + self.v.smem_bytes)
        assert placed["v"] == placed["k"] + s.stages * self.k.smem_bytes, "the K and V rings must be adjacent"
        if self.key_groups > 1 and self.exchange_bytes > rings:
            raise SpecError(f"{s.name}: the key groups' exchange of {self.exchange_bytes} bytes does not fit the "
                            f"{rings}-byte K/V rings")
        return SmemMap(placed["q"], self.q.smem_bytes, placed["k"], self.k.smem_bytes, placed["v"], self.v.smem_bytes,
                       bar_offset, flag_offset, total, swap_offset, swap_bytes, merge_offset, merge_bytes)

    # ----- the swapped products (DecodeSpec.swap; each read verified by layouts.operands.read_tile) -----

    @property
    def swap_n(self) -> int:
        """N of the swapped products: the tile's rows rounded up to wgmma's step (0: not swapped)."""
        return -(-self.spec.rows // SWAP_N_STEP) * SWAP_N_STEP if self.spec.swap else 0

    @cached_property
    def pt(self) -> layouts.OperandDerivation:
        """P^T of one key block: the tile's swap_n rows by the K/V tile's rows, those contiguous (a K-major B,
        staged as a K tile with the tile rows as its columns)."""
        return _derive("k", self.spec.arch, self.tile_rows, self.swap_n, self.spec.dtype)

    @cached_property
    def k_as_a(self) -> tuple[TileRead, ...]:
        """K as the A of S^T = K Q^T: 64-row windows of the tile (M), K over the head dim."""
        return _m_windows(self.k, self.tile_rows)

    @cached_property
    def q_as_b(self) -> TileRead:
        """Q as the B of S^T: N = the tile's first swap_n rows, K over the head dim."""
        return read_tile(self.q, row_name=self.q.coords_names[0], k_name="k", rows=self.swap_n)

    @cached_property
    def v_as_a(self) -> tuple[TileRead, ...]:
        """V as the A of O^T = V^T P^T: 64-column windows of the head dim (M), K over the tile's rows (MN-major:
        wgmma's transpose bit reads V as V^T)."""
        return _m_windows(self.v, self.spec.head_dim)

    @cached_property
    def pt_as_b(self) -> TileRead:
        """P^T as the B of O^T: N = the tile's swap_n rows, K over the block's keys."""
        return read_tile(self.pt, row_name="n", k_name="k", rows=self.swap_n)

    @cached_property
    def swap_region(self) -> SwapRegion | None:
        if not self.spec.swap:
            return None
        stats = WARPS_PER_WARPGROUP * self.swap_n * 4
        pt_bytes = self.pt.smem_bytes
        return SwapRegion(0, pt_bytes, pt_bytes + stats, _align(pt_bytes + 2 * stats, self.pt.smem_align))

    @property
    def swap_stage_bytes(self) -> int:
        """The rows' O as swap_n x head_dim floats (row-major), staged in a K ring slot at the end: key group g's
        blocks sit in slots of g's parity (the stages are a multiple of the key groups), so slot g is idle once g
        is past its last block."""
        stage = self.swap_n * self.spec.head_dim * 4
        assert stage <= self.k.smem_bytes, "a K ring slot holds the swapped rows' O in f32"
        return stage

    @property
    def exchange_bytes(self) -> int:
        """Where key groups merge: the second's O fragment, two row maxima and two partial row sums per thread, over
        the idle K/V rings."""
        return THREADS_PER_WARPGROUP * (self.spec.head_dim // 2 + 4) * 4

    @property
    def q_vector_elems(self) -> int:
        """Elements of a Q row a thread moves from global to shared memory at once (16 bytes, where the
        swizzled tile keeps them contiguous)."""
        return _sixteen_byte_run(self.q, "k", "the packed-row load")

    @property
    def k_row_vector_elems(self) -> int:
        """Elements of a K row a gathering thread copies at once (16 bytes, contiguous in the swizzled tile)."""
        return _sixteen_byte_run(self.k, "k", "the gathered load")

    @property
    def v_row_vector_elems(self) -> int:
        """Elements of a V row zeroed (or gathered) at once: 16 bytes. Past a sequence's end the cache holds
        anything, NaN included, and 0 * NaN is NaN in P V, hence the zeroing."""
        return _sixteen_byte_run(self.v, "n", "the tail zeroing")

    def origin_c(self, operand, names: tuple[str, str, str]) -> str:
        """The tile's tensor-map coordinates as C. The cache's capacity is a run-time tensor-map dimension, so
        only a map whose coordinates do not depend on it (one row per key) can serve."""
        if operand.tensor_map.kind != "row_tiles":
            raise SpecError(f"the {operand.operand} map's coordinates depend on the sequence length; decode needs "
                            "row tiles")
        return tma_origin_c(operand, names, seq_len=8)

    @cached_property
    def desc_address_shift(self) -> int:
        return descriptor_address_shift(self.staged_operands)

    mapped_operands = ("k", "v")  # q and o are read and written without tensor maps

    def manifest_tensor_maps(self) -> dict:
        """K's and V's maps as the launcher encodes them: the dense cache's, a page's (num_pages, page_rows, H_kv, D)
        with the page's box, or none where the producer gathers the rows by address."""
        if self.spec.gather:
            return {}
        out = {}
        for op in self.mapped_operands:
            pages = getattr(self, f"{op}_pages")
            described = pages.describe() if pages is not None else getattr(self, op).tensor_map.describe()
            names = {"H": "H_kv"} if pages is not None else {"S": "S_max", "H": "H_kv", "B": "B_cache"}
            out[op] = dict(described, dims=[names.get(d, d) for d in described["dims"]])
        return out

    def grid_description(self) -> dict:
        return self.abi.grid.describe("splits", "batch")

    def global_layout(self) -> str:
        s = self.spec
        cache = (f"k_cache, v_cache: (num_pages, {s.page_size}, {s.kv_heads}, {s.head_dim}) pages, page_table: int32 "
                 f"(B, max_pages) of page indices in key order" if s.page_size else
                 f"k_cache, v_cache: (B_cache >= B, S_max, {s.kv_heads}, {s.head_dim})")
        return (f"q, o: (B, {s.q_len}, {s.heads}, {s.head_dim}); {cache}, any 16-byte strides with the head dim "
                f"contiguous; cache_seqlens: int32 (B,); "
                f"lse: (B, {s.heads}, {s.q_len}) float32; workspace: float (B, grid.y, splits, {self.block_m}, "
                f"{s.head_dim} + 1) and int (B, grid.y) when splits > 1")

    def grid(self, batch: int, splits: int) -> tuple[int, int, int]:
        return self.abi.grid.dims(tiles_m=splits, batch=batch)

    def cluster_dims(self, splits: int) -> tuple[int, int, int] | None:
        """A launch's cluster shape: a tile's splits as one cluster (the grid's x is the split), or None for a
        plain launch (one split, or more than MAX_CLUSTER_SPLITS)."""
        if not 1 < splits <= MAX_CLUSTER_SPLITS:
            return None
        assert self.grid(1, splits)[0] == splits, "a tile's splits are the grid's x"
        return (splits, 1, 1)

    def sibling_kernels(self) -> tuple[SiblingKernel, ...]:
        """The append kernel, launched before the attention kernel when the step brings new tokens."""
        return (SiblingKernel(self.spec.name + APPEND_SUFFIX, self.append_abi, self.append_threads,
                              self.append_abi.grid.describe("", "batch")),)

    def append_grid(self, batch: int) -> tuple[int, int, int]:
        return (self.spec.q_len, self.spec.kv_heads, batch)


@functools.lru_cache(maxsize=256)
def _derive(operand: str, arch: str, head_dim: int, rows: int, dtype: str,
            l2_promotion_bytes: int = layouts.L2_PROMOTION_BYTES, head_pack: int = 1) -> layouts.OperandDerivation:
    return layouts.derive_operand(operand, arch=arch, head_dim=head_dim, block_rows=rows, dtype=dtype,
                                  l2_promotion_bytes=l2_promotion_bytes, head_pack=head_pack)


@functools.lru_cache(maxsize=256)
def _paged(tile: layouts.OperandDerivation, page_rows: int) -> PagedTile:
    try:
        return paged_tile(tile, page_rows)
    except layouts.LayoutError as e:
        raise SpecError(str(e)) from None


def _m_windows(tile: layouts.OperandDerivation, extent: int) -> tuple[TileRead, ...]:
    """A tile read as wgmma's A in 64-row windows of its `n` coordinate (`extent` of it), K along `k`, each verified."""
    return tuple(read_tile(tile, row_name="n", k_name="k", rows=WGMMA_M, row0=WGMMA_M * w)
                 for w in range(extent // WGMMA_M))


def _sixteen_byte_run(tile: layouts.OperandDerivation, dim: str, use: str) -> int:
    """Elements of `tile` along `dim` that are 16 contiguous bytes in its swizzled layout (a 16-byte access)."""
    run = tile.layout.contiguous_run(dim, tile.elem_bytes)
    elems = min(run, 16 // tile.elem_bytes)
    if elems * tile.elem_bytes != 16:
        raise SpecError(f"the {tile.operand.upper()} tile keeps only {run} elements contiguous; {use} needs 16 bytes")
    return elems


def gather_by_default(page_size: int, gather: bool | None = None, head_pack: int = 1) -> bool:
    """Whether a paged cache's rows are gathered by cp.async: `gather` where the caller chose, else for pages of at
    most GATHER_MAX_PAGE_ROWS rows of one head a tile (a head pack's boxes span its heads: TMA)."""
    if gather is not None:
        return bool(gather)
    return 0 < page_size <= GATHER_MAX_PAGE_ROWS and head_pack < 2


def make_plan(spec: DecodeSpec) -> Plan:
    return Plan(resolve(spec))


def _align(x: int, a: int) -> int:
    return -(-x // a) * a
