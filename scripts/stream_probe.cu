// What streaming a decode KV cache can reach on this GPU, by load path and residency (bench/LOG.md, "Decode").
//
//   nvcc -O3 -arch=sm_90a -std=c++17 -o /tmp/stream_probe scripts/stream_probe.cu -lcuda && /tmp/stream_probe
//
// The cache is decode's bshd layout: K and V each (B * S rows) x (H_kv * 128) bf16, one CTA per (K/V head,
// sequence) reading its head's 256 bytes of each of the sequence's S rows, block_n rows per ring slot. The
// consumer does no attention: it waits for a slot, reads a word of it, optionally spins `work_ns`, and frees
// it. So each configuration's rate is the load path's own ceiling (TMA tensor boxes as the decode kernel
// loads them, or cp.async of 16 bytes per thread as an sm80-style kernel does), with one or two CTAs per SM.
#include <algorithm>
#include <vector>

#include "stream_ring.cuh"

constexpr int kHeadDim = 128, kRowBytes = kHeadDim * 2;

struct Args {
  int seq, block_n, stages, work_ns, consumer_warps;
  float* sink;
};

// TMA: warp 0's lane 0 loads K and V of each block (two 64-column boxes each, the 128-byte swizzle) into a slot;
// the other warps wait on it, read a word, and free it.
__global__ void tma_stream(const __grid_constant__ CUtensorMap mk, const __grid_constant__ CUtensorMap mv, Args a) {
  extern __shared__ __align__(1024) unsigned char raw[];
  unsigned char* smem = (unsigned char*)(((size_t)raw + 1023) & ~(size_t)1023);
  unsigned long long* bars = (unsigned long long*)(smem + a.stages * a.block_n * kRowBytes * 2);
  const int head = blockIdx.x, batch = blockIdx.y, blocks = a.seq / a.block_n;
  const unsigned slot_bytes = a.block_n * kRowBytes * 2;
  init_ring(bars, a.stages, a.consumer_warps);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp == 0) {
    if (lane != 0) return;
    for (int j = 0; j < blocks; ++j) {
      const unsigned full = acquire_slot(bars, a.stages, j, slot_bytes), dst = smem_u32(smem + j % a.stages * slot_bytes);
      const int y = batch * a.seq + j * a.block_n;
      for (int c = 0; c < 2; ++c) tma_2d(dst + c * a.block_n * 128, &mk, full, head * kHeadDim + c * 64, y);
      for (int c = 0; c < 2; ++c)
        tma_2d(dst + slot_bytes / 2 + c * a.block_n * 128, &mv, full, head * kHeadDim + c * 64, y);
    }
    return;
  }
  float acc = 0.f;
  for (int j = 0; j < blocks; ++j) {  // every consumer warp reads every block
    const int s = j % a.stages;
    mbar_wait(smem_u32(bars + s), (j / a.stages) & 1);
    acc += ((const float*)(smem + s * slot_bytes))[lane];
    spin_ns(a.work_ns);
    __syncwarp();
    if (lane == 0) mbar_arrive(smem_u32(bars + a.stages + s));
  }
  if (acc == 12345.f) a.sink[0] = acc;
}

// cp.async: every thread copies 16-byte pieces of a block's K and V rows into the slot, `stages` groups in
// flight; the whole CTA consumes.
__global__ void cpasync_stream(const unsigned char* k, const unsigned char* v, int row_stride, Args a) {
  extern __shared__ __align__(1024) unsigned char raw[];
  unsigned char* smem = (unsigned char*)(((size_t)raw + 1023) & ~(size_t)1023);
  const int head = blockIdx.x, batch = blockIdx.y, blocks = a.seq / a.block_n;
  const unsigned slot_bytes = a.block_n * kRowBytes * 2;
  const int pieces = a.block_n * kRowBytes / 16;  // of K (as many of V)
  auto issue = [&](int j) {
    if (j < blocks) {
      const unsigned dst = smem_u32(smem + (j % a.stages) * slot_bytes);
      const size_t row0 = (size_t)batch * a.seq + (size_t)j * a.block_n;
      for (int e = threadIdx.x; e < pieces; e += blockDim.x) {
        const int r = e / (kRowBytes / 16), c = e % (kRowBytes / 16);
        const size_t at = (row0 + r) * row_stride + head * kRowBytes + c * 16;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst + e * 16), "l"(k + at) : "memory");
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst + slot_bytes / 2 + e * 16), "l"(v + at)
                     : "memory");
      }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  };
  for (int j = 0; j < a.stages - 1; ++j) issue(j);
  float acc = 0.f;
  for (int j = 0; j < blocks; ++j) {
    issue(j + a.stages - 1);
    asm volatile("cp.async.wait_group 2;" ::: "memory");  // stages - 1 groups in flight: run with stages = 3
    __syncthreads();
    acc += ((const float*)(smem + (j % a.stages) * slot_bytes))[threadIdx.x % 32];
    spin_ns(a.work_ns);
    __syncthreads();
  }
  if (acc == 12345.f) a.sink[0] = acc;
}

