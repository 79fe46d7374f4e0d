// What a D=64 decode stream reaches with one K/V head per CTA (128-byte pieces of a (B, S, 8, 64) cache's 1 KB
// rows) against two adjacent heads per CTA (one TMA box over both: 256-byte pieces). bench/LOG.md d23.
//
//   nvcc -O3 -arch=sm_90a -std=c++17 -o /tmp/stream_probe_heads scripts/stream_probe_heads.cu -lcuda && /tmp/stream_probe_heads
//
// No attention, as scripts/stream_probe.cu: a consumer warp waits for a slot, reads a word, spins `work_ns`, frees
// it; consumer warps form key groups of four that take alternate blocks (the ring is even for them).
#include <algorithm>
#include <vector>

#include "stream_ring.cuh"

constexpr int kD = 64, kRowBytes = kD * 2;
__device__ __forceinline__ void tma_3d(unsigned dst, const CUtensorMap* map, unsigned bar, int x, int y, int z) {
  asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];"
               ::"r"(dst), "l"(map), "r"(bar), "r"(x), "r"(y), "r"(z) : "memory");
}
struct Args { int seq, keys, hp, stages, splits, work_ns, consumer_warps; float* sink; };
// grid (kv_heads / hp, batch, splits); a block is `keys` keys of hp heads: hp * keys rows of 128 bytes.
__global__ void stream(const __grid_constant__ CUtensorMap mk, const __grid_constant__ CUtensorMap mv, Args a) {
  extern __shared__ __align__(1024) unsigned char raw[];
  unsigned char* smem = (unsigned char*)(((size_t)raw + 1023) & ~(size_t)1023);
  const unsigned tile = a.hp * a.keys * kRowBytes, slot = 2 * tile;
  unsigned long long* bars = (unsigned long long*)(smem + a.stages * slot);
  const int head = blockIdx.x * a.hp, batch = blockIdx.y, per = a.seq / a.splits, blocks = per / a.keys;
  const int key_base = blockIdx.z * per;
  init_ring(bars, a.stages, 4);  // a key group's four warps free a slot
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp == 0) {
    if (lane != 0) return;
    for (int j = 0; j < blocks; ++j) {
      const unsigned full = acquire_slot(bars, a.stages, j, slot), dst = smem_u32(smem + j % a.stages * slot);
      const int y = batch * a.seq + key_base + j * a.keys;
      tma_3d(dst, &mk, full, 0, head, y);
      tma_3d(dst + tile, &mv, full, 0, head, y);
    }
    return;
  }
  // consumer warps: key groups of 4 taking alternate blocks
  const float acc = consume_blocks(bars, smem, a.stages, slot, blocks, a.consumer_warps / 4, (warp - 1) / 4, a.work_ns);
  if (acc == 12345.f) a.sink[0] = acc;
}
static CUtensorMap make_map(void* base, int kv_heads, long long rows, int hp, int keys) {
  CUtensorMap m;
  cuuint64_t dims[3] = {(cuuint64_t)kD, (cuuint64_t)kv_heads, (cuuint64_t)rows};
  cuuint64_t strides[2] = {(cuuint64_t)kRowBytes, (cuuint64_t)kv_heads * kRowBytes};
  cuuint32_t box[3] = {64, (cuuint32_t)hp, (cuuint32_t)keys}, elem[3] = {1, 1, 1};
  CHECK(cuTensorMapEncodeTiled(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, base, dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  return m;
}
int main() {
  const int kv_heads = 8;
  unsigned char *k, *v, *flush; float* sink;
  const long long max_bytes = 32LL * 8192 * kv_heads * kRowBytes;
  CHECK(cudaMalloc(&k, max_bytes)); CHECK(cudaMalloc(&v, max_bytes)); CHECK(cudaMalloc(&sink, 4));
  CHECK(cudaMemset(k, 0, max_bytes)); CHECK(cudaMemset(v, 0, max_bytes)); CHECK(cudaMalloc(&flush, 256 << 20));
  cudaEvent_t t0, t1; CHECK(cudaEventCreate(&t0)); CHECK(cudaEventCreate(&t1));
  int sms; CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CHECK(cudaFuncSetAttribute(stream, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
  struct Config { int batch, seq, hp, keys, stages, splits, cwarps, work_ns; };
  std::vector<Config> configs;
  for (int work : {0, 400, 800})
    for (auto bs : {std::pair<int, int>{32, 8192}, {128, 2048}}) {
      configs.push_back({bs.first, bs.second, 1, 128, 2, 1, 4, work});   // today: 2 CTAs/SM, one consumer each
      configs.push_back({bs.first, bs.second, 1, 128, 3, 1, 4, work});
      configs.push_back({bs.first, bs.second, 2, 64, 2, 1, 4, work});    // two heads, 64 keys: same slot bytes
      configs.push_back({bs.first, bs.second, 2, 64, 2, 2, 4, work});    // ... split in two: as many CTAs as today
      configs.push_back({bs.first, bs.second, 2, 64, 4, 1, 8, work});    // 1 CTA/SM, two key groups
      configs.push_back({bs.first, bs.second, 2, 128, 2, 1, 8, work});
    }
  for (const Config& c : configs) {
    const long long rows = (long long)c.batch * c.seq, bytes = rows * kv_heads * kRowBytes;
    Args a{c.seq, c.keys, c.hp, c.stages, c.splits, c.work_ns, c.cwarps, sink};
    const int threads = 32 * (1 + c.cwarps);
    size_t smem = (size_t)c.stages * c.hp * c.keys * kRowBytes * 2 + 1024 + 64;
    int per_sm = 0; CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, stream, threads, smem));
    if (!per_sm) { std::printf("does not fit\n"); continue; }
    CUtensorMap mk = make_map(k, kv_heads, rows, c.hp, c.keys), mv = make_map(v, kv_heads, rows, c.hp, c.keys);
    std::vector<float> ms;
    for (int rep = 0; rep < 8; ++rep) {
      CHECK(cudaMemset(flush, rep, 256 << 20));
      CHECK(cudaEventRecord(t0));
      stream<<<dim3(kv_heads / c.hp, c.batch, c.splits), threads, smem>>>(mk, mv, a);
      CHECK(cudaEventRecord(t1)); CHECK(cudaEventSynchronize(t1)); CHECK(cudaGetLastError());
      float t; CHECK(cudaEventElapsedTime(&t, t0, t1)); if (rep) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    const float med = ms[ms.size() / 2];
    std::printf("B=%3d S=%5d heads/CTA=%d keys=%3d st=%d splits=%d cwarps=%d work=%3dns ctas=%4d ctas/SM=%d: %.4f ms %.0f GB/s\n",
                c.batch, c.seq, c.hp, c.keys, c.stages, c.splits, c.cwarps, c.work_ns, kv_heads / c.hp * c.batch * c.splits, per_sm, med, 2.0 * bytes / med / 1e6);
  }
  int n = 64 << 20; float* a; float* b; CHECK(cudaMalloc(&a, n * 4)); CHECK(cudaMalloc(&b, n * 4));
  std::vector<float> ms;
  for (int rep = 0; rep < 8; ++rep) { CHECK(cudaEventRecord(t0)); CHECK(cudaMemcpy(b, a, n * 4, cudaMemcpyDeviceToDevice)); CHECK(cudaEventRecord(t1)); CHECK(cudaEventSynchronize(t1)); float t; CHECK(cudaEventElapsedTime(&t, t0, t1)); if (rep) ms.push_back(t); }
  std::sort(ms.begin(), ms.end()); std::printf("copy: %.0f GB/s (read + write)\n", 2.0 * n * 4 / ms[ms.size() / 2] / 1e6);
  return 0;
}
