// How fast TMA streams an MLA K cache into shared memory, by cache layout and box shape, with
// no math: the ceiling of the memory-bound decode rows (b = 128, h_q = 16), where mlagen and
// FlashMLA read K at ~4.05 TB/s and FA3, whose cache is split into a 512-wide latent part and
// a 64-wide rope part, at 4.35 (shared/anchors/hopper-flashmla.md).
//
// One CTA per request (the chunk plan of those rows), each reading its blocks (64 keys, a
// shuffled page each) through a ring of shared-memory slots: a producer thread issues the
// boxes, a consumer warp waits for each slot and hands it back.  Modes:
//   slices    [pages][64][576], a box of 64 keys x 64 columns (9 a block, 8 KiB): mlagen today
//   slices128 the same with L2 promotion 128 B (mlagen: 256 B)
//   slicesN   the same with no L2 promotion
//   rows8     [pages][64][576], a box of 8 whole keys (4-D map, 9 KiB contiguous, 8 a block),
//             landing as 9 column slices of 8 keys (the 128-byte swizzle atoms wgmma reads)
//   block     [pages][64][576], one 72 KiB box a block (4-D map), 3 slots
//   split     FA3's layout: [pages][64][512] and [pages][64][64], 8 + 1 boxes a block
//   ldg       plain 16-byte loads of the whole [pages][64][576] buffer, all SMs (the ceiling)
// With a third argument (`const` or `rand`: the cache's bytes, since DRAM's I/O power depends
// on how its data toggles) and hold times in ns after it, only slices128 runs, once per hold:
// the consumer waits for a block's 9 boxes, holds them that long (as a decode kernel's math
// holds a block's slices), then hands them all back; hold -1 hands each box back on arrival.
//
//   nvcc -O3 -arch=sm_90a -std=c++17 -I templates/hopper/include benchmarks/tma_stream_probe.cu \
//     -o /tmp/tma_probe && /tmp/tma_probe [batch=128] [tokens=16384] [const|rand HOLD_NS...]
#include <cudaTypedefs.h>
#include <cuda.h>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "mla_sm90.cuh"

using namespace mlagen::hopper;

#define CK(x)                                                                    \
  do {                                                                           \
    cudaError_t e_ = (x);                                                        \
    if (e_ != cudaSuccess) {                                                     \
      printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      exit(1);                                                                   \
    }                                                                            \
  } while (0)

__device__ __forceinline__ void tma_load_4d(void* dst, const void* tmap, uint64_t* bar, int c0,
                                            int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];\n"
      ::"r"(sm90::smem_addr(dst)), "l"(tmap), "r"(sm90::smem_addr(bar)), "r"(c0), "r"(c1),
        "r"(c2), "r"(c3)
      : "memory");
}

enum Mode { kSlices = 0, kRows8 = 1, kBlock = 2, kSplit = 3 };

struct Args {
  CUtensorMap m0, m1;
  const int* bt;
  int blocks;   // per request
  int slots, slot_bytes, boxes;
  int hold_ns;   // < 0: each box back on arrival; else a block's boxes held this long
};

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

// bf16 words from a hash of the index: exponents of randn-like values, varying mantissas
__global__ void fill_rand(uint32_t* p, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 2654435761u ^ (uint32_t)(i >> 32);
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    const uint32_t lo = 0x3c00u | (h & 0x83ffu), hi = 0x3c00u | ((h >> 16) & 0x83ffu);
    p[i] = lo | (hi << 16);
  }
}

