// What a paged D=128 decode stream reaches when a CTA reads one K/V head of each page (256-byte pieces, 2 KB apart)
// against hp adjacent heads of it (one TMA box over hp x 256 bytes of each key's row; hp = 8 reads a page whole),
// with the page table shuffled or in key order (the dense cache's addresses). bench/LOG.md d25.
//
//   nvcc -O3 -arch=sm_90a -std=c++17 -o /tmp/stream_probe_pages scripts/stream_probe_pages.cu -lcuda && /tmp/stream_probe_pages
//
// No attention, as scripts/stream_probe.cu: a consumer warp waits for a slot, reads a word, spins `work_ns`, frees
// it; consumer warps form key groups of four that take alternate blocks. A slot holds `rows` rows of K and of V
// (rows / hp keys), loaded page by page.
#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "stream_ring.cuh"

constexpr int kD = 128, kRowBytes = kD * 2, kHeads = 8;
__device__ __forceinline__ void tma_5d(unsigned dst, const CUtensorMap* map, unsigned bar, int head, int token, int page) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6, %7}], [%2];"
      ::"r"(dst), "l"(map), "r"(bar), "r"(0), "r"(head), "r"(token), "r"(0), "r"(page) : "memory");
}
struct Args { int seq, page, rows, hp, stages, splits, work_ns, consumer_warps, pages_per_seq; const int* table; float* sink; };
// grid (kHeads / hp, batch, splits)
__global__ void stream(const __grid_constant__ CUtensorMap mk, const __grid_constant__ CUtensorMap mv, Args a) {
  extern __shared__ __align__(1024) unsigned char raw[];
  unsigned char* smem = (unsigned char*)(((size_t)raw + 1023) & ~(size_t)1023);
  const unsigned tile = a.rows * kRowBytes, slot = 2 * tile;
  unsigned long long* bars = (unsigned long long*)(smem + a.stages * slot);
  const int keys = a.rows / a.hp, box_keys = min(keys, a.page), box_bytes = box_keys * a.hp * kRowBytes;
  const int head = blockIdx.x * a.hp, batch = blockIdx.y, per = a.seq / a.splits, blocks = per / keys;
  const int key_base = blockIdx.z * per;
  init_ring(bars, a.stages, 4);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp == 0) {
    if (lane != 0) return;
    const int* table = a.table + (long long)batch * a.pages_per_seq;
    for (int j = 0; j < blocks; ++j) {
      const unsigned full = acquire_slot(bars, a.stages, j, slot), dst = smem_u32(smem + j % a.stages * slot);
      for (int k = 0; k < keys; k += box_keys) {
        const int key = key_base + j * keys + k, page = __ldg(table + key / a.page), token = key % a.page;
        const unsigned off = (unsigned)(k / box_keys) * box_bytes;
        tma_5d(dst + off, &mk, full, head, token, page);
        tma_5d(dst + tile + off, &mv, full, head, token, page);
      }
    }
    return;
  }
  const float acc = consume_blocks(bars, smem, a.stages, slot, blocks, a.consumer_warps / 4, (warp - 1) / 4, a.work_ns);
  if (acc == 12345.f) a.sink[0] = acc;
}
// The pool (pages, page, kHeads, kD) as 5-D: 64 columns, heads, a page's tokens, the two 64-column halves, pages.
static CUtensorMap make_map(void* base, long long pages, int page, int hp, int box_keys) {
  CUtensorMap m;
  cuuint64_t dims[5] = {64, kHeads, (cuuint64_t)page, 2, (cuuint64_t)pages};
  cuuint64_t strides[4] = {kRowBytes, (cuuint64_t)kHeads * kRowBytes, 128, (cuuint64_t)page * kHeads * kRowBytes};
  cuuint32_t box[5] = {64, (cuuint32_t)hp, (cuuint32_t)box_keys, 2, 1}, elem[5] = {1, 1, 1, 1, 1};
  CHECK(cuTensorMapEncodeTiled(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 5, base, dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  return m;
}
int main() {
  const int batch = 32, seq = 8192;
  const long long bytes = (long long)batch * seq * kHeads * kRowBytes;
  unsigned char *k, *v, *flush; float* sink; int *shuffled, *in_order;
  CHECK(cudaMalloc(&k, bytes)); CHECK(cudaMalloc(&v, bytes)); CHECK(cudaMalloc(&sink, 4));
  CHECK(cudaMemset(k, 0, bytes)); CHECK(cudaMemset(v, 0, bytes)); CHECK(cudaMalloc(&flush, 256 << 20));
  CHECK(cudaMalloc(&shuffled, batch * seq * 4)); CHECK(cudaMalloc(&in_order, batch * seq * 4));
  cudaEvent_t t0, t1; CHECK(cudaEventCreate(&t0)); CHECK(cudaEventCreate(&t1));
  CHECK(cudaFuncSetAttribute(stream, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
  // rows per slot, stages, consumer warps: two CTAs an SM (the gathered pages' ring) or one with two key groups
  struct Ring { int rows, stages, cwarps; };
  const Ring rings[2] = {{64, 3, 4}, {64, 6, 8}};
  for (int page : {4, 16, 64}) {
    const int pages = batch * seq / page, per_seq = seq / page;
    std::vector<int> ids(pages); std::iota(ids.begin(), ids.end(), 0);
    CHECK(cudaMemcpy(in_order, ids.data(), pages * 4, cudaMemcpyHostToDevice));
    std::shuffle(ids.begin(), ids.end(), std::mt19937(0));
    CHECK(cudaMemcpy(shuffled, ids.data(), pages * 4, cudaMemcpyHostToDevice));
    for (int work : {0, 800})
      for (const Ring& r : rings)
        for (int hp : {1, 2, 4, 8})
          for (const int* table : {in_order, shuffled}) {
            const int keys = r.rows / hp, box_keys = std::min(keys, page), splits = hp;
            Args a{seq, page, r.rows, hp, r.stages, splits, work, r.cwarps, per_seq, table, sink};
            const int threads = 32 * (1 + r.cwarps);
            const size_t smem = (size_t)r.stages * r.rows * kRowBytes * 2 + 1024 + 64;
            int per_sm = 0; CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, stream, threads, smem));
            CUtensorMap mk = make_map(k, pages, page, hp, box_keys), mv = make_map(v, pages, page, hp, box_keys);
            std::vector<float> ms;
            for (int rep = 0; rep < 8; ++rep) {
              CHECK(cudaMemset(flush, rep, 256 << 20));
              CHECK(cudaEventRecord(t0));
              stream<<<dim3(kHeads / hp, batch, splits), threads, smem>>>(mk, mv, a);
              CHECK(cudaEventRecord(t1)); CHECK(cudaEventSynchronize(t1)); CHECK(cudaGetLastError());
              float t; CHECK(cudaEventElapsedTime(&t, t0, t1)); if (rep) ms.push_back(t);
            }
            std::sort(ms.begin(), ms.end());
            const float med = ms[ms.size() / 2];
            std::printf("page=%2d %-8s heads/CTA=%d rows=%3d keys=%3d box=%5dB st=%d cwarps=%d work=%3dns ctas=%4d ctas/SM=%d: %.4f ms %.0f GB/s\n",
                        page, table == shuffled ? "shuffled" : "in-order", hp, r.rows, keys, box_keys * hp * kRowBytes, r.stages,
                        r.cwarps, work, kHeads / hp * batch * splits, per_sm, med, 2.0 * bytes / med / 1e6);
          }
  }
  int n = 64 << 20; float* a; float* b; CHECK(cudaMalloc(&a, n * 4)); CHECK(cudaMalloc(&b, n * 4));
  std::vector<float> ms;
  for (int rep = 0; rep < 8; ++rep) { CHECK(cudaEventRecord(t0)); CHECK(cudaMemcpy(b, a, n * 4, cudaMemcpyDeviceToDevice)); CHECK(cudaEventRecord(t1)); CHECK(cudaEventSynchronize(t1)); float t; CHECK(cudaEventElapsedTime(&t, t0, t1)); if (rep) ms.push_back(t); }
  std::sort(ms.begin(), ms.end()); std::printf("copy: %.0f GB/s (read + write)\n", 2.0 * n * 4 / ms[ms.size() / 2] / 1e6);
  return 0;
}
