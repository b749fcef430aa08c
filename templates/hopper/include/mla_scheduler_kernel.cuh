// The scheduler as one small GPU kernel (one CTA): the threads count each request's blocks
// and its cost, two block-wide prefix sums give every request's start (cum) and first
// split slot (num_splits), then each thread writes the metadata of its parts with
// plan_part's binary searches (or plan_chunk_part's, when whole requests win: one vote).
// No thread walks the batch or the parts alone.
#pragma once
#include "mla_common.cuh"
#include "mla_scheduler.cuh"

namespace mlagen {
namespace hopper {

constexpr int kSchedThreads = 512;
constexpr int kSchedWarps = kSchedThreads / 32;

// Exclusive prefix sum of one value per thread over the CTA; *total gets the sum of all.
__device__ __forceinline__ long long sched_block_scan(long long v, long long* warp_sums,
                                                      long long* total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  long long x = v;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const long long y = __shfl_up_sync(0xffffffffu, x, off);
    if (lane >= off) x += y;
  }
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  if (warp == 0) {
    long long w = lane < kSchedWarps ? warp_sums[lane] : 0;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const long long y = __shfl_up_sync(0xffffffffu, w, off);
      if (lane >= off) w += y;
    }
    if (lane < kSchedWarps) warp_sums[lane] = w;   // inclusive over warps
  }
  __syncthreads();
  const long long before = (warp > 0 ? warp_sums[warp - 1] : 0) + x - v;
  *total = warp_sums[kSchedWarps - 1];
  __syncthreads();   // warp_sums may be reused by the next scan
  return before;
}

// Shared memory: cum[batch + 1] (long long), then nblk[batch] (int).
__global__ void __launch_bounds__(kSchedThreads)
mla_scheduler_kernel(const int* seqlens, int batch, int parts, int fixed_cost,
                     int fixed_splits, int cluster, int* sched, int* num_splits) {
  extern __shared__ long long cum[];
  __shared__ long long warp_sums[kSchedWarps];
  int* nblk = reinterpret_cast<int*>(cum + batch + 1);
  const int tid = threadIdx.x;
  // each thread owns a contiguous chunk of requests, so the prefix sums are one scan
  const int chunk = (batch + kSchedThreads - 1) / kSchedThreads;
  const int i0 = min(tid * chunk, batch), i1 = min(i0 + chunk, batch);

  long long local = 0;
  for (int i = i0; i < i1; ++i) {
    nblk[i] = sched_blocks(seqlens[i]);
    local += nblk[i] + fixed_cost;
  }
  if (fixed_splits > 0) {
    __syncthreads();
    for (int r = tid; r < batch; r += kSchedThreads) {
      plan_fixed_request(nblk, r, fixed_splits, sched);
      num_splits[r + 1] = (r + 1) * fixed_splits;
    }
    if (tid == 0) num_splits[0] = 0;
    return;
  }
  long long total;
  long long c = sched_block_scan(local, warp_sums, &total);
  for (int i = i0; i < i1; ++i) {
    cum[i] = c;
    c += nblk[i] + fixed_cost;
  }
  if (tid == 0) cum[batch] = total;
  __syncthreads();
  const long long payload = sched_payload(total, parts);

  // equal pieces when the smallest piece that fits (bisection: a block-wide sum a step, the
  // same steps in every thread) is at most the payload + F (plan_splits)
  if (batch <= parts) {
    __shared__ int top;
    if (tid == 0) top = 1;
    __syncthreads();
    int mine = 1;
    for (int i = i0; i < i1; ++i) mine = max(mine, nblk[i]);
    atomicMax(&top, mine);
    __syncthreads();
    int lo = 1, hi = top;
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      long long n = 0, all;
      for (int i = i0; i < i1; ++i) n += sched_pieces(nblk[i], mid);
      sched_block_scan(n, warp_sums, &all);
      if (all <= parts) hi = mid; else lo = mid + 1;
    }
    if (lo <= payload + fixed_cost) {
      if (sched_cluster_fits(batch, parts, cluster, top, lo)) {   // the cluster plan
        if (tid == 0) num_splits[0] = 0;
        for (int r = tid; r < batch; r += kSchedThreads) {
          plan_fixed_request(nblk, r, cluster, sched, cluster);
          num_splits[r + 1] = r + 1;
        }
        for (int p = batch * cluster + tid; p < parts; p += kSchedThreads)
          plan_empty_part(batch, sched + p * kMetaInts);
        return;
      }
      long long n = 0, all;
      for (int i = i0; i < i1; ++i) n += sched_pieces(nblk[i], lo);
      long long first = sched_block_scan(n, warp_sums, &all);
      if (tid == 0) num_splits[0] = 0;
      for (int i = i0; i < i1; ++i) {
        plan_equal_request(nblk, i, first, lo, sched);
        first += sched_pieces(nblk[i], lo);
        num_splits[i + 1] = static_cast<int>(first);
      }
      for (long long p = all + tid; p < parts; p += kSchedThreads)
        plan_empty_part(batch, sched + p * kMetaInts);
      return;
    }
  }

  // whole requests when no chunk of k of them costs more than payload + F (plan_splits)
  const int k = (batch + parts - 1) / parts;
  bool too_big = false;
  for (int p = tid; p < parts; p += kSchedThreads)
    too_big = too_big || sched_chunk_too_big(cum, batch, k, p, payload, fixed_cost);
  if (!__syncthreads_or(too_big)) {
    if (tid == 0) num_splits[0] = 0;
    for (int r = tid; r < batch; r += kSchedThreads) num_splits[r + 1] = r + 1;
    for (int p = tid; p < parts; p += kSchedThreads)
      plan_chunk_part(nblk, batch, k, p, sched + p * kMetaInts);
    return;
  }

  long long splits = 0;
  for (int i = i0; i < i1; ++i) splits += sched_splits(cum, nblk, i, payload, fixed_cost);
  long long s = sched_block_scan(splits, warp_sums, &total);
  if (tid == 0) num_splits[0] = 0;
  for (int i = i0; i < i1; ++i) {
    s += sched_splits(cum, nblk, i, payload, fixed_cost);
    num_splits[i + 1] = static_cast<int>(s);
  }
  for (int p = tid; p < parts; p += kSchedThreads)
    plan_part(cum, nblk, batch, p, payload, fixed_cost, sched + p * kMetaInts);
}

