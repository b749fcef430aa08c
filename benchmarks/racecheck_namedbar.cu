// Does compute-sanitizer racecheck model named barriers with a thread count?  Four kernels,
// 288 threads (two warpgroups + one idle "producer" warp, like the wgmma kernels): warpgroup 1
// writes a shared slab, warpgroup 0 reads it, 8 rounds.
//   ctrl     __syncthreads between the write and the read (all 288 threads): race-free
//   named    barrier.sync 3, 256 on both sides (the idle warp not in it): race-free
//   arrive   producer/consumer pair: WG1 barrier.arrive 4 after writing, WG0 barrier.sync 4
//            before reading; WG0 barrier.arrive 5 after reading, WG1 barrier.sync 5 before
//            the next write: race-free
//   racy     no barrier between the write and the read: a real race (racecheck must say so)
//   diverge  named, but each quad's values written by its lane % 4 == 0 alone (as the wgmma
//            kernel writes alpha and the row sums) before barrier.sync: race-free.  The
//            64-row kernel's 16 racecheck hazards are of this kind only, and stay with every
//            barrier.arrive made a sync (benchmarks/results/s15/v6_racecheck_allsync)
//   diverge_sw  the same with __syncwarp() between the stores and the barrier
//   wg3      the few-rows kernel's shape: 384 threads, setmaxnreg (consumers up, the producer
//            warpgroup down, its other warps gone), each consumer warpgroup's own barrier
//            (1 + wg, 128 threads) around a per-warpgroup exchange, then barrier 3 (256)
//            between WG1's slab write and WG0's read: race-free
// Build + run: nvcc -gencode=arch=compute_90a,code=sm_90a -lineinfo -o rc racecheck_namedbar.cu && ./rc MODE
//              compute-sanitizer --tool racecheck ./rc MODE
#include <cstdio>
#include <cstring>
__device__ __forceinline__ void bsync(int id, int n) {
  asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void barrive(int id, int n) {
  asm volatile("barrier.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
template <int MODE>
__global__ void __launch_bounds__(288) k(float* out) {
  __shared__ float slab[128 * 8];
  const int t = threadIdx.x, wg = t / 128;
  float acc = 0.f;
  for (int r = 0; r < 8; ++r) {
    if (MODE == 2 && wg == 1 && r > 0) bsync(5, 256);
    if (wg == 1 && MODE < 4)
      for (int i = 0; i < 8; ++i) slab[i * 128 + (t - 128)] = r * 1000 + i + t;
    if (wg == 1 && MODE >= 4 && t % 4 == 0)
      for (int i = 0; i < 8; ++i)
        for (int j = 0; j < 4; ++j) slab[i * 128 + (t - 128) + j] = r * 1000 + i + t + j;
    if (MODE == 5) __syncwarp();
    if (MODE == 0) __syncthreads();
    if ((MODE == 1 || MODE >= 4) && wg < 2) bsync(3, 256);
    if (MODE == 2 && wg == 1) barrive(4, 256);
    if (MODE == 2 && wg == 0) bsync(4, 256);
    if (wg == 0)
      for (int i = 0; i < 8; ++i) acc += slab[i * 128 + t];
    if (MODE == 0) __syncthreads();
    if ((MODE == 1 || MODE >= 4) && wg < 2) bsync(3, 256);
    if (MODE == 2 && wg == 0 && r < 7) barrive(5, 256);
  }
  if (wg == 0) out[t] = acc;
}
// the few-rows kernel's barrier shape (mode wg3)
__global__ void __launch_bounds__(384, 1) k3(float* out) {
  __shared__ float slab[128 * 8];
  __shared__ float red[2][4];
  const int t = threadIdx.x, wg = t / 128, lane = t % 32, warp = (t % 128) / 32;
  if (wg == 2) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
  float acc = 0.f;
  for (int r = 0; r < 8; ++r) {
    if (lane == 0) red[wg][warp] = r + warp;   // a per-warpgroup exchange
    bsync(1 + wg, 128);
    const float x = red[wg][0] + red[wg][1] + red[wg][2] + red[wg][3];
    bsync(1 + wg, 128);
    if (wg == 1)
      for (int i = 0; i < 8; ++i) slab[i * 128 + (t - 128)] = r * 1000 + i + t + 0.f * x;
    bsync(3, 256);
    if (wg == 0)
      for (int i = 0; i < 8; ++i) acc += slab[i * 128 + t];
    bsync(3, 256);
  }
  if (wg == 0) out[t] = acc;
}
int main(int argc, char** argv) {
  const char* m = argc > 1 ? argv[1] : "named";
  float* out;
  cudaMalloc(&out, 128 * sizeof(float));
  if (!strcmp(m, "ctrl")) k<0><<<4, 288>>>(out);
  else if (!strcmp(m, "named")) k<1><<<4, 288>>>(out);
  else if (!strcmp(m, "arrive")) k<2><<<4, 288>>>(out);
  else if (!strcmp(m, "wg3")) k3<<<4, 384>>>(out);
  else if (!strcmp(m, "diverge")) k<4><<<4, 288>>>(out);
  else if (!strcmp(m, "diverge_sw")) k<5><<<4, 288>>>(out);
  else k<3><<<4, 288>>>(out);
  float h[128];
  cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost);
  // every round r of WG0 thread t sums r*1000 + i + (t + 128) over i < 8
  double want = 0;
  for (int r = 0; r < 8; ++r)
    for (int i = 0; i < 8; ++i) want += r * 1000 + i + 128;
  int bad = 0;
  for (int t = 0; t < 128; ++t) bad += h[t] != (float)(want + 64 * t);
  printf("%s: %s (%s)\n", m, bad ? "WRONG" : "values ok", cudaGetErrorString(cudaGetLastError()));
  return 0;
}
