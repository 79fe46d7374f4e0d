"""The forward sm_90a family's plan: every number its kernel needs, resolved from a KernelSpec.

Warp roles, the shared-memory map, the ABI (parameters and mbarriers) and register budgets are decided here,
the measured tile defaults are looked up in `codegen.policy`; every layout number (tile bytes, wgmma
descriptors, the O staging formula, tensor-map boxes) is taken from `layouts.derive_operand`, which verifies
each derivation before returning it. The template renders the plan and invents nothing.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from functools import cached_property

import layouts
from layouts import fragments
from layouts.mma import FIELD_LIMIT

from codegen import policy
from codegen.abi import GridError, KernelABI
from codegen.spec import MMA_K, MULTICAST_CTAS, ROWS_PER_CONSUMER, KernelSpec, SpecError

from ..common import normalized_window, descriptor_address_shift, tma_origin_c, window_bounds
from .abi import kernel_abi

THREADS_PER_WARPGROUP = 128
WARPS_PER_WARPGROUP = THREADS_PER_WARPGROUP // 32
CONSUMER_WARPS = 2 * WARPS_PER_WARPGROUP  # the arrivals that release a K/V slot or Q: every consumer warp
MBARRIER_ALIGN = 8  # PTX ISA: an mbarrier object is 8-byte aligned
PRODUCER_REGS = 24   # setmaxnreg floor: the producer only issues TMA
CONSUMER_REGS = 240
# setmaxnreg moves registers within what the CTA got at launch: __launch_bounds__(384, 1) gives each thread
# 65536 / 384 rounded down to 8, 168. A consumer's setmaxnreg.inc waits until the producer's .dec has freed
# enough, forever if the split asks for more than the launch gave (v12 tried a 32-register producer: every
# kernel hung on the GPU).
LAUNCH_REGS = 65536 // (3 * THREADS_PER_WARPGROUP) // 8 * 8
if PRODUCER_REGS + 2 * CONSUMER_REGS > 3 * LAUNCH_REGS:
    raise RuntimeError(f"setmaxnreg split {PRODUCER_REGS} + 2 x {CONSUMER_REGS} exceeds the {3 * LAUNCH_REGS} registers "
                       "a thread of each warpgroup gets at launch: the consumers would wait forever")
SMEM_LIMIT = 227 * 1024  # per block on sm_90 (cudaDevAttrMaxSharedMemoryPerBlockOptin)
# The kernel rounds its dynamic base up to the tiles' alignment (Plan.smem_align), wasting at most this much.
SMEM_ALIGN_SLACK = 1024
# Per-tile CTAs of a causal grid dispatch in sections of (sequence, head) pairs whose K and V fit this much of L2,
# longest query tiles first across the section's heads (FA4's SingleTileLPTScheduler takes 50 MB too). Within a
# head, as before, the CTAs running together share its K/V; the section stops the last head's long tiles from
# starting a wave before the end (a list-scheduling model, bench/LOG.md "v22": 4 x 4k causal 561 -> 546 block
# times, 1 x 8k kv8 causal 549 -> 521).
L2_SECTION_BYTES = 50 * 1024 * 1024
MAX_SECTION_HEADS = 1 << 12
# multicast: a cluster CTA's shared addresses have bits above a wgmma descriptor's start field (address bits
# 4..17); the consumers mask them off their tiles' base once, which needs every tile to end below the field's limit
# whatever the low bits of the CTA's window (1 KB of it reserved by the system).
assert SMEM_LIMIT + 1024 <= FIELD_LIMIT, "a tile's shared address would not fit the descriptors' start field"
# multicast: the template pairs tiles m and m ^ 1, ranks r and r ^ 1, and multicasts with the CTA mask 0b11.
assert MULTICAST_CTAS == 2, "the fwd_sm90 template's multicast is written for pairs of CTAs"
MIN_STAGES = 2  # KernelSpec offers 2..4 (one stage would load nothing under compute)
MAX_VECTOR_BYTES = 16  # the widest shared/global access (ld.shared.v4.b32)


@functools.lru_cache(maxsize=1024)
def resolve(spec: KernelSpec) -> KernelSpec:
    """Fill the spec's defaults (block_n, pv_split, the knobs left None, stages) and check what depends on them."""
    # A PV split names its key block: (96, 32) asks for block_n 128 whatever the shape's default is.
    block_n = spec.block_n or (sum(spec.pv_split) if spec.pv_split else policy.default_block_n(spec))
    split = spec.pv_split or policy.default_pv_split(block_n)
    if sum(split) != block_n:
        raise SpecError(f"pv_split {split} must add up to block_n {block_n}")
    spec = spec.replace(block_n=block_n, pv_split=tuple(split), seq_len_k=spec.keys,
                        kv_heads=spec.kv_heads or spec.heads, window=normalized_window(spec))
    if spec.multicast is None:
        spec = spec.replace(multicast=policy.multicast_by_default(spec))
    if spec.pingpong is None:
        spec = spec.replace(pingpong=policy.pingpong_by_default(spec))
    if spec.persistent is None:
        spec = spec.replace(persistent=policy.persistent_by_default(spec))
    if spec.tile_overlap is None:
        spec = spec.replace(tile_overlap=policy.tile_overlap_by_default(spec))
    if spec.lazy_rescale is None:
        spec = spec.replace(lazy_rescale=bool(policy.choose("lazy_rescale", spec)))
    if not spec.stages:
        deepest = policy.max_stages(spec)
        fitting = [n for n in range(MIN_STAGES, deepest + 1) if _fits(Plan(spec.replace(stages=n)))]
        spec = spec.replace(stages=max(fitting, default=MIN_STAGES))  # if none fits, the shared-memory error says so
    return spec


