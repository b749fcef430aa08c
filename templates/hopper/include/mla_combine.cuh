// The combine kernel: merges the fp32 partial results of requests that were split.
//   out = sum_i w_i o_i,  w_i = exp(lse_i - max) / sum_j exp(lse_j - max),
//   lse = max + log(sum_j exp(lse_j - max))
// One warp per (query row, 128 columns), kCombineRows rows per CTA (grid: request x row
// groups), launched with programmatic dependent launch after the split kernel.  Requests with one split were
// written by the split kernel; their CTAs return at once.  No visible key in any split
// (every lse_i = -inf) gives out = 0 and lse = +inf; a NaN lse (bad block table) gives NaN.
//
// A small batch splits each request many ways (b = 1 over 132 SMs: ~64 splits) and the
// partials were just written (L2), so the cost is latency, not bytes: a warp needs no
// block-wide barrier (max and sum are shuffles), reads each lse twice at most, hands the
// weights to its lanes by shuffle, and keeps kCombineUnroll float4 loads (one per split) in
// flight per lane; four warps share a row so that b = 1 still spreads over the SMs.
// (A CTA of 128 threads per row, with two block reductions and three dependent rounds of
// loads, took 5-18 us on the graph rows: benchmarks/hopper_split_probe.py; one warp per
// whole row took 15 us at b = 1, 65 splits, on 16 CTAs.)
#pragma once
#include "mla_common.cuh"

namespace mlagen {
namespace hopper {

constexpr int kCombineWarpsPerRow = kDV / 128;     // a warp: 32 lanes x one float4
constexpr int kCombineRows = 2;                    // query rows per CTA
constexpr int kCombineThreads = 32 * kCombineWarpsPerRow * kCombineRows;
constexpr int kCombineUnroll = 16;                 // splits read per step (divides 32)
static_assert(32 % kCombineUnroll == 0, "a step never crosses a 32-split chunk");

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

template <typename T>
__global__ void __launch_bounds__(kCombineThreads)
mla_combine_kernel(const __grid_constant__ MlaParams p) {
  const int req = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int gr = blockIdx.y * kCombineRows + warp / kCombineWarpsPerRow;
  const int col = (warp % kCombineWarpsPerRow) * 128 + 4 * lane;
  const int rows_total = p.s_q * p.h_q;
  // num_splits comes from the scheduler, which finished before the split kernel began
  const int first = p.num_splits[req], n = p.num_splits[req + 1] - first;
  // every CTA waits for the split grid, even one with nothing to do: the next kernel in the
  // stream then follows both grids, and may read what the split wrote straight to out
  pdl_wait_primary();
  // whole warps leave (n and gr are warp-uniform): the shuffles below see full warps
  if (n <= 1 || gr >= rows_total) return;
  const float* lse_col = p.lse_acc + static_cast<int64_t>(first) * rows_total + gr;

  float mx = -INFINITY;
  bool nan = false;
  for (int i = lane; i < n; i += 32) {
    const float v = lse_col[static_cast<int64_t>(i) * rows_total];
    nan |= v != v;
    mx = fmaxf(mx, v);
  }
  nan = __any_sync(0xffffffffu, nan);
  mx = warp_max(mx);
  const bool live = mx != -INFINITY && !nan;

  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  float sum = 0.f;
  if (live) {
    const int64_t step = static_cast<int64_t>(rows_total) * kDV;
    const float* o0 = p.o_acc + (static_cast<int64_t>(first) * rows_total + gr) * kDV + col;
    for (int c0 = 0; c0 < n; c0 += 32) {
      // lane l holds the weight of split c0 + l (0 past the end)
      const int i = c0 + lane;
      const float wl = i < n ? (kFault == kFaultBadSplitMerge
                                    ? 1.f : __expf(lse_col[static_cast<int64_t>(i) * rows_total] - mx))
                             : 0.f;
      sum += wl;
      const int cn = min(32, n - c0);
      for (int u0 = 0; u0 < cn; u0 += kCombineUnroll) {
        float w[kCombineUnroll];
        float4 v[kCombineUnroll];
#pragma unroll
        for (int u = 0; u < kCombineUnroll; ++u) {
          w[u] = __shfl_sync(0xffffffffu, wl, u0 + u);
          // an empty split (o = 0, lse = -inf, weight 0) and a step past the end are not read
          v[u] = w[u] != 0.f ? *reinterpret_cast<const float4*>(
                                   o0 + static_cast<int64_t>(c0 + u0 + u) * step)
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
    sum = warp_sum(sum);
  }
  const float inv = nan ? NAN : (sum > 0.f ? 1.f / sum : 0.f);
  using P2 = typename Pair<T>::type;
  P2* out = reinterpret_cast<P2*>(static_cast<T*>(p.out) +
                                  (static_cast<int64_t>(req) * rows_total + gr) * kDV + col);
  out[0] = Pair<T>::make(acc.x * inv, acc.y * inv);
  out[1] = Pair<T>::make(acc.z * inv, acc.w * inv);
  if (col == 0) {
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
  cfg.gridDim = dim3(p.batch, (p.s_q * p.h_q + kCombineRows - 1) / kCombineRows);
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
