#!/usr/bin/env python3
"""The seed kernel's per-block softmax alone, in cycles per 176-key block per warp (GPU machine).

    python3 scripts/softmax_micro.py

One CTA per SM, 1 or 2 warps per SM sub-partition (as the kernel's two consumers put one warp each on every
sub-partition), each running the softmax of a 64 x 176 block (88 values a thread, the kernel's fragment) 200
times on register values, timed with clock64. Parts are switched on and off (the row max, the exponentials
and row sums, O's rescale, P's packing) to see what each costs and which unit holds it; SASS opcode counts show
what was compiled. bench/LOG.md v18b reads the numbers: the exponentials are MUFU-throughput bound
(8 cycles per warp instruction, 704 cycles a block), the max is a ~280-cycle dependent chain before them.
The kernel's code is in templates/fwd_sm90/softmax.j2 (softmax_block); this copy is only for timing.
"""
import pathlib
import sys

# The checkout's root on the path (bench/, scripts/, and codegen/ where it is not installed): no PYTHONPATH=.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import torch
from codegen.nvrtc import compile_cuda
from codegen.sass import disassemble, opcode_counts
from codegen import driver

N = 176  # block_n
COLS = N // 2
SRC = r'''
typedef unsigned u32;
__device__ __forceinline__ float ex2(float x){ float y; asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
__device__ __forceinline__ u32 pack2(float lo, float hi){ u32 r; asm("cvt.rn.f16x2.f32 %0, %2, %1;" : "=r"(r) : "f"(lo), "f"(hi)); return r; }
__device__ __forceinline__ int rh(int i){ return (i / 2) % 2; }
extern "C" __global__ void __launch_bounds__(256, 1) k(const float* in, u32* out, long long* cyc, int iters, float scale_log2) {
  float sc[COLS];
  for (int i = 0; i < COLS; ++i) sc[i] = in[(threadIdx.x * COLS + i) % 4096];
  float row_max[2] = {-1e30f, -1e30f}, row_sum[2] = {0.f, 0.f}, o[64];
  for (int i = 0; i < 64; ++i) o[i] = in[i];
  u32 acc = 0; u32 p[COLS / 2];
  long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int i = 0; i < COLS; ++i) asm volatile("" : "+f"(sc[i]));
    float alpha[2];
#if DO_MAX
    float new_max[2] = {row_max[0], row_max[1]};
#if MAX_CHAINS == 1
#pragma unroll
    for (int i = 0; i < COLS; ++i) new_max[rh(i)] = fmaxf(new_max[rh(i)], sc[i]);
#else
    float m[2][MAX_CHAINS];
#pragma unroll
    for (int c = 0; c < MAX_CHAINS; ++c) m[0][c] = m[1][c] = row_max[0];
#pragma unroll
    for (int i = 0; i < COLS; ++i) m[rh(i)][(i / 4) % MAX_CHAINS] = fmaxf(m[rh(i)][(i / 4) % MAX_CHAINS], sc[i]);
#pragma unroll
    for (int h = 0; h < 2; ++h) for (int c = 0; c < MAX_CHAINS; ++c) new_max[h] = fmaxf(new_max[h], m[h][c]);
#endif
    float sm[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      new_max[h] = fmaxf(new_max[h], __shfl_xor_sync(0xffffffffu, new_max[h], 1));
      new_max[h] = fmaxf(new_max[h], __shfl_xor_sync(0xffffffffu, new_max[h], 2));
      sm[h] = new_max[h] * scale_log2;
      alpha[h] = ex2(row_max[h] * scale_log2 - sm[h]);
      row_max[h] = new_max[h]; row_sum[h] *= alpha[h];
    }
#else
    float sm[2] = {row_max[0], row_max[1]}; alpha[0] = alpha[1] = scale_log2;
#endif
#if DO_EXP == 1
#pragma unroll
    for (int i = 0; i < COLS; ++i) { sc[i] = ex2(sc[i] * scale_log2 - sm[rh(i)]); row_sum[rh(i)] += sc[i]; }
#elif DO_EXP == 2
#pragma unroll
    for (int i = 0; i < COLS; ++i) sc[i] = ex2(sc[i] * scale_log2 - sm[rh(i)]);
#endif
#if DO_RESCALE
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] *= alpha[rh(i)];
#pragma unroll
    for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(o[i]));
#endif
#if DO_PACK
#pragma unroll
    for (int r = 0; r < COLS / 2; ++r) p[r] = pack2(sc[2 * r], sc[2 * r + 1]);
#pragma unroll
    for (int r = 0; r < COLS / 2; ++r) asm volatile("" : "+r"(p[r]));
#endif
  }
  long long t1 = clock64();
#if DO_PACK
  for (int r = 0; r < COLS / 2; ++r) acc ^= p[r];
#endif
  for (int i = 0; i < COLS; ++i) acc ^= __float_as_uint(sc[i]);
  for (int i = 0; i < 64; ++i) acc ^= __float_as_uint(o[i]);
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc ^ __float_as_uint(row_sum[0] + row_sum[1]);
  if (threadIdx.x % 32 == 0) cyc[blockIdx.x * 16 + threadIdx.x / 32] = t1 - t0;
}
'''
VARIANTS = {
    "full (max+exp+rescale+pack)": dict(DO_MAX=1, DO_EXP=1, DO_RESCALE=1, DO_PACK=1, MAX_CHAINS=1),
    "max only": dict(DO_MAX=1, DO_EXP=0, DO_RESCALE=0, DO_PACK=0, MAX_CHAINS=1),
    "max, 4 chains": dict(DO_MAX=1, DO_EXP=0, DO_RESCALE=0, DO_PACK=0, MAX_CHAINS=4),
    "exp+sum only": dict(DO_MAX=0, DO_EXP=1, DO_RESCALE=0, DO_PACK=0, MAX_CHAINS=1),
    "rescale only": dict(DO_MAX=0, DO_EXP=0, DO_RESCALE=1, DO_PACK=0, MAX_CHAINS=1),
    "max+exp (softmax)": dict(DO_MAX=1, DO_EXP=1, DO_RESCALE=0, DO_PACK=0, MAX_CHAINS=1),
    "max+exp+pack": dict(DO_MAX=1, DO_EXP=1, DO_RESCALE=0, DO_PACK=1, MAX_CHAINS=1),
    "exp only, no sum": dict(DO_MAX=0, DO_EXP=2, DO_RESCALE=0, DO_PACK=0, MAX_CHAINS=1),
    "full, max 4 chains": dict(DO_MAX=1, DO_EXP=1, DO_RESCALE=1, DO_PACK=1, MAX_CHAINS=4),
}