template <int MODE>
__global__ void __launch_bounds__(64, 1) stream_kernel(const __grid_constant__ Args a) {
  extern __shared__ __align__(1024) unsigned char raw[];
  unsigned char* buf = sm90::smem_align1024(raw);
  uint64_t* full = reinterpret_cast<uint64_t*>(buf + a.slots * a.slot_bytes);
  uint64_t* empty = full + a.slots;
  if (threadIdx.x == 0) {
    for (int s = 0; s < a.slots; ++s) sm90::mbar_init(&full[s], 1), sm90::mbar_init(&empty[s], 1);
    sm90::fence_mbar_init();
  }
  __syncthreads();
  const int req = blockIdx.x;
  const int total = a.blocks * a.boxes;
  if (threadIdx.x == 32) {
    sm90::tma_prefetch_desc(&a.m0);
    int slot = 0, lap = 0;
    for (int i = 0; i < a.blocks; ++i) {
      const int page = a.bt[req * a.blocks + i];
      for (int b = 0; b < a.boxes; ++b) {
        sm90::mbar_wait(&empty[slot], (lap & 1) ^ 1);
        sm90::mbar_arrive_expect_tx(&full[slot], a.slot_bytes);
        unsigned char* dst = buf + slot * a.slot_bytes;
        if (MODE == kSlices) sm90::tma_load_3d(dst, &a.m0, &full[slot], b * 64, 0, page);
        if (MODE == kRows8) tma_load_4d(dst, &a.m0, &full[slot], 0, 8 * b, 0, page);
        if (MODE == kBlock) tma_load_4d(dst, &a.m0, &full[slot], 0, 0, 0, page);
        if (MODE == kSplit) {
          if (b < 8) sm90::tma_load_3d(dst, &a.m0, &full[slot], b * 64, 0, page);
          else sm90::tma_load_3d(dst, &a.m1, &full[slot], 0, 0, page);
        }
        if (++slot == a.slots) slot = 0, ++lap;
      }
    }
  } else if (threadIdx.x == 0 && a.hold_ns < 0) {
    int slot = 0, lap = 0;
    for (int k = 0; k < total; ++k) {
      sm90::mbar_wait(&full[slot], lap & 1);
      sm90::mbar_arrive(&empty[slot]);
      if (++slot == a.slots) slot = 0, ++lap;
    }
  } else if (threadIdx.x == 0) {
    int slot = 0, lap = 0;
    for (int i = 0; i < a.blocks; ++i) {
      int s = slot, l = lap;
      for (int b = 0; b < a.boxes; ++b) {
        sm90::mbar_wait(&full[s], l & 1);
        if (++s == a.slots) s = 0, ++l;
      }
      const uint64_t t0 = global_ns();
      while (global_ns() - t0 < (uint64_t)a.hold_ns) {
      }
      for (int b = 0; b < a.boxes; ++b) {
        sm90::mbar_arrive(&empty[slot]);
        if (++slot == a.slots) slot = 0, ++lap;
      }
    }
  }
}

__global__ void ldg_kernel(const uint4* p, size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = acc;
}

static PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  void* f = nullptr;
  cudaDriverEntryPointQueryResult q;
  CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q));
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
}

static bool encode(CUtensorMap* m, void* base, int rank, const cuuint64_t* dims,
                   const cuuint64_t* strides, const cuuint32_t* box,
                   CUtensorMapL2promotion promo) {
  const cuuint32_t elem[5] = {1, 1, 1, 1, 1};
  CUresult r = encoder()(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rank, base, dims, strides, box,
                         elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, promo,
                         CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) printf("  encode failed (%d)\n", (int)r);
  return r == CUDA_SUCCESS;
}

// Median ms of `reps` launches (after 3 warm-ups) of launch().
template <typename F>
static float median_ms(F launch, int reps) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int w = 0; w < 3; ++w) launch();
  CK(cudaGetLastError());
  std::vector<float> ts;
  for (int r = 0; r < reps; ++r) {
    CK(cudaEventRecord(e0));
    launch();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    ts.push_back(ms);
  }
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

