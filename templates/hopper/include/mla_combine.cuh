// The combine kernel: merges the partial results of requests that were split (fp32, or
// fp16 with a scale per half-row: kHalf).
//   out = sum_i w_i o_i,  w_i = exp(lse_i - max) / sum_j exp(lse_j - max),
//   lse = max + log(sum_j exp(lse_j - max))
// One warp per query row, up to kCombineRows rows per CTA (grid: request x row groups; fewer
// rows per CTA when the grid would not fill the GPU), launched with programmatic dependent
// launch after the split kernel.  Requests with one split were
// written by the split kernel; their CTAs return at once.  No visible key in any split
// (every lse_i = -inf) gives out = 0 and lse = +inf; a NaN lse (bad block table) gives NaN.
//
// A small batch splits each request many ways (b = 1 over 132 SMs: ~64 splits) and the
// partials were just written (L2), so the cost is latency, not bytes: a warp needs no
// block-wide barrier (max and sum are shuffles), reads each lse twice at most, hands the
// weights to its lanes by shuffle, and keeps kCombineUnroll splits x 4 float4 loads in flight
// per lane, the first step's issued beside the lse loads (graph rows b8 h_q 16 1.055x, b1
// 1.029x: docs/hopper.md step 36).  Measured on the graph rows
// (5569878:benchmarks/hopper_split_probe.py, H200): a CTA of 128 threads per row with two block
// reductions and three dependent rounds of loads took 5-18 us; one warp per row, 8 rows per
// CTA, 5.4-10.2 us but 15 us at b = 1 (16 CTAs for 65 splits) and still 13.8 us on 128
// one-warp CTAs with 4 splits in flight, hence fewer rows per CTA for small grids and 8 splits
// in flight; four warps per row (a float4 each) took 13-34 us.
#pragma once
#include "mla_common.cuh"

