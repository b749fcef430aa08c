// Common pieces of the Hopper MLA decode kernels: the parameter record shared by the
// launchers, and thin wrappers over the PTX instructions the main loop uses
// (cp.async with zero-fill, ldmatrix, mma.sync m16n8k16 with fp32 accumulate).
#pragma once
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace mlagen {
namespace hopper {

// The key's width, the problem's kv_lora_rank + rope_dim (the rendered sources define
// MLAGEN_D_QK): 576 (512 + 64, DeepSeek-V3's), or 512 (448 + 64, DeepSeek-V4's; the
// wgmma kernels' sparse modes).  The values are the key's first 512 columns either
// way (V4's include its 64 RoPE columns).
#ifndef MLAGEN_D_QK
#define MLAGEN_D_QK 576
#endif
constexpr int kD = MLAGEN_D_QK;      // key width
constexpr int kDV = 512;             // value width: the first 512 columns of the key
static_assert(kD == 576 || kD == 512, "d_qk 576 or 512");
constexpr int kChunks = kD / 8;      // 16-byte chunks per key row
constexpr int kSchedBlock = 64;      // tokens per scheduler unit (independent of block_kv)
constexpr int kMetaInts = 8;         // ints per part in the scheduler metadata
// The wgmma kernels' conditional rescale (FlashAttention-4's): a row's running max (log2
// domain) moves only when a block's exceeds it by more than this, so P stays under 2^8
// (room enough in bf16/fp16 P and fp32 O and l) and O's rescale is skipped for nearly
// every block once the first has set the max.
constexpr float kRescaleSlack = 8.f;

// A planted fault, for the verifier's own tests only (mlagen/schedule/records.py FAULTS; the
// rendered sources define MLAGEN_FAULT, 0 = none).  Each names the one line it breaks.
#ifndef MLAGEN_FAULT
#define MLAGEN_FAULT 0
#endif
constexpr int kFault = MLAGEN_FAULT;
constexpr int kFaultCausalOffByOne = 1;   // a query sees one key too many
constexpr int kFaultWrongScale = 2;       // softmax scale x 1.01
constexpr int kFaultSkipPartialPage = 3;  // the last, partial page of a sequence is ignored
constexpr int kFaultBadSplitMerge = 4;    // partials merged without their lse weights
constexpr int kFaultEarlyBufferSwap = 5;  // a K stage read one cp.async group too early
// FP8 caches (mla_fp8.cuh, the few-rows kernel's converter and consumer)
constexpr int kFaultScaleWrongTile = 6;   // fp8_ds_mla: the next 128-column tile's scale
constexpr int kFaultScaleTwice = 7;       // the tile scale (fp8_ds_mla) or k_descale (fp8_e4m3)
                                          // multiplied in twice
constexpr int kFaultDescaleNotInOutput = 8;   // fp8_e4m3: k_descale left out of O (kept in S)

// The KV-cache formats a split kernel reads (compile time, mlagen/kvformat.py's names):
// the cache in the q dtype, or FP8 dequantized to it in the kernel.
constexpr int kKvNative = 0;    // "bf16" / "fp16": [blocks, page, 1, 576] in q's dtype
constexpr int kKvE4m3 = 1;      // "fp8_e4m3": 576 e4m3 a token, true = e4m3 * k_descale
constexpr int kKvDsMla = 2;     // "fp8_ds_mla": 512 e4m3 | 4 fp32 tile scales | 64 bf16 RoPE
constexpr int kKvUe8m0 = 3;     // "fp8_ue8m0_paged" (d_qk 512): per page, each token's data row
                                // (448 e4m3 | 64 bf16 RoPE), then each token's 7 UE8M0 scales
                                // (one per 64 values) and a pad byte

// The two fp16 halves of a 32-bit word as floats, the low half first (the 64-row kernel's
// fp16 partials and cluster-merge exchange).
__device__ __forceinline__ float2 unpack_half2(uint32_t v) {
  return __half22float2(*reinterpret_cast<const __half2*>(&v));
}

// Everything the split and combine kernels read; filled by the C entry point.
struct MlaParams {
  const void* q;             // [b, s_q, h_q, 576], last dim contiguous
  const void* k;             // [num_blocks, page, 1, 576], last dim contiguous (FP8: the
                             // format's bytes, 576 or 656 a token)
  const float* k_descale;    // fp8_e4m3: [1] or [b] fp32, entry req * k_descale_stride
  const float* q_descale;    // 8-bit caches: q's [1] or [b] fp32 descale (vLLM's descale_q),
                             // or null (1)
  const float* sink;         // [h_q] fp32 attention sinks, or null: the final output row of
                             // head h is scaled by exp(lse) / (exp(lse) + exp(sink[h]))
                             // (lse unchanged), where it is written in fp32 (direct
                             // epilogue, combine): the sink costs no second bf16 rounding
  const int* block_table;    // [b, max_blocks]
  const int* seqlens;        // [b]
  const int* sched;          // [num_parts, 8] (see mla_scheduler.cuh)
  const int* num_splits;     // [b + 1] prefix sums of splits per request
  void* out;                 // [b, s_q, h_q, 512] contiguous, q's dtype
  float* lse;                // [b, h_q, s_q] contiguous
  float* o_acc;              // [slots, s_q*h_q, 512] fp32 partial outputs, or fp16 ones
                             // (the 64-row wgmma kernel) in the first half of those floats
  float* o_scale;            // [slots, s_q*h_q, 2] after the fp16 partials: 1 / the scale
                             // of each row's two 256-column halves (kHalfPartials)
  float* lse_acc;            // [slots, s_q*h_q] fp32 partial lse (natural log)
  int64_t q_stride_b, q_stride_s, q_stride_h;   // elements
  int64_t k_stride_block, k_stride_token;       // elements (FP8 formats: bytes)
  int64_t k_descale_stride;                     // 0 (one descale) or 1 (one a sequence)
  int64_t q_descale_stride;                     // likewise
  int bt_stride;
  int batch, s_q, h_q, page_size, num_blocks, max_blocks, num_parts;
  float scale_log2;          // softmax_scale * log2(e)
  int causal;
  int num_sms;               // SMs of the device (the host reads it once per device)
  int* error;                // device error flags (kError*), or null: set, never cleared
  // token-sparse rows over two pools (SP = 2, mla_sparse.cuh): the extra pool's cache (the
  // main one's format), its index lists and each row's main-list length (its keys are the
  // main list's first len1[r] entries, then the extra list's: seqlens[r] in all)
  const void* k2;            // [num_blocks2, page_size2, 1, width]
  const int* idx2;           // [rows, idx2_stride]
  const int* len1;           // [rows]
  int64_t k2_stride_block, k2_stride_token;     // elements (FP8 formats: bytes)
  int idx2_stride, page_size2, num_blocks2;
};

// The attention sink's factor on a final output row of log-sum-exp lse (natural log):
// exp(lse) / (exp(lse) + exp(sink)) = 1 / (1 + exp(sink - lse)); sink +inf gives 0, -inf 1
// (a row with no key, lse +inf, has out 0 whatever the factor).
__device__ __forceinline__ float sink_keep(float lse, float sink) {
  return 1.f / (1.f + __expf(sink - lse));
}

// Device-side error flags (MlaParams::error): what the split kernel found instead of a host
// check with a sync.  The sequence concerned gets NaN out and lse.
constexpr int kErrorBadPage = 1;      // a block-table entry outside [0, num_blocks), or a
                                      // length beyond the table's row
constexpr int kErrorBadLength = 2;    // a negative cache_seqlens entry
constexpr int kErrorBadPlan = 4;      // metadata planned for a cluster merge the split launch
                                      // does not make (another batch's metadata)
constexpr int kErrorBadDescale = 8;   // a k_descale or descale_q entry not finite and > 0

// Programmatic dependent launch (sm_90): the combine is launched as a dependent of the
// split kernel and waits here until the split grid has finished and its writes are visible.
// A kernel may trigger its dependents early with pdl_launch_dependents (the mma_sync split
// kernel does not: measured slower).
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
__device__ __forceinline__ void pdl_wait_primary() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

// A kernel launched as a programmatic dependent of whatever precedes it in the stream (the
// last call's combine, in a decode step of back-to-back calls): its CTAs start and run their
// prologue (shared memory, barriers) while that grid finishes, and wait in pdl_wait_primary
// before their first global access (the combine still reads the partials they overwrite).
// cluster: the cluster's shape in CTAs (1 x 1: no clusters).
template <typename... Params, typename... Args>
cudaError_t launch_dependent(void (*kernel)(Params...), dim3 grid, int threads, int smem,
                             cudaStream_t stream, dim3 cluster, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  attr[1].id = cudaLaunchAttributeClusterDimension;
  attr[1].val.clusterDim.x = cluster.x;
  attr[1].val.clusterDim.y = cluster.y;
  attr[1].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = cluster.x * cluster.y > 1 ? 2 : 1;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<Args&&>(args)...);
}

// Launchers, one translation unit each (split.cu, combine.cu, scheduler.cu).
cudaError_t launch_split(const MlaParams& p, cudaStream_t stream);
cudaError_t split_ctas_per_sm(int* n);
// The cluster size the split kernel is launched with for a batch over num_parts parts (1: no
// clusters); the scheduler plans the cluster merge (mla_scheduler.cuh) only for c > 1.
int split_cluster(int batch, int num_parts);
// The parts a sparse call of two 64-row tiles a token should plan, at most `parts`: the
// crossover's clusters the device holds at once (mla_wgmma.cuh kCross: a cluster a part),
// so that no cluster waits for a second wave; `parts` where the kernel has no clusters.
int split_cluster_parts(int parts);
cudaError_t launch_combine(const MlaParams& p, cudaStream_t stream);
cudaError_t launch_scheduler(const int* seqlens, int batch, int num_parts, int fixed_cost,
                             int fixed_splits, int* sched, int* num_splits, cudaStream_t stream);
// Sparse calls: each flattened row's key count from FlashMLA's per-sequence lengths (in
// scheduler.cu beside the scheduler, which reads them).
cudaError_t launch_sparse_lengths(const int* topk_length, const int* extra_topk_length,
                                  int rows, int s_q, int topk, int extra_topk, int* lens,
                                  int* len1, cudaStream_t stream);

template <typename T> struct Pair;
template <> struct Pair<__nv_bfloat16> {
  using type = __nv_bfloat162;
  static __device__ __forceinline__ type make(float a, float b) {
    return __floats2bfloat162_rn(a, b);
  }
};
template <> struct Pair<__half> {
  using type = __half2;
  static __device__ __forceinline__ type make(float a, float b) {
    return __floats2half2_rn(a, b);
  }
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy global -> shared; src_bytes = 0 fills the 16 bytes with zeros and
// reads nothing (how slots outside a sequence never reach the tensor cores).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)),
               "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1]) : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(p)));
}

// D += A * B, m16n8k16, fp32 accumulate.
template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1);
template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4],
                                                        uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma16816<__half>(float (&d)[4], const uint32_t (&a)[4],
                                                 uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace hopper
}  // namespace mlagen