def main():
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    inp = torch.randn(4096, device=dev)
    iters = 200
    for name, defs in VARIANTS.items():
        src = "".join(f"#define {k} {v}\n" for k, v in defs.items()) + f"#define COLS {COLS}\n" + SRC
        r = compile_cuda(src, arch="sm_90a", name="micro.cu", use_cache=False)
        ops = opcode_counts(disassemble(r.cubin))
        kernel = driver.load(r.cubin, "k", 0, dev.index or 0)
        cycles = []
        for warps_per_smsp in (1, 2):  # one CTA per SM: 4 or 8 warps, one or two on each sub-partition
            threads = 128 * warps_per_smsp
            out = torch.empty(sms * threads, dtype=torch.int32, device=dev)
            cyc = torch.zeros(sms * 16, dtype=torch.int64, device=dev)
            args = driver.pack_args([inp.data_ptr(), out.data_ptr(), cyc.data_ptr(), driver.I32(iters), 0.0883883])
            for _ in range(2):  # the second launch is the one read
                driver.launch(kernel, (sms, 1, 1), threads, torch.cuda.current_stream().cuda_stream, args)
            torch.cuda.synchronize()
            cycles.append(cyc.view(sms, 16)[:, : threads // 32].float().mean().item() / iters)
        counts = {k: ops.get(k, 0) for k in ("MUFU", "FMNMX", "FFMA", "FADD", "FMUL", "F2FP", "SHFL")}
        print(f"{name:30s} regs {r.registers}  cycles/block/warp: 1 warp/SMSP {cycles[0]:7.0f}  "
              f"2 warps {cycles[1]:7.0f}  {counts}", flush=True)


if __name__ == "__main__":
    main()
