// The combine kernel: merges the fp32 partial results of requests that were split.
//   out = sum_i w_i o_i,  w_i = exp(lse_i - max) / sum_j exp(lse_j - max),
//   lse = max + log(sum_j exp(lse_j - max))
// One CTA per (request, query row), 128 threads x 4 columns, launched with programmatic
// dependent launch after the split kernel.  Requests with one split were
// written by the split kernel; their CTAs return at once.  No visible key in any split
// (every lse_i = -inf) gives out = 0 and lse = +inf; a NaN lse (bad block table) gives NaN.
//
// A small batch splits each request many ways (b = 1 over 132 SMs: ~64 splits), so the
// per-split work must not be a chain of dependent loads: the threads reduce the lse values
// together (max, then the sum of weights), stage the weights in shared memory, and read
// the partial rows kUnroll at a time, so that many loads are in flight per thread.
#pragma once
#include "mla_common.cuh"

namespace mlagen {
namespace hopper {

constexpr int kCombineThreads = kDV / 4;
constexpr int kCombineWarps = kCombineThreads / 32;
constexpr int kCombineChunk = 64;    // weights staged in shared memory at a time
constexpr int kCombineUnroll = 8;    // partial rows read per step

template <bool kMax>
__device__ __forceinline__ float combine_block_reduce(float v, float* red) {
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, off);
    v = kMax ? fmaxf(v, o) : v + o;
  }
  __syncthreads();   // red is free (an earlier reduction has been read)
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  v = red[0];
#pragma unroll
  for (int w = 1; w < kCombineWarps; ++w) v = kMax ? fmaxf(v, red[w]) : v + red[w];
  return v;
}

template <typename T>
__global__ void __launch_bounds__(kCombineThreads)
mla_combine_kernel(const __grid_constant__ MlaParams p) {
  __shared__ float w_sh[kCombineChunk];
  __shared__ float red[kCombineWarps];
  const int req = blockIdx.x, gr = blockIdx.y, tid = threadIdx.x;
  // num_splits comes from the scheduler, which finished before the split kernel began
  const int first = p.num_splits[req], n = p.num_splits[req + 1] - first;
  // every CTA waits for the split grid, even one with nothing to do: the next kernel in the
  // stream then follows both grids, and may read what the split wrote straight to out
  pdl_wait_primary();
  if (n <= 1) return;
  const int rows_total = p.s_q * p.h_q;
  const float* lse_col = p.lse_acc + static_cast<int64_t>(first) * rows_total + gr;

  float mx = -INFINITY;
  bool nan = false;
  for (int i = tid; i < n; i += kCombineThreads) {
    const float v = lse_col[static_cast<int64_t>(i) * rows_total];
    nan |= v != v;
    mx = fmaxf(mx, v);
  }
  nan = __syncthreads_or(nan);
  mx = combine_block_reduce<true>(mx, red);
  const bool live = mx != -INFINITY && !nan;

  float sum = 0.f;
  if (live)
    for (int i = tid; i < n; i += kCombineThreads)
      sum += kFault == kFaultBadSplitMerge
                 ? 1.f : __expf(lse_col[static_cast<int64_t>(i) * rows_total] - mx);
  sum = combine_block_reduce<false>(sum, red);

  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  const int col = tid * 4;
  if (live) {
    for (int c0 = 0; c0 < n; c0 += kCombineChunk) {
      const int cn = min(kCombineChunk, n - c0);
      __syncthreads();   // the previous chunk's weights have been used
      for (int i = tid; i < cn; i += kCombineThreads)
        w_sh[i] = kFault == kFaultBadSplitMerge
                      ? 1.f : __expf(lse_col[static_cast<int64_t>(c0 + i) * rows_total] - mx);
      __syncthreads();
      const float* o = p.o_acc + (static_cast<int64_t>(first + c0) * rows_total + gr) * kDV + col;
      const int64_t step = static_cast<int64_t>(rows_total) * kDV;
      for (int i0 = 0; i0 < cn; i0 += kCombineUnroll) {
        float4 v[kCombineUnroll];
        float w[kCombineUnroll];
#pragma unroll
        for (int u = 0; u < kCombineUnroll; ++u) {
          // an empty split (o = 0, lse = -inf, weight 0) is not read
          w[u] = i0 + u < cn ? w_sh[i0 + u] : 0.f;
          v[u] = w[u] != 0.f ? *reinterpret_cast<const float4*>(o + (i0 + u) * step)
                             : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int u = 0; u < kCombineUnroll; ++u) {
          acc.x += w[u] * v[u].x;
          acc.y += w[u] * v[u].y;
          acc.z += w[u] * v[u].z;
          acc.w += w[u] * v[u].w;
        }
      }
    }
  }
  const float inv = nan ? NAN : (sum > 0.f ? 1.f / sum : 0.f);
  using P2 = typename Pair<T>::type;
  P2* out = reinterpret_cast<P2*>(static_cast<T*>(p.out) +
                                  (static_cast<int64_t>(req) * rows_total + gr) * kDV + col);
  out[0] = Pair<T>::make(acc.x * inv, acc.y * inv);
  out[1] = Pair<T>::make(acc.z * inv, acc.w * inv);
  if (tid == 0) {
    const int s = gr / p.h_q, h = gr % p.h_q;
    p.lse[(static_cast<int64_t>(req) * p.h_q + h) * p.s_q + s] =
        nan ? NAN : (sum > 0.f ? mx + logf(sum) : INFINITY);
  }
}

template <typename T>
cudaError_t launch_combine_impl(const MlaParams& p, cudaStream_t stream) {
  // launched as a programmatic dependent of the split kernel (PDL): its launch overlaps
  // the split's tail instead of following it
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(p.batch, p.s_q * p.h_q);
  cfg.blockDim = dim3(kCombineThreads);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, mla_combine_kernel<T>, p);
}

}  // namespace hopper
}  // namespace mlagen
