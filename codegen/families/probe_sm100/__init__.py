"""The basis-vector probe for Blackwell (sm_100a, sm_103a), the first Blackwell kernel: the seed's operand
path alone. One CTA (four warps) per injection TMA-loads a 128-row Q tile and one K/V block with the derived
sm_100a/sm_103a tensor maps (V by the seed's 5-D key-group map), computes S = Q K^T by tcgen05.mma (SS) into
tensor memory, writes S as tcgen05.ld reads it, writes the given P over S in TMEM as packed 16-bit pairs, runs
O = P V in TS form (A = P from TMEM, B = V MN-major by descriptor) and writes O. codegen/probe.py locates each
injected unit element in S and O, exactly as on Hopper.

It has not run on a GPU here (no Blackwell is lent); CI compiles it for both architectures and checks the SASS.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from layouts import tcgen05

from codegen.abi import MBARRIER_BYTES, Barrier, BarrierMap, Grid, KernelABI
from codegen.spec import MMA_K, KernelSpec, SpecError

from .. import Family, fwd_sm100
from ..common import PROBE_PARAMS, descriptor_address_shift
from ..fwd_sm90.abi import ALL_PARAMS as FWD_PARAMS

BLACKWELL_ARCHS = ("sm_100a", "sm_103a")
TILE_M = 128  # one tcgen05.mma M = 128 tile per CTA (cta_group::1), rows = TMEM lanes
THREADS = 128  # four warps, one per TMEM lane quarter
TMEM_CHUNK = 32  # columns per tcgen05.ld/st (.32x32b.x32)

_PARAMS = tuple(p for p in FWD_PARAMS if p.name.startswith("tmap_")) + PROBE_PARAMS


def resolve(spec: KernelSpec) -> KernelSpec:
    if spec.arch not in BLACKWELL_ARCHS:
        raise SpecError(f"the Blackwell probe is for {BLACKWELL_ARCHS}, not {spec.arch}")
    block_n = spec.block_n or fwd_sm100.DEFAULT_BLOCK_N[spec.head_dim]
    if block_n % TMEM_CHUNK or block_n > 256:
        raise SpecError(f"the Blackwell probe reads S in {TMEM_CHUNK}-column chunks: block_n {block_n} must be a "
                        f"multiple of {TMEM_CHUNK} up to 256")
    return spec.replace(block_n=block_n, pv_split=(block_n,), stages=2, persistent=False, tile_overlap=None,
                        causal=False, window=(-1, -1), softcap=0.0, varlen=False, trace=False)


@dataclass(frozen=True)
class ProbePlan(fwd_sm100.Plan):
    """The forward kernel's derivations and shared-memory map (one K/V slot used), with the probe's own
    parameters, barriers, threads and a single S buffer in TMEM."""

    threads = THREADS

    @cached_property
    def abi(self) -> KernelABI:
        barriers = (Barrier("Loaded", 1, 1, "Q, K and V have landed"),
                    Barrier("SDone", 1, 1, "S = Q K^T is in TMEM (tcgen05.commit)"),
                    Barrier("ODone", 1, 1, "O = P V is in TMEM (tcgen05.commit)"))
        return KernelABI(_PARAMS, BarrierMap(barriers), Grid(persistent=False, heads=1))

    @cached_property
    def tmem(self) -> tcgen05.TmemPlan:
        return tcgen05.tmem_plan(self.spec.block_n, self.spec.head_dim, self.spec.dtype, buffers=1)

    @cached_property
    def qk_idesc(self) -> tcgen05.InstrDescriptor:
        return tcgen05.InstrDescriptor(m=TILE_M, n=self.spec.block_n, ab_type=self.spec.dtype,
                                       a_major=self.q.mma_major, b_major=self.k.mma_major)

    @cached_property
    def pv_idesc(self) -> tcgen05.InstrDescriptor:
        # A = P from TMEM, K-major by definition; B = V as derived (MN-major, the seed's layout).
        return tcgen05.InstrDescriptor(m=TILE_M, n=self.spec.head_dim, ab_type=self.spec.dtype, a_major="K",
                                       b_major=self.v.mma_major)

    def grid(self, batch: int, max_seqlen_q=None, sms: int = 0) -> tuple[int, int, int]:
        return self.abi.grid.dims(tiles_m=1, batch=batch)


def context(plan: ProbePlan) -> dict:
    from ..fwd_sm90 import tma_tiles

    s = plan.spec
    (s_region, o_region), tm = plan.tmem.regions, plan.tmem
    return {
        "summary": f"{s.name}_probe: D={s.head_dim} {s.dtype}, a {TILE_M}-row Q tile and a {s.block_n}-key block",
        "kernel_name": s.name + "_probe",
        "arch": s.arch,
        "ptx_type": s.dtype,
        "block_m": TILE_M,
        "block_n": s.block_n,
        "head_dim": s.head_dim,
        "threads": THREADS,
        "smem": plan.smem,
        "smem_align": plan.smem_align,
        "abi": plan.abi,
        "mbarrier_bytes": MBARRIER_BYTES,
        "q_bytes": plan.q.smem_bytes, "k_bytes": plan.k.smem_bytes, "v_bytes": plan.v.smem_bytes,
        "q_desc": plan.q.descriptors(), "k_desc": plan.k.descriptors(), "v_desc": plan.v.descriptors(),
        "qk_idesc": plan.qk_idesc, "pv_idesc": plan.pv_idesc,
        "tmem_alloc": tm.alloc_columns,
        "s_column": s_region.first_column,
        "p_column": tm.p_columns(0).first_column,
        "o_column": o_region.first_column,
        "tmem_chunk": TMEM_CHUNK,
        "packed_per_slice": MMA_K * s.elem_bytes // 4,  # TMEM columns of P per 16-key slice
        "desc_address_shift": descriptor_address_shift((plan.q, plan.k, plan.v)),
        "tma_ranks": sorted({op.tensor_map.rank for op in (plan.q, plan.k, plan.v)}),
        "tma_tiles": tma_tiles(plan, {"q": ("load",), "k": ("load",), "v": ("load",)}),
    }


FAMILY = Family(name="probe_sm100", template="probe_sm100/kernel.cu.j2", resolve=resolve, make_plan=ProbePlan,
                context=context, kernel_name=lambda spec: spec.name + "_probe")
