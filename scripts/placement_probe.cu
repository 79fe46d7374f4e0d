// Where a decode launch's CTAs land and how fast each streams (bench/LOG.md d41: one-split decode tiles fell off
// a cliff between 64 and 72 CTAs on an H100).
//
//   nvcc -O3 -arch=sm_90a -std=c++17 -o /tmp/placement_probe scripts/placement_probe.cu -lcuda && /tmp/placement_probe
//   /tmp/placement_probe BLOCK_N STAGES    (the ring: 128-row blocks, 3 slots unless told)
//
// The stream is scripts/stream_probe.cu's TMA ring (one CTA per (K/V head, sequence), no attention), one CTA a
// SM. Each CTA records its SM (%smid) and its first and last globaltimer. Per batch the probe prints the launch's
// rate and each CTA's stream time, grouped by whether the other SM of its pair (smid ^ 1, the pair taken to be a
// TPC) holds a CTA of the same launch, and by how many CTAs its neighbourhood of 16 SMs holds (a stand-in for a
// GPC, whose real SM list the driver does not expose).
#include <algorithm>
#include <vector>

#include "stream_ring.cuh"

constexpr int kHeadDim = 128, kRowBytes = kHeadDim * 2, kThreads = 96;
constexpr size_t kOneCtaSmem = 120 * 1024;  // at least this much shared memory a CTA: one CTA a SM whatever the ring

struct Stamp {
  unsigned long long start, end;
  unsigned sm, pad;
};

__global__ void tma_stream(const __grid_constant__ CUtensorMap mk, const __grid_constant__ CUtensorMap mv, int seq,
                           int block_n, int stages, Stamp* stamps, float* sink) {
  extern __shared__ __align__(1024) unsigned char raw[];
  unsigned char* smem = (unsigned char*)(((size_t)raw + 1023) & ~(size_t)1023);
  unsigned long long* bars = (unsigned long long*)(smem + stages * block_n * kRowBytes * 2);
  const int head = blockIdx.x, batch = blockIdx.y, blocks = seq / block_n;
  const unsigned slot_bytes = block_n * kRowBytes * 2;
  unsigned long long t0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  init_ring(bars, stages, kThreads / 32 - 1);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp == 0) {
    if (lane != 0) return;
    for (int j = 0; j < blocks; ++j) {
      const unsigned full = acquire_slot(bars, stages, j, slot_bytes), dst = smem_u32(smem + j % stages * slot_bytes);
      const int y = batch * seq + j * block_n;
      for (int c = 0; c < 2; ++c) tma_2d(dst + c * block_n * 128, &mk, full, head * kHeadDim + c * 64, y);
      for (int c = 0; c < 2; ++c)
        tma_2d(dst + slot_bytes / 2 + c * block_n * 128, &mv, full, head * kHeadDim + c * 64, y);
    }
    return;
  }
  float acc = 0.f;
  for (int j = 0; j < blocks; ++j) {
    const int s = j % stages;
    mbar_wait(smem_u32(bars + s), (j / stages) & 1);
    acc += ((const float*)(smem + s * slot_bytes))[lane];
    __syncwarp();
    if (lane == 0) mbar_arrive(smem_u32(bars + stages + s));
  }
  if (acc == 12345.f) sink[0] = acc;
  if (warp == 1 && lane == 0) {
    unsigned long long t1;
    unsigned sm;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    stamps[blockIdx.y * gridDim.x + blockIdx.x] = Stamp{t0, t1, sm, 0};
  }
}

static void stats(const char* what, std::vector<double>& us) {
  if (us.empty()) return;
  std::sort(us.begin(), us.end());
  double sum = 0;
  for (double u : us) sum += u;
  std::printf("    %-28s %3zu CTAs: stream us min %.1f median %.1f mean %.1f max %.1f\n", what, us.size(), us.front(),
              us[us.size() / 2], sum / us.size(), us.back());
}

