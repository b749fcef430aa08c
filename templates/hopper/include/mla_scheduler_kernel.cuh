// The scheduler as one small GPU kernel: the threads count blocks in parallel into shared
// memory, then one thread walks the requests (plan_splits).  Launched with one CTA.
#pragma once
#include "mla_common.cuh"
#include "mla_scheduler.cuh"

namespace mlagen {
namespace hopper {

constexpr int kSchedThreads = 256;

__global__ void __launch_bounds__(kSchedThreads)
mla_scheduler_kernel(const int* seqlens, int batch, int parts, int fixed_cost,
                     int fixed_splits, int* sched, int* num_splits) {
  extern __shared__ int nblk[];
  for (int i = threadIdx.x; i < batch; i += blockDim.x) nblk[i] = sched_blocks(seqlens[i]);
  __syncthreads();
  if (threadIdx.x != 0) return;
  if (fixed_splits > 0)
    plan_fixed_splits(nblk, batch, fixed_splits, sched, num_splits);
  else
    plan_splits(nblk, batch, parts, fixed_cost, sched, num_splits);
}

inline cudaError_t launch_scheduler_impl(const int* seqlens, int batch, int parts,
                                         int fixed_cost, int fixed_splits, int* sched,
                                         int* num_splits, cudaStream_t stream) {
  const size_t smem = static_cast<size_t>(batch) * sizeof(int);
  if (smem > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(mla_scheduler_kernel,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  mla_scheduler_kernel<<<1, kSchedThreads, smem, stream>>>(seqlens, batch, parts, fixed_cost,
                                                           fixed_splits, sched, num_splits);
  return cudaGetLastError();
}

}  // namespace hopper
}  // namespace mlagen
