"""The wide backward family's plan: dQ, dK and dV for head dims whose dK and dV do not fit beside S^T in bwd_sm90.

bwd_sm90 keeps dK and dV as accumulators of M = keys, head_dim / 2 f32 each per thread: 128 + 128 registers at
D=256. Here they are kept transposed, M = the head dim, so a consumer warpgroup owns 128 rows of the head dim of
dK^T and dV^T over all the block's keys (64 + 64 registers over 64 keys). The products (FA3's D=256 shapes in
hopper/flash_bwd_launch_template.h, read and not copied, with 64 keys where FA3 takes 80 so that bwd_sm90's
two-slot ring of Q and dO fits beside them):

* S = Q K^T and dP = dO V^T, M = the block's 64 queries; consumer c takes keys [32c, 32c + 32) as N;
* P and dS (queries x keys) to shared tiles with 32-bit stores of key pairs, both consumers' halves in each tile;
* dV^T += dO^T P and dK^T += Q^T dS: M = consumer c's head-dim rows [128c, 128c + 128) as two m64 tiles, N = the
  64 keys, K = the queries; A (dO, Q) and B (P, dS) both read MN-major from shared memory;
* dQ = dS K: consumer c computes head-dim columns [128c, 128c + 128) over all 64 keys and adds them into the fp32
  accumulator by vector atomics (no staged tile: 64 KB of it would not fit).

The producer, ring, row kernels (_pre, _post), workspaces, launch order and ABI are bwd_sm90's (BackwardPlan).
Every window of a tile the kernel reads is a read_tile, verified, and windows that differ only by their start
address are emitted as one descriptor table plus a byte step (`window_step`, checked here).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property

import layouts
from layouts.operands import TileRead, read_tile, verify_slices

from codegen.spec import SpecError

from ..bwd_sm90.plan import (MBARRIER_ALIGN, SMEM_ALIGN_SLACK, SMEM_LIMIT, WIDE_BLOCK_M_BY_HEAD_DIM, BackwardPlan,
                             _align, _derive)
from ..common import descriptor_address_shift

CONSUMERS = 2
BLOCK_N = 64                    # keys per CTA
KEYS_PER_CONSUMER = BLOCK_N // CONSUMERS  # the N of a consumer's S and dP
HEAD_ROWS_PER_CONSUMER = 128    # the head-dim rows of dK^T and dV^T a consumer owns (two m64 tiles)
WGMMA_M = 64
PRODUCER_REGS, CONSUMER_REGS = 24, 240
HEAD_DIMS = tuple(WIDE_BLOCK_M_BY_HEAD_DIM)
PD_BUFFERS = 2  # P and dS tiles per product: block t writes buffer t % 2 while the other consumer may read t - 1's


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
    p_offset: int     # PD_BUFFERS tiles of P, then PD_BUFFERS of dS
    ds_offset: int
    pd_bytes: int     # one P (or dS) tile: block_m queries x BLOCK_N keys
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
    block_n = BLOCK_N

    def __post_init__(self) -> None:
        super().__post_init__()
        d = self.spec.head_dim
        if d != CONSUMERS * HEAD_ROWS_PER_CONSUMER:
            raise SpecError(f"head_dim {d}: the wide backward splits the head dim as {CONSUMERS} consumers x "
                            f"{HEAD_ROWS_PER_CONSUMER} rows")
        if self.block_m != WGMMA_M:
            raise SpecError(f"block_m {self.block_m}: the wide backward's S has M = {WGMMA_M} queries")

    # ----- the P and dS tiles (queries x keys, the S accumulator's orientation) -----

    @cached_property
    def pd(self) -> layouts.OperandDerivation:
        return _derive("k", self.spec.arch, BLOCK_N, self.block_m, self.spec.dtype)

    # ----- the reads (each verified by read_tile) -----

    @cached_property
    def q_as_a(self) -> TileRead:
        """Q (and dO) as the A of S = Q K^T (dP = dO V^T): M = the 64 queries, K over the head dim."""
        return read_tile(self.q, row_name="n", k_name="k", rows=self.block_m)

    @cached_property
    def kv_as_b(self) -> Windows:
        """K (and V) as the B of S (dP): consumer c's 32 keys as N, K over the head dim."""
        return window_step([read_tile(self.k, row_name="n", k_name="k", rows=KEYS_PER_CONSUMER,
                                      row0=KEYS_PER_CONSUMER * c) for c in range(CONSUMERS)])

    @cached_property
    def q_as_a_mn(self) -> Windows:
        """Q (and dO) transposed as the A of dK^T += Q^T dS (dV^T += dO^T P): M = 64 head-dim rows, K over the
        queries; window w = 2c + j is consumer c's m64 tile j."""
        tiles = HEAD_ROWS_PER_CONSUMER // WGMMA_M
        return window_step([read_tile(self.q, row_name="k", k_name="n", rows=WGMMA_M, row0=WGMMA_M * w)
                            for w in range(CONSUMERS * tiles)])

    @cached_property
    def pd_as_b(self) -> TileRead:
        """P (and dS) as the B of dV^T (dK^T): N = the block's keys, K over the queries (MN-major)."""
        return read_tile(self.pd, row_name="k", k_name="n", rows=BLOCK_N)

    @cached_property
    def ds_as_a(self) -> TileRead:
        """dS as the A of dQ = dS K: M = the 64 queries, K over the block's keys."""
        return read_tile(self.pd, row_name="n", k_name="k", rows=self.block_m)

    @cached_property
    def k_as_b_mn(self) -> Windows:
        """K as the B of dQ: N = consumer c's 128 head-dim columns, K over the block's keys (MN-major)."""
        return window_step([read_tile(self.k, row_name="k", k_name="n", rows=self.dq_cols, row0=self.dq_cols * c)
                            for c in range(CONSUMERS)])

    @property
    def dq_cols(self) -> int:
        """Head-dim columns of dQ per consumer (one wgmma's N)."""
        return self.spec.head_dim // CONSUMERS

    @property
    def head_tiles(self) -> int:
        """m64 tiles of dK^T (and dV^T) per consumer."""
        return HEAD_ROWS_PER_CONSUMER // WGMMA_M

    @cached_property
    def dkv_stage(self) -> layouts.OperandDerivation:
        """dK and dV leave through shared memory as key rows of the forward's O epilogue tile (keys x head dim), in
        the ring's Q and dO slots once both consumers are done: their transposed accumulators store 16-bit values
        there without bank conflicts, and whole rows go out as 16-byte runs."""
        return _derive("o", self.spec.arch, self.spec.head_dim, BLOCK_N, self.spec.dtype)

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
        s = self.spec
        offset, placed = 0, {}
        stats_bytes = self.block_m * 4
        for name, align, nbytes, count in (
                ("k", self.k.smem_align, self.k.smem_bytes, 1), ("v", self.k.smem_align, self.k.smem_bytes, 1),
                ("q", self.q.smem_align, self.q.smem_bytes, s.stages),
                ("do", self.q.smem_align, self.q.smem_bytes, s.stages),
                ("p", self.pd.smem_align, self.pd.smem_bytes, PD_BUFFERS),
                ("ds", self.pd.smem_align, self.pd.smem_bytes, PD_BUFFERS),
                ("lse", 16, stats_bytes, s.stages), ("delta", 16, stats_bytes, s.stages)):  # bulk copies: 16 B
            offset = _align(offset, align)
            placed[name] = offset
            offset += count * nbytes
        bar_offset = _align(offset, MBARRIER_ALIGN)
        total = bar_offset + self.abi.barriers.bytes + SMEM_ALIGN_SLACK
        # dK's and dV's stage tiles reuse the Q and dO slots.
        assert s.stages * self.q.smem_bytes >= self.dkv_stage.smem_bytes, (s.stages, self.dkv_stage.smem_bytes)
        assert placed["q"] % self.dkv_stage.smem_align == 0 and placed["do"] % self.dkv_stage.smem_align == 0
        if total > SMEM_LIMIT:
            raise SpecError(f"{s.name} needs {total} bytes of shared memory, over the {SMEM_LIMIT}-byte limit; the wide "
                            "backward fits 2 stages")
        return WideSmem(placed["k"], placed["v"], self.k.smem_bytes, placed["q"], placed["do"], self.q.smem_bytes,
                        placed["lse"], placed["delta"], stats_bytes, placed["p"], placed["ds"], self.pd.smem_bytes,
                        bar_offset, total)

    @property
    def pd_pair_contiguous(self) -> bool:
        """A thread stores P and dS as pairs of adjacent keys (columns), one 32-bit store each."""
        return self.pd.layout.contiguous_run("k", self.pd.elem_bytes) >= 2

    @cached_property
    def desc_address_shift(self) -> int:
        return descriptor_address_shift((self.q, self.k, self.pd))