int main(int argc, char** argv) {
  const int block_n = argc > 1 ? std::atoi(argv[1]) : 128, stages = argc > 2 ? std::atoi(argv[2]) : 3;
  const int max_batch = 16, seq = 8192, kv_heads = 8;
  if (block_n < 8 || block_n > 256 || seq % block_n || stages < 1) {
    std::printf("usage: placement_probe [BLOCK_N (8-256, dividing %d)] [STAGES (1 or more)]\n", seq);
    return 2;
  }
  const long long rows = (long long)max_batch * seq, bytes = rows * kv_heads * kRowBytes;
  unsigned char *k, *v;
  float* sink;
  Stamp* stamps;
  CHECK(cudaMalloc(&k, bytes));
  CHECK(cudaMalloc(&v, bytes));
  CHECK(cudaMalloc(&sink, 4));
  CHECK(cudaMalloc(&stamps, sizeof(Stamp) * kv_heads * max_batch));
  CHECK(cudaMemset(k, 0, bytes));
  CHECK(cudaMemset(v, 0, bytes));
  unsigned char* flush;
  CHECK(cudaMalloc(&flush, 256 << 20));
  int sms;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t smem = std::max(kOneCtaSmem, (size_t)stages * block_n * kRowBytes * 2 + 1024 + 64);
  CHECK(cudaFuncSetAttribute(tma_stream, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  int per_sm = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, tma_stream, kThreads, smem));
  if (per_sm == 0) {
    std::printf("a ring of %d slots of %d rows (%zu bytes) does not fit a SM\n", stages, block_n, smem);
    return 2;
  }
  const CUtensorMap mk = bshd_map_d128(k, kv_heads, rows, block_n, CU_TENSOR_MAP_L2_PROMOTION_L2_256B),
                    mv = bshd_map_d128(v, kv_heads, rows, block_n, CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
  std::printf("%d SMs, %d CTA(s) a SM, %d keys a sequence, %d K/V heads, %d-row blocks, %d slots\n", sms, per_sm, seq,
              kv_heads, block_n, stages);
  for (int batch : {4, 8, 9, 10, 11, 12, 14, 16}) {
    const int ctas = kv_heads * batch;
    std::vector<float> ms;
    std::vector<Stamp> host(ctas);
    for (int rep = 0; rep < 6; ++rep) {
      CHECK(cudaMemset(flush, rep, 256 << 20));
      const float t = time_launch_ms([&] {
        tma_stream<<<dim3(kv_heads, batch), kThreads, smem>>>(mk, mv, seq, block_n, stages, stamps, sink);
      });
      if (rep) ms.push_back(t);
    }
    CHECK(cudaMemcpy(host.data(), stamps, sizeof(Stamp) * ctas, cudaMemcpyDeviceToHost));
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2], read = 2.0 * ctas * seq * kRowBytes;  // K and V: seq rows of a head each
    std::vector<int> on_sm(sms + 1, 0);
    for (const Stamp& s : host) on_sm[s.sm]++;
    int pairs_two = 0, pairs_one = 0;
    for (int p = 0; p + 1 < sms; p += 2) {
      const int busy = (on_sm[p] > 0) + (on_sm[p + 1] > 0);
      pairs_two += busy == 2, pairs_one += busy == 1;
    }
    std::printf("B=%2d: %3d CTAs %.4f ms %.0f GB/s; SM pairs with two CTAs %d, with one %d\n", batch, ctas, med,
                read / med / 1e6, pairs_two, pairs_one);
    std::vector<double> alone, shared, all;
    std::vector<std::vector<double>> by_group(4);
    for (const Stamp& s : host) {
      const double us = (s.end - s.start) / 1e3;
      all.push_back(us);
      (on_sm[s.sm ^ 1] ? shared : alone).push_back(us);
      int group = 0;  // CTAs among the 16 SMs around it: 0-8, 9-12, 13-14, 15-16
      const int first = (int)s.sm / 16 * 16;
      for (int m = first; m < std::min(sms, first + 16); ++m) group += on_sm[m];
      by_group[group <= 8 ? 0 : group <= 12 ? 1 : group <= 14 ? 2 : 3].push_back(us);
    }
    stats("all", all);
    stats("pair's other SM idle", alone);
    stats("pair's other SM busy", shared);
    const char* names[4] = {"<= 8 CTAs in its 16 SMs", "9-12 CTAs in its 16 SMs", "13-14 CTAs in its 16 SMs",
                            "15-16 CTAs in its 16 SMs"};
    for (int g = 0; g < 4; ++g) stats(names[g], by_group[g]);
    std::printf("    SMs:");
    for (const Stamp& s : host) std::printf(" %u", s.sm);
    std::printf("\n");
  }
  return 0;
}
