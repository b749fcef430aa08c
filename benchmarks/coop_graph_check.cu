// Can a cooperative launch (cudaLaunchAttributeCooperative, grid.sync) be captured into a
// CUDA graph and replayed, as the fused combine would need?  Prints one line; exit 0 = yes.
//   nvcc -gencode=arch=compute_90a,code=sm_90a -o /tmp/coop benchmarks/coop_graph_check.cu
#include <cooperative_groups.h>
#include <cstdio>

__global__ void step(int* x, int n) {
  x[blockIdx.x] += 1;
  cooperative_groups::this_grid().sync();
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    int s = 0;
    for (int i = 0; i < n; ++i) s += x[i];
    x[n] = s;   // every block's increment is visible after the grid sync
  }
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  int* x;
  cudaMalloc(&x, (sms + 1) * sizeof(int));
  cudaMemset(x, 0, (sms + 1) * sizeof(int));
  cudaStream_t s;
  cudaStreamCreate(&s);
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(sms);
  cfg.blockDim = dim3(384);
  cfg.stream = s;
  cudaLaunchAttribute a[1];
  a[0].id = cudaLaunchAttributeCooperative;
  a[0].val.cooperative = 1;
  cfg.attrs = a;
  cfg.numAttrs = 1;
  cudaGraph_t g;
  cudaGraphExec_t ge;
  cudaError_t e = cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  for (int i = 0; i < 3 && e == cudaSuccess; ++i) e = cudaLaunchKernelEx(&cfg, step, x, sms);
  cudaError_t e2 = cudaStreamEndCapture(s, &g);
  if (e != cudaSuccess || e2 != cudaSuccess) {
    printf("capture: %s / %s\n", cudaGetErrorString(e), cudaGetErrorString(e2));
    return 1;
  }
  e = cudaGraphInstantiate(&ge, g, 0);
  for (int i = 0; i < 2 && e == cudaSuccess; ++i) e = cudaGraphLaunch(ge, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  int h[1];
  cudaMemcpy(h, x + sms, sizeof(int), cudaMemcpyDeviceToHost);
  printf("cooperative launch in a graph: %s, sum %d (want %d)\n", cudaGetErrorString(e), h[0],
         6 * sms);
  return e == cudaSuccess && h[0] == 6 * sms ? 0 : 1;
}
