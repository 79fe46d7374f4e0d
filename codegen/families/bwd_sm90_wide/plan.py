"""The wide backward family's plan: dQ, dK and dV for head dims whose dK and dV do not fit beside S^T in bwd_sm90.

bwd_sm90 keeps dK and dV as accumulators of M = keys, head_dim / 2 f32 each per thread: 128 + 128 registers at
D=256. Here they are kept transposed, M = the head dim, so a consumer warpgroup owns 128 rows of the head dim of
dK^T and dV^T over all the block's 80 keys (80 + 80 registers). The products (FA3's D=256 shapes in
hopper/flash_bwd_launch_template.h, read and not copied):

* S = Q K^T and dP = dO V^T, M = the block's 64 queries; consumer c takes keys [40c, 40c + 40) as N;
* P^T and dS^T (keys x queries) to shared tiles, both consumers' keys in each;
* dV^T += dO^T P and dK^T += Q^T dS: M = consumer c's head-dim rows [128c, 128c + 128) as two m64 tiles, N = the
  80 keys, K = the queries; A (dO, Q) read MN-major, B (P^T, dS^T) K-major;
* dQ = dS K: consumer c computes head-dim columns [128c, 128c + 128), in two chunks of 64, over all 80 keys, and
  adds them into the fp32 accumulator by vector atomics (no staged tile: 64 KB of it would not fit).

At D=192 (FA3's shape there too) three consumers own 64 head-dim rows each over 96 keys, 32 of them per consumer's
S and dP, at 160 registers: `SHAPES` holds both.

Why 80 keys and not 64: dQ's atomics and the Q and dO loads are per key block, and at 64 keys they held the kernel
at the L2's limit (bench/LOG.md, b10: 0.80x cuDNN, 35% of the time in the atomics). 80 keys leave room for one dO
slot beside two of Q, so dO has a ring of its own (abi.py).

The row kernels (_pre, _post), workspaces, launch order and parameters are bwd_sm90's (BackwardPlan). Every window
of a tile the kernel reads is a read_tile, verified, and windows that differ only by their start address are
emitted as one descriptor table plus a byte step (`window_step`, checked here).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from functools import cached_property

import layouts
from layouts.operands import TileRead, read_tile, verify_slices

from codegen.spec import SpecError

from ..bwd_sm90.plan import (THREADS_PER_WARPGROUP, WARPS_PER_WARPGROUP, BackwardPlan, BackwardSpec, _derive,
                             resolve_for)
from ..common import descriptor_address_shift
from .abi import kernel_abi

# Per head dim: (consumer warpgroups, keys per CTA). Each consumer owns head_dim / consumers rows of dK^T and dV^T
# (m64 tiles) and keys / consumers keys of S and dP. D=256: FA3's 2 x 80 (LOG b10: 64 keys held the kernel at the
# L2's limit).
SHAPES = {256: (2, 80), 192: (3, 96)}  # 192: FA3's 3 x 96 (hopper/flash_bwd_launch_template.h), 160 registers
CONSUMER_REGS = {2: 240, 3: 160}  # setmaxnreg per consumer count: (64K - 128 x 24) / consumer threads, rounded to 8
WGMMA_M = 64
PRODUCER_REGS = 24
HEAD_DIMS = tuple(SHAPES)
PD_BUFFERS = 2  # P^T and dS^T tiles each: block t writes buffer t % 2 while the other consumer may read t - 1's
DO_STAGES = 1   # dO's own ring (abi.py)
DQ_CHUNK_COLS = 64  # dQ's wgmma N: a consumer's 128 columns in two chunks, 32 registers each


@dataclass(frozen=True)
class WideSmem:
    k_offset: int
    v_offset: int
    kv_bytes: int
    q_offset: int
    do_offset: int
    row_bytes: int
    lse_offset: int
    delta_offset: int
    stats_bytes: int
    p_offset: int     # PD_BUFFERS tiles of P^T, then PD_BUFFERS of dS^T
    ds_offset: int
    pd_bytes: int     # one P^T (or dS^T) tile: block_n keys x block_m queries
    bar_offset: int
    total: int


@dataclass(frozen=True)
class Windows:
    """Reads of one tile that differ only in where they start: window w's descriptors are window 0's with the start
    address `step` bytes further per w (checked by window_step)."""
    reads: tuple
    step: int

    @property
    def first(self) -> TileRead:
        return self.reads[0]


def window_step(reads) -> Windows:
    """The byte step between consecutive windows of `reads`: window 0's descriptors moved by w x step are proved, by
    the MMA model over the whole footprint, to read window w (fields the footprint never uses may differ from
    what read_tile would pick, such as LBO where a window is one swizzle atom wide)."""
    first = reads[0].descriptor_objects()
    step = (reads[1].descriptor_objects()[0].start_address - first[0].start_address) if len(reads) > 1 else 0
    for w, read in enumerate(reads):
        moved = [dataclasses.replace(d, start_address=d.start_address + w * step) for d in first]
        mismatches = verify_slices(read.tile, moved, major=read.major, row_name=read.row_name, k_name=read.k_name,
                                   rows=read.rows, row0=read.row0, slices=read.slices)
        if read.major != reads[0].major or mismatches:
            raise layouts.LayoutError(f"window {w} of the {read.tile.operand} tile is not window 0 moved by {w} x "
                                      f"{step} bytes: {mismatches[:1]}")
    return Windows(tuple(reads), step)


@dataclass(frozen=True)
class WidePlan(BackwardPlan):
    def __post_init__(self) -> None:
        super().__post_init__()
        d = self.spec.head_dim
        if d not in SHAPES:
            raise SpecError(f"head_dim {d}: the wide backward is shaped for {HEAD_DIMS}")
        if self.head_rows % WGMMA_M or self.block_n % self.consumers or self.dq_cols % DQ_CHUNK_COLS:
            raise SpecError(f"head_dim {d}: {self.consumers} consumers do not split it into whole m64 tiles, its "
                            f"{self.block_n} keys evenly and dQ into {DQ_CHUNK_COLS}-column chunks")
        if self.block_m != WGMMA_M:
            raise SpecError(f"block_m {self.block_m}: the wide backward's S has M = {WGMMA_M} queries")

    # ----- the shape (SHAPES) -----

    @property
    def consumers(self) -> int:
        return SHAPES[self.spec.head_dim][0]

    @property
    def block_n(self) -> int:
        return SHAPES[self.spec.head_dim][1]

    @property
    def keys_per_consumer(self) -> int:
        """The N of a consumer's S and dP."""
        return self.block_n // self.consumers

    @property
    def head_rows(self) -> int:
        """The head-dim rows of dK^T and dV^T a consumer owns."""
        return self.spec.head_dim // self.consumers

    @property
    def threads(self) -> int:
        return (1 + self.consumers) * THREADS_PER_WARPGROUP

    @property
    def consumer_regs(self) -> int:
        return CONSUMER_REGS[self.consumers]

    # ----- the P^T and dS^T tiles (keys x queries: the K-major B of dV^T and dK^T) -----

    @cached_property
    def pd(self) -> layouts.OperandDerivation:
        return _derive("k", self.spec.arch, self.block_m, self.block_n, self.spec.dtype)

    @cached_property
    def abi(self):
        return kernel_abi(stages=self.spec.stages, consumer_warps=self.consumers * WARPS_PER_WARPGROUP,
                          kv_heads=self.spec.kv_heads,
                          n_blocks=self.n_blocks)

    # ----- the reads (each verified by read_tile) -----

    @cached_property
    def q_as_a(self) -> TileRead:
        """Q (and dO) as the A of S = Q K^T (dP = dO V^T): M = the 64 queries, K over the head dim."""
        return read_tile(self.q, row_name="n", k_name="k", rows=self.block_m)

    @cached_property
    def kv_as_b(self) -> Windows:
        """K (and V) as the B of S (dP): consumer c's keys as N, K over the head dim."""
        keys = self.keys_per_consumer
        return window_step([read_tile(self.k, row_name="n", k_name="k", rows=keys, row0=keys * c)
                            for c in range(self.consumers)])

    @cached_property
    def q_as_a_mn(self) -> Windows:
        """Q (and dO) transposed as the A of dK^T += Q^T dS (dV^T += dO^T P): M = 64 head-dim rows, K over the
        queries; window w = c * head_tiles + j is consumer c's m64 tile j."""
        return window_step([read_tile(self.q, row_name="k", k_name="n", rows=WGMMA_M, row0=WGMMA_M * w)
                            for w in range(self.spec.head_dim // WGMMA_M)])

    @cached_property
    def pd_as_b(self) -> TileRead:
        """P^T (and dS^T) as the B of dV^T (dK^T): N = the block's keys, K over the queries (K-major)."""
        return read_tile(self.pd, row_name="n", k_name="k", rows=self.block_n)

    @cached_property
    def ds_as_a(self) -> TileRead:
        """dS^T as the A of dQ = dS K: M = the 64 queries (MN-major), K over the block's keys."""
        return read_tile(self.pd, row_name="k", k_name="n", rows=self.block_m)

    @cached_property
    def k_as_b_mn(self) -> Windows:
        """K as the B of dQ: N = a 64-column chunk of the head dim, K over the block's keys (MN-major); window
        w = c * dq_chunks + h is consumer c's chunk h."""
        return window_step([read_tile(self.k, row_name="k", k_name="n", rows=DQ_CHUNK_COLS, row0=DQ_CHUNK_COLS * w)
                            for w in range(self.spec.head_dim // DQ_CHUNK_COLS)])

    @property
    def dq_cols(self) -> int:
        """Head-dim columns of dQ per consumer."""
        return self.spec.head_dim // self.consumers

    @property
    def dq_chunks(self) -> int:
        """dQ's wgmmas per consumer (DQ_CHUNK_COLS columns each)."""
        return self.dq_cols // DQ_CHUNK_COLS

    @property
    def head_tiles(self) -> int:
        """m64 tiles of dK^T (and dV^T) per consumer."""
        return self.head_rows // WGMMA_M

    @cached_property
    def dkv_stage(self) -> layouts.OperandDerivation:
        """dK and dV leave through shared memory as key rows of the forward's O epilogue tile (keys x head dim), in
        the K and V tiles once both consumers are done: their transposed accumulators store 16-bit values there
        without bank conflicts, and whole rows go out as 16-byte runs."""
        return _derive("o", self.spec.arch, self.spec.head_dim, self.block_n, self.spec.dtype)

    @property
    def dkv_run(self) -> int:
        """Head-dim columns the epilogue copies at once: the stage tile's contiguous run (16 bytes)."""
        return self.dkv_stage.layout.contiguous_run("n", self.dkv_stage.elem_bytes)

    # ----- shared memory -----

    @property
    def smem_align(self) -> int:
        return max(op.smem_align for op in (self.q, self.k, self.pd, self.dkv_stage))

    @cached_property
    def smem(self) -> WideSmem:
        placed, bar_offset, total = self.place_tiles((
            ("do", self.q.smem_align, self.q.smem_bytes, DO_STAGES),
            ("p", self.pd.smem_align, self.pd.smem_bytes, PD_BUFFERS),
            ("ds", self.pd.smem_align, self.pd.smem_bytes, PD_BUFFERS)), "the wide backward fits 2 stages")
        # dK's and dV's stage tiles reuse the K and V tiles.
        assert self.k.smem_bytes >= self.dkv_stage.smem_bytes, (self.k.smem_bytes, self.dkv_stage.smem_bytes)
        assert placed["k"] % self.dkv_stage.smem_align == 0 and placed["v"] % self.dkv_stage.smem_align == 0
        return WideSmem(placed["k"], placed["v"], self.k.smem_bytes, placed["q"], placed["do"], self.q.smem_bytes,
                        placed["lse"], placed["delta"], self.block_m * 4, placed["p"], placed["ds"], self.pd.smem_bytes,
                        bar_offset, total)

    @cached_property
    def desc_address_shift(self) -> int:
        return descriptor_address_shift((self.q, self.k, self.pd))


@functools.lru_cache(maxsize=256)
def resolve(spec: BackwardSpec) -> BackwardSpec:
    return resolve_for(spec, WidePlan)


def make_plan(spec: BackwardSpec) -> WidePlan:
    return WidePlan(resolve(spec))
