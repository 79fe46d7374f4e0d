// What scripts/stream_probe.cu and stream_probe_heads.cu share: a TMA ring's mbarriers and a spin for simulated work.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CHECK(x)                                                                         \
  do {                                                                                   \
    auto e_ = (x);                                                                       \
    if (e_ != 0) {                                                                       \
      std::printf("%s:%d: %s failed (%d)\n", __FILE__, __LINE__, #x, (int)e_);          \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

__device__ __forceinline__ unsigned smem_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(unsigned bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned phase) {
  asm volatile(
      "{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W;\n}" ::"r"(bar),
      "r"(phase)
      : "memory");
}
__device__ __forceinline__ void spin_ns(int ns) {
  if (ns <= 0) return;
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < (unsigned long long)ns);
}

// Thread 0, then the whole CTA: `stages` full barriers (the producer's one arrival) after them `stages` empty ones
// (`consumers` arrivals each).
__device__ __forceinline__ void init_ring(unsigned long long* bars, int stages, int consumers) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) mbar_init(smem_u32(bars + s), 1), mbar_init(smem_u32(bars + stages + s), consumers);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
}

// The producer's block j: waits until its slot is free, arms the slot's full barrier with `bytes`, returns it.
__device__ __forceinline__ unsigned acquire_slot(unsigned long long* bars, int stages, int j, unsigned bytes) {
  const int s = j % stages;
  if (j >= stages) mbar_wait(smem_u32(bars + stages + s), ((j / stages) & 1) ^ 1);
  const unsigned full = smem_u32(bars + s);
  mbar_expect_tx(full, bytes);
  return full;
}

// A consumer warp of key group `group` of `groups` (four warps each, taking alternate blocks): for each of its blocks
// it waits for the slot, reads a word, spins `work_ns` and frees the slot. Returns the words' sum (keep it live).
__device__ __forceinline__ float consume_blocks(unsigned long long* bars, const unsigned char* smem, int stages,
                                                unsigned slot, int blocks, int groups, int group, int work_ns) {
  const int lane = threadIdx.x % 32;
  float acc = 0.f;
  for (int j = 0; j < blocks; ++j) {
    const int s = j % stages;
    if (j % groups != group) continue;
    mbar_wait(smem_u32(bars + s), (j / stages) & 1);
    acc += ((const float*)(smem + s * slot))[lane];
    spin_ns(work_ns);
    __syncwarp();
    if (lane == 0) mbar_arrive(smem_u32(bars + stages + s));
  }
  return acc;
}

// A 2D TMA box into shared memory at `dst`, completing on the mbarrier `bar` (column x, row y).
__device__ __forceinline__ void tma_2d(unsigned dst, const CUtensorMap* map, unsigned bar, int x, int y) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(
          dst),
      "l"(map), "r"(bar), "r"(x), "r"(y)
      : "memory");
}

// Decode's bshd cache at D=128 (bf16) as the decode kernel's K/V maps see it: (kv_heads x 128) columns of `rows`
// rows, boxes of 64 columns x block_n rows, the 128-byte swizzle.
static CUtensorMap bshd_map_d128(void* base, int kv_heads, long long rows, int block_n, CUtensorMapL2promotion promo) {
  CUtensorMap m;
  cuuint64_t dims[2] = {(cuuint64_t)kv_heads * 128, (cuuint64_t)rows};
  cuuint64_t strides[1] = {(cuuint64_t)kv_heads * 256};
  cuuint32_t box[2] = {64, (cuuint32_t)block_n}, elem[2] = {1, 1};
  CHECK(cuTensorMapEncodeTiled(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base, dims, strides, box, elem,
                               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                               promo, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  return m;
}

// Milliseconds of one launch (`launch()` enqueues it), by CUDA events around it; the launch's errors checked.
template <class Launch>
static float time_launch_ms(Launch&& launch) {
  static cudaEvent_t t0 = nullptr, t1 = nullptr;
  if (!t0) {
    CHECK(cudaEventCreate(&t0));
    CHECK(cudaEventCreate(&t1));
  }
  CHECK(cudaEventRecord(t0));
  launch();
  CHECK(cudaEventRecord(t1));
  CHECK(cudaEventSynchronize(t1));
  CHECK(cudaGetLastError());
  float ms;
  CHECK(cudaEventElapsedTime(&ms, t0, t1));
  return ms;
}
