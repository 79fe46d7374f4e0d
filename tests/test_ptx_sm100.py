"""The Blackwell PTX building blocks (templates/common/ptx_sm100.j2) compile for sm_100a and sm_103a under
NVRTC and become the intended SASS (CPU only: no Blackwell GPU is needed or used)."""

from __future__ import annotations

import pytest

from codegen import sass
from codegen.nvrtc import compile_cuda
from codegen.render import environment
from layouts.tcgen05 import InstrDescriptor, tmem_plan

# A kernel that uses every building block once: alloc, SS and TS MMAs into TMEM, commit, load, store, free.
KERNEL = """
{%- import "common/ptx_sm90.j2" as ptx -%}
{%- import "common/ptx_sm100.j2" as bw -%}
{{ ptx.common() }}
{{ bw.tcgen05() }}
{{ bw.tmem_ld_st_fns(columns) }}
extern "C" __global__ void __launch_bounds__(128, 1) blocks(float* out, u64 a_desc, u64 b_desc) {
  __shared__ __align__(16) u32 slot;
  __shared__ __align__(8) unsigned long long mma_done;
  const u32 warp = threadIdx.x / 32, bar = smem_addr(&mma_done);
  if (threadIdx.x == 0) { mbar_init(bar, 1); fence_barrier_init(); }
  if (warp == 0) { tmem_alloc(smem_addr(&slot), {{ alloc }}); tmem_relinquish(); }
  tcgen05_before_sync();
  __syncthreads();
  tcgen05_after_sync();
  const u32 tmem = slot;
  if (threadIdx.x == 0) {
    tcgen05_mma_ss(tmem + {{ s_column }}, a_desc, b_desc, {{ qk_idesc }}u, 0);
    tcgen05_mma_ts(tmem + {{ o_column }}, tmem + {{ s_column }}, b_desc, {{ pv_idesc }}u, 1);
    tcgen05_commit(bar);
  }
  mbar_wait(bar, 0);
  tcgen05_after_sync();
  u32 r[{{ columns }}];
  const u32 taddr = tmem + ((warp * 32) << 16);
  tmem_ld_32x32b_x{{ columns }}(taddr, r);
  tmem_wait_ld();
  tmem_st_32x32b_x{{ columns }}(taddr + {{ columns }}, r);
  tmem_wait_st();
  for (int i = 0; i < {{ columns }}; ++i) out[threadIdx.x * {{ columns }} + i] = __uint_as_float(r[i]);
  tcgen05_before_sync();
  __syncthreads();
  if (warp == 0) tmem_dealloc(tmem, {{ alloc }});
}
"""


@pytest.mark.parametrize("arch", ("sm_100a", "sm_103a"))
@pytest.mark.parametrize("dtype", ("f16", "bf16"))
def test_building_blocks_compile_to_tcgen05_sass(arch, dtype):
    plan = tmem_plan(128, 128, dtype)
    s_region, _, o_region = plan.regions
    source = environment().from_string(KERNEL).render(
        columns=32, alloc=plan.alloc_columns, s_column=s_region.first_column, o_column=o_region.first_column,
        qk_idesc=InstrDescriptor(m=128, n=128, ab_type=dtype).encode(),
        pv_idesc=InstrDescriptor(m=128, n=128, ab_type=dtype, b_major="MN").encode())
    built = compile_cuda(source, arch=arch, name=f"blocks_{arch}_{dtype}.cu", use_cache=False)
    ops = sass.opcode_counts(sass.disassemble(built.cubin))
    assert ops["UTCHMMA"] == 2, "both tcgen05.mma forms (SS and TS) must become UTCHMMA"
    assert ops["LDTM"] >= 1 and ops["STTM"] >= 1, "TMEM load and store missing"
    assert ops["HMMA"] == 0 and ops["HGMMA"] == 0, "a Hopper or older MMA path crept in"
    assert built.spill_stores.get("blocks", 0) == 0
