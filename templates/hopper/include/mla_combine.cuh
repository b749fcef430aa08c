// The combine kernel: merges the fp32 partial results of requests that were split.
//   out = sum_i w_i o_i,  w_i = exp(lse_i - max) / sum_j exp(lse_j - max),
//   lse = max + log(sum_j exp(lse_j - max))
// One CTA per (request, query row), 128 threads x 4 columns.  Requests with one split were
// written by the split kernel; their CTAs return at once.  No visible key in any split
// (every lse_i = -inf) gives out = 0 and lse = +inf; a NaN lse (bad block table) gives NaN.
#pragma once
#include "mla_common.cuh"

namespace mlagen {
namespace hopper {

constexpr int kCombineThreads = kDV / 4;

template <typename T>
__global__ void __launch_bounds__(kCombineThreads)
mla_combine_kernel(const __grid_constant__ MlaParams p) {
  const int req = blockIdx.x, gr = blockIdx.y;
  const int first = p.num_splits[req], n = p.num_splits[req + 1] - first;
  if (n <= 1) return;
  const int rows_total = p.s_q * p.h_q;
  float mx = -INFINITY;
  bool nan = false;
  for (int i = 0; i < n; ++i) {
    const float v = p.lse_acc[static_cast<int64_t>(first + i) * rows_total + gr];
    nan |= v != v;
    mx = fmaxf(mx, v);
  }
  float sum = 0.f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  const int col = threadIdx.x * 4;
  if (mx != -INFINITY && !nan) {
    for (int i = 0; i < n; ++i) {
      const int64_t row = static_cast<int64_t>(first + i) * rows_total + gr;
      const float w = __expf(p.lse_acc[row] - mx);
      if (w == 0.f) continue;   // an empty split (its o is 0 and its lse -inf)
      sum += w;
      const float4 o = *reinterpret_cast<const float4*>(p.o_acc + row * kDV + col);
      acc.x += w * o.x;
      acc.y += w * o.y;
      acc.z += w * o.z;
      acc.w += w * o.w;
    }
  }
  const float inv = nan ? NAN : (sum > 0.f ? 1.f / sum : 0.f);
  using P2 = typename Pair<T>::type;
  P2* out = reinterpret_cast<P2*>(static_cast<T*>(p.out) +
                                  (static_cast<int64_t>(req) * rows_total + gr) * kDV + col);
  out[0] = Pair<T>::make(acc.x * inv, acc.y * inv);
  out[1] = Pair<T>::make(acc.z * inv, acc.w * inv);
  if (threadIdx.x == 0) {
    const int s = gr / p.h_q, h = gr % p.h_q;
    p.lse[(static_cast<int64_t>(req) * p.h_q + h) * p.s_q + s] =
        nan ? NAN : (sum > 0.f ? mx + logf(sum) : INFINITY);
  }
}

template <typename T>
cudaError_t launch_combine_impl(const MlaParams& p, cudaStream_t stream) {
  dim3 grid(p.batch, p.s_q * p.h_q);
  mla_combine_kernel<T><<<grid, kCombineThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace hopper
}  // namespace mlagen
