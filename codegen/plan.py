"""The plan: every number the kernel template needs, resolved from a KernelSpec.

Tile defaults, warp roles, the shared-memory map, barriers and register budgets are decided here; every
layout number (tile bytes, wgmma descriptors, the O staging formula, tensor-map boxes) is taken from
`layouts.derive_operand`, which verifies each derivation before returning it. The template renders the plan
and invents nothing.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from functools import cached_property

import sympy

import layouts
from layouts import fragments
from layouts.derive import to_c

from . import trace
from .spec import MMA_K, PERSISTENT_MAX_HEAD_DIM, ROWS_PER_CONSUMER, KernelSpec, SpecError

# Tile choices per head dim (bench/LOG.md has the measurements):
#   D=64, 128: block_n 128 keeps S (64 f32/thread) + P (32) + O (<=64) within the consumers' 240 registers.
#   D=256: O alone takes 128 registers/thread, so block_n 64 keeps S at 32. block_n 80 measured the same
#     (0.745x vs 0.737x cuDNN at (2,4096,16,256) bf16, scripts/ab.py, bench/results/ab-20261130T0802Z-*), so the
#     key-block size is not what held D=256 back: its two stages were (v10, 0.73x -> 1.02-1.05x).
#   D=96: block_n 128 as at D=128 (S 64 + P 32 + O 48 registers). Measured, same run (scripts/ab.py,
#     bench/results/ab-20261130T0848Z-d96-block_n.json): (2,4096,16,96) bf16 1.123x cuDNN vs block_n 64 1.027x,
#     (8,1024,16,96) 1.103x vs 0.989x.
#   D=192: block_n 64: O takes 96 registers, and Q 48 KB + 48 KB per stage fits 3 stages, where block_n 128
#     (96 KB per stage) would not fit even 2. Measured at (2,4096,16,192) bf16: block_n 64 0.995x cuDNN, 80 0.703x,
#     96 0.755x (same run, bench/results/ab-20261130T0802Z-*).
#   Wider key blocks (144..208, up to spec.MAX_ACCUMULATOR_REGISTERS; FlashAttention-3 runs D=128 as 128 x 176)
#     do not win. Before K and V were released separately (v10) they fit only 2 stages and lost 10-25% at D=128
#     (bench/results/ab-20261130T0858Z-wide-key-blocks-*). After it, same run (ab-20261130T0904Z-split-release-
#     block_n.json): (4,4096,32,128) 128: 1.005x, 176: 1.001x, 192: 1.011x; (1,16384,16,128) 0.966x, 1.006x,
#     1.022x; (16,1024,32,64) 128: 1.059x, 208: 1.027x, 224: 0.970x; (2,4096,16,256) 64: 1.054x, 80: 1.064x.
#     Within run-to-run spread (3-5%), so those defaults stay.
#   D=128, non-causal, long keys: block_n 176 (2 stages). Repeated, same run (ab-20261130T0912Z-d128-block_n-
#     176-192.json; base measured twice): (4,4096,32,128) 0.995x/0.997x -> 1.005x, (2,8192,16,128) 0.995x/1.004x
#     -> 1.095x, (1,16384,16,128) 1.022x/1.022x -> 1.038x, and (1,1024,64,128) 1.000x/1.003x -> 1.002x; block_n
#     192 loses at S=1024 (0.945x: 1024 keys end in a part block). Short keys (8 x 512: 0.862x vs 0.966x before
#     v10), causal and varlen are not measured with it and keep 128.
#   From 1024 keys since v13, once a part last block runs only over its keys (Plan.tail_n; 1024 = 5 x 176 + 144).
#     Same run, twice, flashgen ms (bench/results/ab-20261130T1133Z-block_n-1024.json): (1,1024,64,128) f16
#     0.0606-0.0611 -> 0.0599-0.0604, (2,1536,32,128) 0.1243-0.1252 -> 0.1201-0.1205; (16,1024,32,128) swung
#     0.42-0.47 ms in both. At 512 keys 176 lost (8 x 512: 0.978x vs 1.017x cuDNN,
#     ab-20261130T1125Z-block_n-short-keys.json).
#   D=64 from 1024 keys and D=256 from 4096, non-causal (v17, with interleaved timing, scripts/ab.py, two runs,
#     bench/results/ab-20261130T1630Z-knob-sweep.json): (16,1024,32,64) block_n 192 1.042x/1.044x against 128
#     1.033x/1.035x (176 1.040x/1.042x, 144 0.981x/0.983x); (2,4096,16,256) block_n 80 1.046x/1.136x against
#     64 1.036x/1.092x. Other lengths are not measured and keep the narrow block.
DEFAULT_BLOCK_N = {64: 128, 96: 128, 128: 128, 192: 64, 256: 64}
# head_dim -> (block_n, from how many keys) for dense attention (no causal or window bound, fixed lengths).
WIDE_BLOCK_N = {64: (192, 1024), 128: (176, 1024), 256: (80, 4096)}


def default_block_n(spec: KernelSpec) -> int:
    dense = not spec.causal and not spec.varlen and spec.window == (-1, -1)
    wide, min_keys = WIDE_BLOCK_N.get(spec.head_dim, (0, 0))
    if wide and dense and spec.keys >= min_keys:
        return wide
    return DEFAULT_BLOCK_N[spec.head_dim]


# The PV split: each chunk of PV(j-1) is its own wgmma group. Since the softmax of block j runs under all of
# PV(j-1) (v2), the splits measure within run-to-run noise of each other; (96, 32) stays the default.
# Other block_n (80, 96, 112; not measured) end on a 32-key chunk the same way.
DEFAULT_PV_SPLIT = {128: (96, 32), 64: (32, 32)}


def default_pv_split(block_n: int) -> tuple[int, ...]:
    return DEFAULT_PV_SPLIT.get(block_n, (block_n - 32, 32))

THREADS_PER_WARPGROUP = 128
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
# A deeper K/V ring hides more load latency (2 -> 3 stages: 0.85x -> 1.04x cuDNN at the seed shape, bench/LOG.md
# v3). Four fit at D=64, three at D=128, two at D=256.
MAX_STAGES = 4
# The persistent producer's loop state does not fit its 24 registers next to a 4-deep ring (ptxas spills at
# D=64); 3 stages measured the same as 4 at D=64 (v4 A/B).
PERSISTENT_MAX_STAGES = 3
# Skip O's rescale when no row max grew (a warp vote per key block). Worth it where O is large; at D=64 the
# vote seems to cost more than the 32 multiplies it saves (0.895x -> 0.845x cuDNN between runs, bench/LOG.md
# v4), so D=64 rescales unconditionally: (16,1024,32,64) 0.840x -> 0.900x (v6). D=96 (48 multiplies) falls
# with D=64 and D=192 (96) with D=128; those two are not measured.
CONDITIONAL_RESCALE_MIN_HEAD_DIM = 128
QK_OVERWRITES_MIN_HEAD_DIM = 128  # Plan.qk_overwrites
SHORT_TAIL_MAX_BLOCK_N = 192  # Plan.tail_n
PREFETCH_Q_MAX_KEYS = 1024  # Plan.prefetch_next_q
# Persistent CTAs (one per SM, looping over tiles; bench/LOG.md v7) where every tile does the same work: the
# next tile's loads hide under this one's epilogue. Non-causal, same run: seed 0.941x -> 1.019x cuDNN,
# (8,512,32,128) 0.870x -> 1.004x, (16,1024,32,64) 0.927x -> 0.978x, long sequences +1%. Causal tiles differ in
# length: with a static tile order (1,16384,16,128) causal fell 1.088x -> 0.768x; with tiles taken from a
# global counter (v8) it is 1.041x against 1.099x per-tile CTAs in the same run (causal 4k 1.097x vs 1.145x).
# So: on unless a right bound moves with the query (causal, a right window).
# Varlen tiles differ in length whatever the mask, and there the counter wins for causal too (same run,
# scripts/ab.py --matrix varlen, bench/results/ab-20261130T0848Z-varlen-persistent.json): 1.948x -> 2.001x,
# kv8 1.967x -> 2.020x, 16k 2.819x -> 2.909x padded cuDNN; non-causal 2.973x -> 2.974x, 4.576x -> 4.525x.
def persistent_by_default(spec: KernelSpec) -> bool:
    """Whether a spec with persistent=None runs persistent CTAs (the measurements above)."""
    if spec.head_dim > PERSISTENT_MAX_HEAD_DIM or spec.block_n < 128:
        return False
    return spec.varlen or (not spec.causal and spec.window[1] < 0)


# The tile boundary of persistent kernels (KernelSpec.tile_overlap). v12 stored each tile's O under the next tile's
# first QK and measured +1-2% at 4096 and 16384 keys (D=128), the seed unchanged. Re-measured with interleaved
# timing on today's kernel (bench/LOG.md v17, scripts/ab.py, up to six runs): at D=128 the plain boundary is
# faster up to 2048 keys (seed 1.021-1.023x -> 1.044-1.049x, (16,1024,32,128) +0-4%, (2,2048,32,128) +0.5%),
# and the two are within each run's noise at 4096 (+0.4% on average) and 16384 keys (-0.4%). D=64 keeps the
# overlap: (16,1024,32,64) 1.034-1.035x against 1.026-1.027x with the plain boundary.
PLAIN_BOUNDARY_MIN_HEAD_DIM, PLAIN_BOUNDARY_MAX_KEYS = 128, 2048


def alike_tiles(spec: KernelSpec) -> bool:
    """Whether a persistent kernel's tiles all do the same work (fixed lengths, no causal or window bound): where
    the tile boundary can overlap and the next tile's Q can be prefetched."""
    return bool(spec.persistent and not spec.varlen and not spec.causal and spec.window == (-1, -1))