namespace mlagen {
namespace hopper {

constexpr int kCombineRows = 8;                    // query rows (warps) per CTA, at most
constexpr int kCombineThreads = 32 * kCombineRows;
constexpr int kCombineVec = kDV / 128;             // float4 per lane: columns 4 lane + 128 j
// Splits read per step (divides 32): 8 while few rows share the GPU (many splits each, the
// latency of one row is the cost), 2 once the grid keeps CTAs of 4 or 8 rows (at least twice
// as many as SMs: batch x s_q x h_q >= 8 x SMs, e.g. b >= 16 at h_q = 128, b = 128 at
// h_q = 16).  8 splits x 4 float4 in flight take ~200 registers, one 8-warp CTA an SM: a
// b = 64, h_q = 128 combine then took 19.7 us (ncu), FlashMLA's 12.2 us at 40 registers.
// With 2 (78 registers) three 8-warp CTAs fit an SM: graph rows b = 64 and b = 32 1.095x; 4
// splits at two CTAs an SM, 1.08x; at 4 rows a CTA (b = 16, s_q = 2, h_q = 64) 1.03-1.06x.
constexpr int kCombineUnrollFew = 8, kCombineUnrollMany = 2;
// (fp16 partials, 8 splits: two CTAs an SM holds it at the 128 registers it took before its
// first step's loads moved above the lse reduction)
template <int kUnroll, bool kHalf>
constexpr int combine_min_blocks() { return kUnroll >= 8 ? (kHalf ? 2 : 1) : 3; }

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

// The four partial values of a lane at one split: fp32 (a float4), or fp16 (a uint2) whose
// half-row scale the weight carries (kHalf: the 64-row wgmma kernel's partials).
template <bool kHalf>
struct PartialVec { using type = float4; };
template <>
struct PartialVec<true> { using type = uint2; };

__device__ __forceinline__ float4 partial_values(float4 v) { return v; }
__device__ __forceinline__ float4 partial_values(uint2 v) {
  const float2 a = unpack_half2(v.x), b = unpack_half2(v.y);
  return make_float4(a.x, a.y, b.x, b.y);
}

template <typename T, int kCombineUnroll, bool kHalf>
__global__ void __launch_bounds__(kCombineThreads, combine_min_blocks<kCombineUnroll, kHalf>())
mla_combine_kernel(const __grid_constant__ MlaParams p) {
  static_assert(32 % kCombineUnroll == 0, "a step never crosses a 32-split chunk");
  const int req = blockIdx.x, lane = threadIdx.x % 32;
  const int gr = blockIdx.y * (blockDim.x / 32) + threadIdx.x / 32;
  const int rows_total = p.s_q * p.h_q;
  // num_splits comes from the scheduler, which finished before the split kernel began
  const int first = p.num_splits[req], n = p.num_splits[req + 1] - first;
  // every CTA waits for the split grid, even one with nothing to do: the next kernel in the
  // stream then follows both grids, and may read what the split wrote straight to out
  pdl_wait_primary();
  // whole warps leave (n and gr are warp-uniform): the shuffles below see full warps
  if (n <= 1 || gr >= rows_total) return;
  const float* lse_col = p.lse_acc + static_cast<int64_t>(first) * rows_total + gr;

  using Vec = typename PartialVec<kHalf>::type;
  const int64_t step = static_cast<int64_t>(rows_total) * kDV;
  const int64_t row0 = static_cast<int64_t>(first) * rows_total + gr;   // the first slot's row
  // fp16 partials fill the first half of o_acc's floats (mla_common.cuh)
  const Vec* o0 = reinterpret_cast<const Vec*>(
      kHalf ? reinterpret_cast<const char*>(p.o_acc) + (row0 * kDV + 4 * lane) * 2
            : reinterpret_cast<const char*>(p.o_acc + row0 * kDV + 4 * lane));
  // one step's partials (and fp16 scales): splits k0 .. k0 + kCombineUnroll - 1 that exist,
  // loaded whatever their weight (an empty split's slot is read and then not used)
  Vec v[kCombineUnroll][kCombineVec];
  float2 sc[kCombineUnroll];
  auto load_step = [&](int k0) {
#pragma unroll
    for (int u = 0; u < kCombineUnroll; ++u) {
      const int64_t k = k0 + u;
      sc[u] = make_float2(1.f, 1.f);
      if (k < n) {
        if (kHalf)
          sc[u] = *reinterpret_cast<const float2*>(p.o_scale + (row0 + k * rows_total) * 2);
        const Vec* o = o0 + k * (step / 4);
#pragma unroll
        for (int j = 0; j < kCombineVec; ++j) v[u][j] = o[32 * j];
      }
    }
  };
  // the first step's loads go out beside the lse loads: one L2 round trip before the sums,
  // not two (the weights need the lse, the loads do not)
  load_step(0);

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

  float4 acc[kCombineVec];
#pragma unroll
  for (int j = 0; j < kCombineVec; ++j) acc[j] = make_float4(0.f, 0.f, 0.f, 0.f);
  float sum = 0.f;
  if (live) {
    for (int c0 = 0; c0 < n; c0 += 32) {
      // lane l holds the weight of split c0 + l (0 past the end)
      const int i = c0 + lane;
      const float wl = i < n ? (kFault == kFaultBadSplitMerge
                                    ? 1.f : __expf(lse_col[static_cast<int64_t>(i) * rows_total] - mx))
                             : 0.f;
      sum += wl;
      const int cn = min(32, n - c0);
      for (int u0 = 0; u0 < cn; u0 += kCombineUnroll) {
        if (c0 + u0 > 0) load_step(c0 + u0);
#pragma unroll
        for (int u = 0; u < kCombineUnroll; ++u) {
          const float wu = __shfl_sync(0xffffffffu, wl, u0 + u);
          // an empty split (lse = -inf, weight 0; its slot may hold anything) and a step
          // past the end add nothing (wu is warp-uniform)
          if (wu == 0.f) continue;
          const float2 w = make_float2(wu * sc[u].x, wu * sc[u].y);   // per 256-column half
#pragma unroll
          for (int j = 0; j < kCombineVec; ++j) {
            const float4 x = partial_values(v[u][j]);
            const float wj = j < kCombineVec / 2 ? w.x : w.y;
            acc[j].x += wj * x.x;
            acc[j].y += wj * x.y;
            acc[j].z += wj * x.z;
            acc[j].w += wj * x.w;
          }
        }
      }
    }
    sum = warp_sum(sum);
  }
  const float lse = nan ? NAN : (sum > 0.f ? mx + logf(sum) : INFINITY);
  const float keep = p.sink != nullptr ? sink_keep(lse, p.sink[gr % p.h_q]) : 1.f;
  const float inv = nan ? NAN : (sum > 0.f ? keep / sum : 0.f);
  using P2 = typename Pair<T>::type;
  T* out = static_cast<T*>(p.out) + (static_cast<int64_t>(req) * rows_total + gr) * kDV + 4 * lane;
#pragma unroll
  for (int j = 0; j < kCombineVec; ++j) {
    P2* o2 = reinterpret_cast<P2*>(out + 128 * j);
    o2[0] = Pair<T>::make(acc[j].x * inv, acc[j].y * inv);
    o2[1] = Pair<T>::make(acc[j].z * inv, acc[j].w * inv);
  }
  if (lane == 0) {
    const int s = gr / p.h_q, h = gr % p.h_q;
    p.lse[(static_cast<int64_t>(req) * p.h_q + h) * p.s_q + s] = lse;
  }
}

template <typename T, bool kHalf>
cudaError_t launch_combine_impl(const MlaParams& p, cudaStream_t stream) {
  // launched as a programmatic dependent of the split kernel (PDL): its launch overlaps
  // the split's tail instead of following it
  // rows per CTA: kCombineRows, halved while the grid would be under `fill` CTAs, those
  // that fill the device twice (264 on an H100/H200's 132 SMs)
  const int rows_total = p.s_q * p.h_q;
  const long long fill = 2LL * p.num_sms;
  int rows = kCombineRows;
  while (rows > 1 && static_cast<long long>(p.batch) * rows_total < fill * rows) rows /= 2;
  const dim3 grid(p.batch, (rows_total + rows - 1) / rows);
  // 4 or 8 rows a CTA are kept only when the grid has at least `fill` CTAs of them (batch x
  // rows >= 8 x SMs): the 2-split instance then (the 8-split one fits one 8-warp CTA an SM)
  if (rows >= kCombineRows / 2)
    return launch_dependent(mla_combine_kernel<T, kCombineUnrollMany, kHalf>, grid, 32 * rows,
                            0, stream, 1, p);
  return launch_dependent(mla_combine_kernel<T, kCombineUnrollFew, kHalf>, grid, 32 * rows, 0,
                          stream, 1, p);
}

}  // namespace hopper
}  // namespace mlagen