int main() {
  const int batch = 32, seq = 8192, kv_heads = 8;
  const long long rows = (long long)batch * seq, bytes = rows * kv_heads * kRowBytes;
  unsigned char *k, *v;
  float* sink;
  CHECK(cudaMalloc(&k, bytes));
  CHECK(cudaMalloc(&v, bytes));
  CHECK(cudaMalloc(&sink, 4));
  CHECK(cudaMemset(k, 0, bytes));
  CHECK(cudaMemset(v, 0, bytes));
  unsigned char* flush;  // evicts the caches from L2 between runs
  CHECK(cudaMalloc(&flush, 256 << 20));
  int sms;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CHECK(cudaFuncSetAttribute(tma_stream, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
  CHECK(cudaFuncSetAttribute(cpasync_stream, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
  std::printf("K+V %.2f GB, grid %d x %d, %d SMs\n", 2.0 * bytes / 1e9, kv_heads, batch, sms);
  // promo: the tensor maps' L2 promotion (0 none, else 64, 128 or 256 bytes; the decode kernel's maps use 256).
  struct Config { const char* path; int block_n, stages, threads, work_ns, pad_kb, promo = 256; };
  // pad_kb: extra shared memory per CTA, to force one CTA per SM where two would otherwise fit.
  std::vector<Config> configs = {
      {"tma", 128, 2, 96, 0, 0},         {"tma", 128, 2, 96, 0, 0, 128},     {"tma", 128, 2, 96, 0, 0, 64},
      {"tma", 128, 2, 96, 0, 0, 0},      {"tma", 128, 2, 96, 1000, 0, 0},    {"tma", 128, 2, 96, 1000, 0, 128},
      {"tma", 64, 3, 96, 0, 0, 0},       {"tma", 64, 3, 96, 1000, 0, 0},     {"tma", 64, 3, 96, 1000, 0, 128},
      {"tma", 64, 3, 96, 0, 100, 0},     {"tma", 64, 3, 96, 1000, 100, 0},   {"tma", 64, 4, 96, 0, 0, 128},
      {"cpasync", 64, 3, 128, 0, 0},     {"cpasync", 64, 3, 128, 1000, 0},   {"cpasync", 128, 3, 128, 0, 0},
  };
  for (const Config& c : configs) {
    Args a{seq, c.block_n, c.stages, c.work_ns, c.threads / 32 - 1, sink};
    const bool tma = c.path[0] == 't';
    size_t smem = (size_t)c.stages * c.block_n * kRowBytes * 2 + 1024 + 64 + c.pad_kb * 1024;
    int per_sm = 0;
    if (tma) {
      CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, tma_stream, c.threads, smem));
    } else {
      CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, cpasync_stream, c.threads, smem));
    }
    if (per_sm == 0) {
      std::printf("%-8s n=%3d st=%d: does not fit (%zu bytes)\n", c.path, c.block_n, c.stages, smem);
      continue;
    }
    const CUtensorMapL2promotion promo = c.promo == 0     ? CU_TENSOR_MAP_L2_PROMOTION_NONE
                                         : c.promo == 64  ? CU_TENSOR_MAP_L2_PROMOTION_L2_64B
                                         : c.promo == 128 ? CU_TENSOR_MAP_L2_PROMOTION_L2_128B
                                                          : CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
    CUtensorMap mk = bshd_map_d128(k, kv_heads, rows, c.block_n, promo),
                mv = bshd_map_d128(v, kv_heads, rows, c.block_n, promo);
    std::vector<float> ms;
    for (int rep = 0; rep < 6; ++rep) {
      CHECK(cudaMemset(flush, rep, 256 << 20));
      const float t = time_launch_ms([&] {
        if (tma)
          tma_stream<<<dim3(kv_heads, batch), c.threads, smem>>>(mk, mv, a);
        else
          cpasync_stream<<<dim3(kv_heads, batch), c.threads, smem>>>(k, v, kv_heads * kRowBytes, a);
      });
      if (rep) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    const float med = ms[ms.size() / 2];
    std::printf("%-8s n=%3d st=%d threads=%3d work=%4dns ctas/SM=%d promo=%3d: %.4f ms %.0f GB/s\n", c.path,
                c.block_n, c.stages, c.threads, c.work_ns, per_sm, tma ? c.promo : 0, med, 2.0 * bytes / med / 1e6);
  }
  return 0;
}