def tile_overlap_by_default(spec: KernelSpec) -> bool:
    """Whether a spec with tile_overlap=None overlaps its tile boundary. Where the plan cannot (tiles not alike)
    the answer is True, which changes nothing and keeps the name plain."""
    if not alike_tiles(spec):
        return True
    return not (spec.head_dim >= PLAIN_BOUNDARY_MIN_HEAD_DIM and spec.keys <= PLAIN_BOUNDARY_MAX_KEYS)


MAX_VECTOR_BYTES = 16  # the widest shared/global access (ld.shared.v4.b32)


@functools.lru_cache(maxsize=1024)
def resolve(spec: KernelSpec) -> KernelSpec:
    """Fill the spec's defaults (block_n, pv_split, stages) and check what depends on them."""
    # A PV split names its key block: (96, 32) asks for block_n 128 whatever the shape's default is.
    block_n = spec.block_n or (sum(spec.pv_split) if spec.pv_split else default_block_n(spec))
    split = spec.pv_split or default_pv_split(block_n)
    if sum(split) != block_n:
        raise SpecError(f"pv_split {split} must add up to block_n {block_n}")
    # A window bound that reaches past every key is no bound: one kernel (and no int overflow) for all of them.
    window = tuple(-1 if w >= spec.seq_len + spec.keys else w for w in spec.window)
    spec = spec.replace(block_n=block_n, pv_split=tuple(split), seq_len_k=spec.keys,
                        kv_heads=spec.kv_heads or spec.heads, window=window)
    if spec.persistent is None:
        spec = spec.replace(persistent=persistent_by_default(spec))
    if spec.tile_overlap is None:
        spec = spec.replace(tile_overlap=tile_overlap_by_default(spec))
    if not spec.stages:
        deepest = PERSISTENT_MAX_STAGES if spec.persistent else MAX_STAGES
        fitting = [n for n in range(2, deepest + 1) if _fits(Plan(spec.replace(stages=n)))]
        spec = spec.replace(stages=max(fitting, default=2))  # if none fits, the shared-memory error says so
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

    @property
    def window_bounds(self) -> tuple[int, int]:
        """(left, right) key offsets from each query's diagonal; -1 is unbounded. Causal sets right = 0,
        whatever the window's right bound (as FlashAttention does)."""
        left, right = self.spec.window
        return left, 0 if self.spec.causal else right

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
        barriers = 1 + 4 * s.stages + (1 if s.persistent else 0)  # Q full, K/V full, K/V empty[, Q empty]
        bar_offset = _align(offset, 8)
        tile_slot_offset = bar_offset + 8 * barriers
        total = tile_slot_offset + (8 if s.persistent else 0) + SMEM_ALIGN_SLACK
        if total > SMEM_LIMIT:
            raise SpecError(f"{s.name} needs {total} bytes of shared memory, over the {SMEM_LIMIT}-byte limit; "
                            "use fewer stages or a smaller block_n")
        if s.persistent and (2 * self.o.smem_bytes > self.k.smem_bytes or self.o.smem_align > self.k.smem_align):
            raise SpecError(f"a persistent kernel stages both consumers' O tiles ({self.o.smem_bytes} bytes each) in "
                            f"a K slot of {self.k.smem_bytes} bytes; use block_n 128")
        for name, (off, nbytes) in placed.items():
            derivation = getattr(self, name)
            assert off % derivation.smem_align == 0 and nbytes % derivation.smem_align == 0, name
        return SmemMap(q_offset=placed["q"][0], q_bytes=placed["q"][1], k_offset=placed["k"][0],
                       k_bytes=placed["k"][1], v_offset=placed["v"][0], v_bytes=placed["v"][1],
                       bar_offset=bar_offset, barriers=barriers, tile_slot_offset=tile_slot_offset, total=total)

    def tiles_m(self, max_seqlen_q: int | None = None) -> int:
        """Query tiles per (head, sequence); a varlen batch passes its longest query sequence."""
        return self.m_blocks if max_seqlen_q is None else -(-max_seqlen_q // self.spec.block_m)

    def grid(self, batch: int, max_seqlen_q: int | None = None, sms: int = 0) -> tuple[int, int, int]:
        """One CTA per query tile, head and sequence; a persistent kernel runs one CTA per SM (`sms`) at most."""
        tiles_m = self.tiles_m(max_seqlen_q)
        if self.spec.persistent:
            if sms < 1:
                raise ValueError("a persistent kernel's grid needs the device's SM count")
            if tiles_m * self.spec.heads * batch >= 2**31 - sms:  # the kernel forms gridDim.x + fetched
                raise SpecError(f"{tiles_m * self.spec.heads * batch} query tiles overflow the persistent kernel's "
                                "32-bit tile counter; pass persistent=False")
            return (min(tiles_m * self.spec.heads * batch, sms), 1, 1)
        return (tiles_m, self.spec.heads, batch)

    @property
    def tile_overlap(self) -> bool:
        """Whether a persistent kernel stores each tile's O under the next tile's first QK (KernelSpec.tile_overlap)."""
        s = self.spec
        return bool(s.tile_overlap and alike_tiles(s))

    # Short tail blocks, measured against short_tail=False in the same runs (bench/LOG.md v13, four runs):
    # (4,4096,32,128) (23 x 176 + 48 keys) 1.769 -> 1.734 ms on average, (1,16384,16,128) 3.419 -> 3.377 ms.
    # Up to block_n 192: at 208 the peeled last step spills at D=64 and D=96 (tests/test_codegen.py compiles
    # every head dim and block_n).
    @property
    def tail_n(self) -> int:
        """The N of the last key block's QK^T where the keys end in a part block (KernelSpec.short_tail): its keys
        rounded up to a 16-key MMA slice. 0 where every block is whole, where lengths vary at run time, under a
        window (the last block a tile visits is then not the keys' end), or with a single key block."""
        s = self.spec
        part = s.keys % s.block_n
        if (not s.short_tail or s.varlen or self.window_bounds != (-1, -1) or part == 0 or s.keys < s.block_n
                or s.block_n > SHORT_TAIL_MAX_BLOCK_N):
            return 0
        return _align(part, MMA_K)

    @property
    def qk_overwrites(self) -> bool:
        """Whether QK^T's first k-slice writes S without reading it (the others accumulate).

        Needed with a short tail block: its QK leaves S's last registers unwritten, and read-modify-write kept
        them live into the next tile's first QK, so ptxas serialized the wgmma pipeline for want of registers
        (C7511). Measured without a tail (bench/LOG.md v13, four runs against v12's kernels in the same call):
        the seed shape 0.0620-0.0627 -> 0.0612-0.0620 ms, (1,16384,16,128) 3.54 -> 3.42 ms and (4,4096,32,128)
        1.82 -> 1.77 ms on average, but (16,1024,32,64) 0.301 -> 0.308 ms; so from D=128 up, and wherever a
        short tail needs it.
        """
        return self.spec.head_dim >= QK_OVERWRITES_MIN_HEAD_DIM or self.tail_n > 0

    @property
    def tail_mask(self) -> bool:
        """Whether some key block holds keys past the end that its QK reads: a varlen sequence's last block may
        always be partial; a short tail block (tail_n) reads up to the next 16-key slice only."""
        s = self.spec
        return s.varlen or s.keys % (MMA_K if self.tail_n else s.block_n) != 0

    # Measured with the tile overlap (bench/LOG.md v14, same call, twice, flashgen ms): without the prefetch
    # (16,1024,32,64) 0.3014 -> 0.3074 and (8,512,32,128) 0.066 -> 0.068 ms, the seed unchanged, but
    # (4,4096,32,128) 1.741 -> 1.706-1.723 and (1,16384,16,128) 3.45-3.47 -> 3.340 ms. Prefetching the next
    # tile's first K/V blocks as well cost the seed 5% (2 blocks) to 33% (all 6): those prefetches share the TMA
    # unit with the loads the consumers wait on.
    @property
    def prefetch_next_q(self) -> bool:
        """Whether the persistent producer prefetches the next tile's Q to L2 during this tile (fixed lengths
        without a window): where tiles are short (up to 1024 keys), the next Q's DRAM latency is a visible share of
        a tile. With either tile boundary (v17, the plain one, two runs each: the seed in f16 1.045-1.046x ->
        1.048-1.049x cuDNN with the prefetch, in bf16 1.044x -> 1.048-1.051x)."""
        return alike_tiles(self.spec) and self.spec.keys <= PREFETCH_Q_MAX_KEYS

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

    def template_context(self, *, probe: bool = False) -> dict:
        s = self.spec
        acc = fragments.wgmma_accumulator_c()
        tail_n = 0 if probe else self.tail_n
        _check_fragments(s.block_n, s.head_dim, tail_n)
        return {
            "summary": f"{s.name}: S={s.seq_len} H={s.heads} D={s.head_dim} {s.dtype} "
                       f"{'causal' if s.causal else 'non-causal'}, block {s.block_m}x{s.block_n}, "
                       f"PV split {'+'.join(map(str, s.pv_split))}, {s.stages} stages",
            "kernel_name": kernel_name(s, probe=probe),
            "probe": probe,
            "ptx_type": s.dtype,
            "seq_len": s.seq_len,
            "seq_len_k": s.block_n if probe else s.keys,  # the probe reads exactly one K/V block
            "group": s.group,
            "window_left": -1 if probe else self.window_bounds[0],
            "window_right": -1 if probe else self.window_bounds[1],
            "softcap": 0.0 if probe else float(s.softcap),
            "softcap_c": f"{0.0 if probe else float(s.softcap)!r}f",
            "heads": s.heads,
            "head_dim": s.head_dim,
            "block_m": s.block_m,
            "block_n": s.block_n,
            "rows_per_consumer": ROWS_PER_CONSUMER,
            "stages": s.stages,
            "pingpong": s.pingpong and not probe,
            "conditional_rescale": s.head_dim >= CONDITIONAL_RESCALE_MIN_HEAD_DIM,
            # Later query tiles see more keys only when a right bound (causal) moves with the query.
            "long_tiles_last": self.window_bounds[1] >= 0 and not probe,
            "elem_bytes": s.elem_bytes,
            "tail_mask": False if probe else self.tail_mask,
            "tail_n": tail_n,
            "prefetch_q": self.prefetch_next_q and not probe,
            # The probe runs one whole block: no tail, the head dim's own QK form.
            "qk_overwrites": s.head_dim >= QK_OVERWRITES_MIN_HEAD_DIM if probe else self.qk_overwrites,
            "tail_chunks": self.chunks_within(tail_n // MMA_K) if tail_n else (),
            "varlen": s.varlen and not probe,
            "persistent": s.persistent and not probe,
            # Only where every tile is alike (fixed lengths, no causal or local window): elsewhere the producer's
            # extra tile state (cu_seqlens, window bounds) spills its 24 registers.
            "tile_overlap": self.tile_overlap and not probe,
            "o_vector_elems": self.o_vector_elems if s.varlen else 0,
            "threads": self.threads,
            "consumer_warps": 2 * THREADS_PER_WARPGROUP // 32,
            "producer_regs": PRODUCER_REGS,
            "consumer_regs": CONSUMER_REGS,
            "smem": self.smem,
            "q_desc": self.q.descriptors(),
            "k_desc": self.k.descriptors(),
            "v_desc": self.v.descriptors(),
            "k_trans": self.k.mma_transpose,
            "v_trans": self.v.mma_transpose,
            "o_offset_c": self.o.formula_c,
            "acc_row_c": acc.row_c,
            "acc_col_c": acc.col_c,
            "row_half_c": acc.row_half_c,
            "row_half_stride": acc.row_half_stride,
            "smem_align": self.smem_align,
            "pv_chunks": self.pv_chunks,
            "pv_chunk_sizes": list(s.pv_split),
            "q_coords": self._origin_c(self.q),
            "k_coords": self._origin_c(self.k, head="head_kv"),
            "v_coords": self._origin_c(self.v, head="head_kv"),
            "o_coords": self._origin_c(self.o),
            "trace": s.trace and not probe,
            "trace_ctas": trace.TRACE_CTAS,
            "trace_words": trace.TRACE_WORDS,
            "trace_warps": trace.TRACE_WARPS,
            "trace_events": trace.EVENTS,
        }

    def _origin_c(self, operand: layouts.OperandDerivation, head: str = "head") -> str:
        """The tensor-map coordinates of a tile starting at sequence row `row0`, as C arguments."""
        names = {n: sympy.Symbol(n) for n in ("row0", head, "tma_batch")}
        seq_len = self.spec.keys if operand.operand in ("k", "v") else self.spec.seq_len
        origin = operand.tensor_map.box_origin(batch_index=names["tma_batch"], seq_start=names["row0"],
                                               head=names[head], seq_len=seq_len)
        return ", ".join(to_c(sympy.sympify(c)) for c in origin)


@functools.lru_cache(maxsize=64)
def _check_fragments(block_n: int, head_dim: int, tail_n: int = 0) -> None:
    """The template indexes S (N = block_n, and tail_n for a short last block) and O (N = head_dim) with the
    N=256 accumulator expressions and packs P straight from S: prove both for these N before rendering. A short
    tail block's QK writes the first tail_n/2 values of S's registers: the prefix check is what makes its
    values sit where the block_n expressions say."""
    for n in (block_n, head_dim) + ((tail_n,) if tail_n else ()):
        fragments.check_accumulator_prefix(n)
    for n in (block_n,) + ((tail_n,) if tail_n else ()):
        fragments.s_slice_is_a_operand(n)


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


def kernel_name(spec: KernelSpec, *, probe: bool = False) -> str:
    return spec.name + ("_probe" if probe else "")


def make_plan(spec: KernelSpec) -> Plan:
    return Plan(resolve(spec))


def _align(x: int, a: int) -> int:
    return -(-x // a) * a