// A sparse call's row lengths, one launch where the host took several torch ops: row r of
// the b * s_q flattened rows (sequence r / s_q) has min(topk_length[r / s_q], topk) main
// keys (topk where topk_length is null; negative stays negative, so the kernel flags the
// row), and with a second pool (extra_topk > 0) that count plus the extra list's likewise,
// -1 where either is negative; len1[r] the main count (mla_sparse.cuh SparseRow::split).
__global__ void mla_sparse_lengths_kernel(const int* topk_length, const int* extra_topk_length,
                                          int rows, int s_q, int topk, int extra_topk,
                                          int* lens, int* len1) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const int b = r / s_q;
  const int main = topk_length ? min(topk_length[b], topk) : topk;
  if (extra_topk == 0) {
    lens[r] = main;
    return;
  }
  const int extra = extra_topk_length ? min(extra_topk_length[b], extra_topk) : extra_topk;
  lens[r] = main < 0 || extra < 0 ? -1 : main + extra;
  len1[r] = main;
}

inline cudaError_t launch_sparse_lengths_impl(const int* topk_length,
                                              const int* extra_topk_length, int rows, int s_q,
                                              int topk, int extra_topk, int* lens, int* len1,
                                              cudaStream_t stream) {
  mla_sparse_lengths_kernel<<<(rows + 255) / 256, 256, 0, stream>>>(
      topk_length, extra_topk_length, rows, s_q, topk, extra_topk, lens, len1);
  return cudaGetLastError();
}

inline cudaError_t launch_scheduler_impl(const int* seqlens, int batch, int parts,
                                         int fixed_cost, int fixed_splits, int* sched,
                                         int* num_splits, cudaStream_t stream) {
  const size_t smem = static_cast<size_t>(batch + 1) * sizeof(long long) +
                      static_cast<size_t>(batch) * sizeof(int);
  if (smem > 48 * 1024) {
    static size_t raised = 48 * 1024;   // the attribute is set once per larger size
    if (smem > raised) {
      cudaError_t e = cudaFuncSetAttribute(mla_scheduler_kernel,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem));
      if (e != cudaSuccess) return e;
      raised = smem;
    }
  }
  // the cluster plan only where the split kernel will be launched in clusters of that size
  const int cluster = fixed_splits > 0 ? 1 : split_cluster(batch, parts);
  mla_scheduler_kernel<<<1, kSchedThreads, smem, stream>>>(
      seqlens, batch, parts, fixed_cost, fixed_splits, cluster, sched, num_splits);
  return cudaGetLastError();
}

}  // namespace hopper
}  // namespace mlagen