template <int MODE>
static float time_it(const Args& a, int batch, int reps) {
  const int smem = a.slots * a.slot_bytes + 2 * a.slots * 8 + 1024;
  CK(cudaFuncSetAttribute(stream_kernel<MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  return median_ms([&] { stream_kernel<MODE><<<batch, 64, smem>>>(a); }, reps);
}

int main(int argc, char** argv) {
  const int batch = argc > 1 ? atoi(argv[1]) : 128;
  const int tokens = argc > 2 ? atoi(argv[2]) : 16384;
  const int reps = 15;
  const int bpr = tokens / 64, pages = batch * bpr;
  const size_t np = pages;   // byte counts past 2^31
  const size_t page_bytes = 64 * 576 * 2;
  const double bytes = double(pages) * page_bytes;
  std::vector<int> bt(pages);
  std::iota(bt.begin(), bt.end(), 0);
  std::shuffle(bt.begin(), bt.end(), std::mt19937(0));
  int* d_bt;
  CK(cudaMalloc(&d_bt, pages * sizeof(int)));
  CK(cudaMemcpy(d_bt, bt.data(), pages * sizeof(int), cudaMemcpyHostToDevice));
  void *k576, *ckv, *kpe;
  CK(cudaMalloc(&k576, np * page_bytes));
  CK(cudaMalloc(&ckv, np * 64 * 512 * 2));
  CK(cudaMalloc(&kpe, np * 64 * 64 * 2));
  const bool rand_fill = argc > 3 && strcmp(argv[3], "rand") == 0;
  if (rand_fill)
    fill_rand<<<132 * 8, 512>>>((uint32_t*)k576, np * page_bytes / 4);
  else
    CK(cudaMemset(k576, 1, np * page_bytes));
  CK(cudaDeviceSynchronize());
  CK(cudaMemset(ckv, 1, np * 64 * 512 * 2));
  CK(cudaMemset(kpe, 1, np * 64 * 64 * 2));
  printf("batch %d, %d tokens a request, %.3f GB of K, shuffled 64-token pages\n", batch, tokens,
         bytes / 1e9);
  auto report = [&](const char* name, float ms) {
    printf("%-10s %8.4f ms  %7.1f GB/s\n", name, ms, bytes / (ms * 1e-3) / 1e9);
  };
  if (argc > 4) {   // the hold sweep: slices128 only
    printf("fill %s, slices128, 25 slots\n", rand_fill ? "rand" : "const");
    for (int round = 0; round < 2; ++round)
      for (int h = 4; h < argc; ++h) {
        Args a{};
        a.bt = d_bt, a.blocks = bpr, a.slots = 25, a.slot_bytes = 8192, a.boxes = 9;
        a.hold_ns = atoi(argv[h]);
        const cuuint64_t dims[3] = {576, 64, (cuuint64_t)pages};
        const cuuint64_t st[2] = {1152, 64 * 1152};
        const cuuint32_t box[3] = {64, 64, 1};
        char name[32];
        snprintf(name, sizeof name, "hold%d", a.hold_ns);
        if (encode(&a.m0, k576, 3, dims, st, box, CU_TENSOR_MAP_L2_PROMOTION_L2_128B))
          report(name, time_it<kSlices>(a, batch, reps));
      }
    return 0;
  }
  for (int round = 0; round < 2; ++round) {
    printf("round %d\n", round);
    {  // ceiling
      unsigned* sink;
      CK(cudaMalloc(&sink, 4));
      const size_t n = np * page_bytes / 16;
      report("ldg", median_ms([&] { ldg_kernel<<<132 * 8, 512>>>((const uint4*)k576, n, sink); },
                              reps));
    }
    const CUtensorMapL2promotion promos[3] = {CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                              CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                                              CU_TENSOR_MAP_L2_PROMOTION_NONE};
    const char* pnames[3] = {"slices", "slices128", "slicesN"};
    for (int pi = 0; pi < 3; ++pi) {
      Args a{};
      a.bt = d_bt, a.blocks = bpr, a.slots = 25, a.slot_bytes = 8192, a.boxes = 9, a.hold_ns = -1;
      const cuuint64_t dims[3] = {576, 64, (cuuint64_t)pages};
      const cuuint64_t st[2] = {1152, 64 * 1152};
      const cuuint32_t box[3] = {64, 64, 1};
      if (encode(&a.m0, k576, 3, dims, st, box, promos[pi]))
        report(pnames[pi], time_it<kSlices>(a, batch, reps));
    }
    for (int pi = 0; pi < 2; ++pi) {   // rows8, 256 B and 128 B promotion
      Args a{};
      a.bt = d_bt, a.blocks = bpr, a.slots = 22, a.slot_bytes = 9216, a.boxes = 8, a.hold_ns = -1;
      // (64 columns, 64 keys, 9 column slices, pages): a box of 8 keys lands [slice][key][col]
      const cuuint64_t dims[4] = {64, 64, 9, (cuuint64_t)pages};
      const cuuint64_t st[3] = {1152, 128, 64 * 1152};
      const cuuint32_t box[4] = {64, 8, 9, 1};
      if (encode(&a.m0, k576, 4, dims, st, box, promos[pi]))
        report(pi ? "rows8_128" : "rows8", time_it<kRows8>(a, batch, reps));
    }
    {
      Args a{};
      a.bt = d_bt, a.blocks = bpr, a.slots = 3, a.slot_bytes = 73728, a.boxes = 1, a.hold_ns = -1;
      const cuuint64_t dims[4] = {64, 64, 9, (cuuint64_t)pages};
      const cuuint64_t st[3] = {1152, 128, 64 * 1152};
      const cuuint32_t box[4] = {64, 64, 9, 1};
      if (encode(&a.m0, k576, 4, dims, st, box, promos[0]))
        report("block", time_it<kBlock>(a, batch, reps));
    }
    {
      Args a{};
      a.bt = d_bt, a.blocks = bpr, a.slots = 25, a.slot_bytes = 8192, a.boxes = 9, a.hold_ns = -1;
      const cuuint64_t d0[3] = {512, 64, (cuuint64_t)pages}, s0[2] = {1024, 64 * 1024};
      const cuuint64_t d1[3] = {64, 64, (cuuint64_t)pages}, s1[2] = {128, 64 * 128};
      const cuuint32_t box[3] = {64, 64, 1};
      if (encode(&a.m0, ckv, 3, d0, s0, box, promos[0]) &&
          encode(&a.m1, kpe, 3, d1, s1, box, promos[0]))
        report("split", time_it<kSplit>(a, batch, reps));
    }
  }
  return 0;
}