def _fits(plan: "Plan") -> bool:
    try:
        return plan.smem.total <= SMEM_LIMIT
    except SpecError:
        return False


@dataclass(frozen=True)
class SmemMap:
    q_offset: int
    q_bytes: int  # one consumer's Q tile (also its O staging tile)
    k_offset: int
    k_bytes: int  # one stage
    v_offset: int
    v_bytes: int
    bar_offset: int
    barriers: int
    tile_slot_offset: int  # persistent: two 4-byte tile indices after the barriers
    total: int  # dynamic shared memory to request, alignment slack included


@dataclass(frozen=True)
class PvChunk:
    first: int  # first 16-key slice
    count: int  # slices in this chunk


@dataclass(frozen=True)
class Plan:
    spec: KernelSpec  # resolved: no defaults left

    @cached_property
    def q(self) -> layouts.OperandDerivation:
        return self._derive("q", ROWS_PER_CONSUMER)

    @cached_property
    def k(self) -> layouts.OperandDerivation:
        return self._derive("k", self.spec.block_n)

    @cached_property
    def v(self) -> layouts.OperandDerivation:
        return self._derive("v", self.spec.block_n)

    @cached_property
    def o(self) -> layouts.OperandDerivation:
        return self._derive("o", ROWS_PER_CONSUMER)

    def _derive(self, operand: str, rows: int) -> layouts.OperandDerivation:
        s = self.spec
        return _derive_operand(operand, s.arch, s.head_dim, rows, s.dtype)

    @property
    def threads(self) -> int:
        return 3 * THREADS_PER_WARPGROUP

    @cached_property
    def abi(self) -> KernelABI:
        s = self.spec
        return kernel_abi(stages=s.stages, persistent=bool(s.persistent), varlen=s.varlen,
                          consumer_warps=CONSUMER_WARPS, heads=s.heads, sinks=s.sinks,
                          cluster=MULTICAST_CTAS if s.multicast else 1)

    @property
    def window_bounds(self) -> tuple[int, int]:
        return window_bounds(self.spec)

    @property
    def m_blocks(self) -> int:
        return -(-self.spec.seq_len // self.spec.block_m)

    @property
    def pv_chunks(self) -> tuple[PvChunk, ...]:
        chunks, first = [], 0
        for size in self.spec.pv_split:
            chunks.append(PvChunk(first, size // MMA_K))
            first += size // MMA_K
        return tuple(chunks)

    def chunks_within(self, slices: int) -> tuple[PvChunk, ...]:
        """The PV split cut to its first `slices` 16-key slices (a short tail block's PV)."""
        cut = (PvChunk(c.first, min(c.count, slices - c.first)) for c in self.pv_chunks if c.first < slices)
        return tuple(cut)

    @property
    def smem_align(self) -> int:
        align = max(op.smem_align for op in (self.q, self.k, self.v, self.o))
        assert align <= SMEM_ALIGN_SLACK, f"the dynamic-base slack of {SMEM_ALIGN_SLACK} bytes cannot reach {align}"
        return align

    @cached_property
    def smem(self) -> SmemMap:
        s = self.spec
        if self.o.smem_bytes != self.q.smem_bytes or self.o.smem_align != self.q.smem_align:
            # O is staged in the consumer's own Q tile, so it must fit that tile exactly.
            raise SpecError("the O staging tile must have the Q tile's size and alignment")
        offset = 0
        placed = {}
        for name, derivation, count in (("q", self.q, 2), ("k", self.k, s.stages), ("v", self.v, s.stages)):
            offset = _align(offset, derivation.smem_align)
            placed[name] = (offset, derivation.smem_bytes)
            offset += count * derivation.smem_bytes
        barriers = self.abi.barriers
        bar_offset = _align(offset, MBARRIER_ALIGN)
        tile_slot_offset = bar_offset + barriers.bytes
        total = tile_slot_offset + (8 if s.persistent else 0) + SMEM_ALIGN_SLACK
        if total > SMEM_LIMIT:
            advice = ("use a smaller block_n (it has the fewest stages, 2, already)" if s.stages <= MIN_STAGES
                      else "use fewer stages or a smaller block_n")
            raise SpecError(f"{s.name} needs {total} bytes of shared memory, over the {SMEM_LIMIT}-byte limit; "
                            + advice)
        if s.persistent and (2 * self.o.smem_bytes > self.k.smem_bytes or self.o.smem_align > self.k.smem_align):
            raise SpecError(f"a persistent kernel stages both consumers' O tiles ({self.o.smem_bytes} bytes each) in "
                            f"a K slot of {self.k.smem_bytes} bytes; use block_n 128")
        for name, (off, nbytes) in placed.items():
            derivation = getattr(self, name)
            assert off % derivation.smem_align == 0 and nbytes % derivation.smem_align == 0, name
        return SmemMap(q_offset=placed["q"][0], q_bytes=placed["q"][1], k_offset=placed["k"][0],
                       k_bytes=placed["k"][1], v_offset=placed["v"][0], v_bytes=placed["v"][1],
                       bar_offset=bar_offset, barriers=barriers.count, tile_slot_offset=tile_slot_offset, total=total)

    def tiles_m(self, max_seqlen_q: int | None = None) -> int:
        """Query tiles per (head, sequence); a varlen batch passes its longest query sequence."""
        return self.m_blocks if max_seqlen_q is None else -(-max_seqlen_q // self.spec.block_m)

    def grid(self, batch: int, max_seqlen_q: int | None = None, sms: int = 0, clusters: int = 0) -> tuple[int, int, int]:
        """The launch grid (the ABI's rule) for `batch` entries (sequences when varlen) on `sms` SMs, or for a
        persistent grid of clusters, `clusters` of them resident at once."""
        try:
            return self.abi.grid.dims(tiles_m=self.tiles_m(max_seqlen_q), batch=batch, sms=sms, clusters=clusters)
        except GridError as e:
            raise SpecError(str(e)) from None

    @property
    def section_heads(self) -> int:
        """(Sequence, head) pairs per dispatch section of a causal grid: the largest power of two whose K and V
        (their K/V heads', shared by each group of query heads) fit L2_SECTION_BYTES, at least 1."""
        s = self.spec
        per_head = s.keys * s.head_dim * s.elem_bytes * 2 / s.group
        n = 1
        while n < MAX_SECTION_HEADS and 2 * n * per_head <= L2_SECTION_BYTES:
            n *= 2
        return n

    @property
    def tile_overlap(self) -> bool:
        """Whether a persistent kernel stores each tile's O under the next tile's first QK (KernelSpec.tile_overlap)."""
        s = self.spec
        return bool(s.tile_overlap and policy.alike_tiles(s))

    @property
    def tail_n(self) -> int:
        """The N of the last key block's QK^T where the keys end in a part block (KernelSpec.short_tail): its keys
        rounded up to a 16-key MMA slice. 0 where every block is whole, where lengths vary at run time, under a
        window (the last block a tile visits is then not the keys' end), or with a single key block."""
        s = self.spec
        part = s.keys % s.block_n
        if (not s.short_tail or s.varlen or self.window_bounds != (-1, -1) or part == 0 or s.keys < s.block_n
                or s.block_n > policy.SHORT_TAIL_MAX_BLOCK_N):
            return 0
        return _align(part, MMA_K)

    @property
    def qk_overwrites(self) -> bool:
        """Whether QK^T's first k-slice writes S without reading it (the others accumulate): where the policy
        measured it faster, and wherever a short tail needs it (its QK leaves S's last registers unwritten, and
        read-modify-write kept them live into the next tile's first QK, so ptxas serialized the wgmma pipeline
        for want of registers, C7511)."""
        return self.spec.head_dim >= policy.QK_OVERWRITES_MIN_HEAD_DIM or self.tail_n > 0

    @property
    def conditional_rescale(self) -> bool:
        """Whether O's rescale is skipped when no row max grew (a warp vote per key block; codegen.policy), as it
        always is with lazy_rescale, whose point is that vote."""
        return bool(self.spec.lazy_rescale or policy.choose("conditional_rescale", self.spec))

    @property
    def tail_rescale_vote(self) -> bool:
        """Whether a short last key block's step keeps the vote where the steady steps dropped it (codegen.policy)."""
        return self.conditional_rescale or bool(policy.choose("tail_rescale_vote", self.spec))

    @property
    def pin_softmax(self) -> bool:
        """Whether a steady step releases K's slot after the row maxima, its arrive's address taking a 0 computed
        from them, so ptxas keeps the maxima ahead of the PV wait (codegen.policy; bench/LOG.md v26)."""
        return bool(policy.choose("pin_softmax", self.spec))

    @property
    def tail_mask(self) -> bool:
        """Whether some key block holds keys past the end that its QK reads: a varlen sequence's last block may
        always be partial; a short tail block (tail_n) reads up to the next 16-key slice only."""
        s = self.spec
        return s.varlen or s.keys % (MMA_K if self.tail_n else s.block_n) != 0

    @property
    def prefetch_next_q(self) -> bool:
        """Whether the persistent producer prefetches the next tile's Q to L2 during this tile (alike tiles):
        where tiles are short, the next Q's DRAM latency is a visible share of a tile (codegen.policy)."""
        return policy.alike_tiles(self.spec) and self.spec.keys <= policy.PREFETCH_Q_MAX_KEYS

    @property
    def o_vector_elems(self) -> int:
        """Elements of O a thread copies at once when it stores a partial varlen tile without TMA: the widest
        run the O staging layout keeps contiguous along the head dim, up to a 16-byte access."""
        run = self.o.layout.contiguous_run("n", self.o.elem_bytes)
        elems = min(run, MAX_VECTOR_BYTES // self.o.elem_bytes)
        if elems * self.o.elem_bytes < 4:
            raise SpecError(f"the O staging layout keeps only {run} elements contiguous; the varlen tail store "
                            "needs at least 4 bytes")
        return elems

    def origin_c(self, operand: layouts.OperandDerivation, names: tuple[str, str, str]) -> str:
        """The operand tile's tensor-map coordinates as C over `names` (first sequence row, head, batch)."""
        return tma_origin_c(operand, names, self.spec.keys if operand.operand in ("k", "v") else self.spec.seq_len)

    @cached_property
    def desc_address_shift(self) -> int:
        """How a tile's shared address enters a descriptor built for address 0 (checked per operand)."""
        return descriptor_address_shift((self.q, self.k, self.v))


@functools.lru_cache(maxsize=64)
def _check_fragments(block_n: int, head_dim: int, tail_n: int = 0) -> None:
    """The template indexes S (N = block_n, and tail_n for a short last block) and O (N = head_dim) with the
    N=256 accumulator expressions and packs P straight from S: prove both for these N before rendering. A short
    tail block's QK writes the first tail_n/2 values of S's registers: the prefix check is what makes its
    values sit where the block_n expressions say. The mask takes each S value's key and query as its thread's
    value 0 plus a register part (tiles.j2, band_limits): S's map must be separable."""
    for n in (block_n, head_dim) + ((tail_n,) if tail_n else ()):
        fragments.check_accumulator_prefix(n)
    for n in (block_n,) + ((tail_n,) if tail_n else ()):
        fragments.s_slice_is_a_operand(n)
    fragments.check_separable(block_n)


@functools.lru_cache(maxsize=256)
def _derive_operand(operand: str, arch: str, head_dim: int, rows: int, dtype: str) -> layouts.OperandDerivation:
    """Derivations are pure and verified once each (sympy makes them ~30 ms): every call with a new shape
    resolves a spec, and each resolve tries several stage counts over the same few tiles."""
    return layouts.derive_operand(operand, arch=arch, head_dim=head_dim, block_rows=rows, dtype=dtype)


def clear_caches() -> None:
    """Forget resolved specs and derivations (for timing a cold generate-and-compile)."""
    resolve.cache_clear()
    _derive_operand.cache_clear()
    _check_fragments.cache_clear()


def make_plan(spec: KernelSpec) -> Plan:
    return Plan(resolve(spec))


def _align(x: int, a: int) -> int:
    return -(-x // a) * a

