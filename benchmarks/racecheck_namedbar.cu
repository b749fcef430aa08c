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
//   quad     the 64-row kernel's alpha exchange: WG1's quad leaders write one float a quad
//            row (lane % 4 == 0 alone), barrier.sync 2, 256; all four lanes of WG0's
//            matching quad read it; barrier.sync 3, 256 before the next write: race-free
//   kshape   quad inside the 64-row kernel's shape: 384 threads, setmaxnreg, one producer
//            lane spinning on an mbarrier the consumers arrive on, the others of its
//            warpgroup gone, WG1's own barrier 1 (128, barrier.red.or) between rounds
//   kwait    kshape with the kernel's K handshake: the producer lane completes a `full`
//            mbarrier each round that both consumer warpgroups wait on first, and waits on
//            an `empty` one their lanes 0 arrive on
//   kfence   kshape with fence.proxy.async between WG1's alpha stores and the barrier (the
//            kernel fences its P stores for wgmma there)
//   kwgmma   kshape with one wgmma (m64n64k16, both operands in shared memory) issued and
//            waited for by each consumer warpgroup every round, before the exchange
//   kbulk    kwait with the `full` mbarrier completed by a bulk copy's transaction count
//            (cp.async.bulk global -> shared, as the kernel's TMA loads complete theirs)
//   kstage   kshape with the 64-row kernel's epilogue after each round's exchange: every
//            consumer warp stages 16 rows in its own 2 KiB of `tiles` (stmatrix, as store_o's
//            direct path), fence.proxy.async, __syncwarp, lanes < 16 bulk-copy a row to
//            global, commit, wait for the reads; the next round's barrier 3 then orders
//            WG0's alpha reads before WG1's next writes, as the kernel's second EPI barrier
//   kstage32 kstage with st.shared.v2.f32 staging (store_o's partial path)
//   kstagenb kstage without the bulk copies (stores to shared memory only)
//   wg3      the few-rows kernel's shape: 384 threads, setmaxnreg (consumers up, the producer
//            warpgroup down, its other warps gone), each consumer warpgroup's own barrier
//            (1 + wg, 128 threads) around a per-warpgroup exchange, then barrier 3 (256)
//            between WG1's slab write and WG0's read: race-free
// Build + run: nvcc -gencode=arch=compute_90a,code=sm_90a -lineinfo -o rc racecheck_namedbar.cu && ./rc MODE
//              compute-sanitizer --tool racecheck ./rc MODE
#include <cstdio>
#include <cstring>

#include "../templates/hopper/include/mla_sm90.cuh"
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
// alpha as the 64-row kernel exchanges it (modes quad and kshape)
__device__ __forceinline__ void mwait(unsigned mb, unsigned parity) {
  unsigned done = 0;
  while (!done)
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 " selp.u32 %0, 1, 0, p;\n}\n" : "=r"(done) : "r"(mb), "r"(parity) : "memory");
}
// VAR: 0 kshape, 1 kwait, 2 kfence, 3 kwgmma, 4 kbulk, 5 kstage, 6 kstage32,
// 7 kstagenb
template <bool SHAPE, int VAR = 0>
__global__ void __launch_bounds__(384, 1) kq(float* out) {
  __shared__ float alpha[64];
  __shared__ __align__(8) unsigned long long mbar;
  __shared__ __align__(8) unsigned long long fullb;
  __shared__ __align__(1024) unsigned char tiles[2 * 8192];   // kwgmma: A, B; kbulk: target
  const int t = threadIdx.x, wg = t / 128, lane = t % 32, warp = (t % 128) / 32;
  const int r0 = warp * 16 + lane / 4;
  const unsigned mb = static_cast<unsigned>(__cvta_generic_to_shared(&mbar));
  const unsigned fb = static_cast<unsigned>(__cvta_generic_to_shared(&fullb));
  for (int i = t; i < 2 * 8192 / 16; i += 384) mlagen::hopper::sm90::st_shared_zero16(
      mlagen::hopper::sm90::smem_addr(tiles) + 16 * i);
  mlagen::hopper::sm90::fence_proxy_async();
  if (SHAPE && t == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(mb), "r"(8));
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(fb), "r"(1));
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (wg == 2) {
    if (!SHAPE) return;
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
    if (t != 256) return;
    for (int r = 0; r < 8; ++r) {   // the producer: waits for each round's 8 consumer warps
      if (VAR == 1) {
        if (r > 0) mwait(mb, (r - 1) & 1);
        asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(fb) : "memory");
      } else if (VAR == 4) {   // 4 KiB of `out` into tiles, completing `full` by its bytes
        if (r > 0) mwait(mb, (r - 1) & 1);
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
                     ::"r"(fb), "r"(4096) : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                     " [%0], [%1], %2, [%3];\n"
                     ::"r"(mlagen::hopper::sm90::smem_addr(tiles)), "l"(out), "r"(4096), "r"(fb)
                     : "memory");
      } else {
        mwait(mb, r & 1);
      }
    }
    if (VAR == 1 || VAR == 4) mwait(mb, 1);
    return;
  }
  if (SHAPE) asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
  float acc = 0.f;
  for (int r = 0; r < 8; ++r) {
    if (VAR == 1 || VAR == 4) mwait(fb, r & 1);
    if (VAR == 3) {   // a wgmma of this warpgroup on the zero tiles, waited for
      namespace sm90 = mlagen::hopper::sm90;
      float d[32];
      const uint32_t a = sm90::smem_addr(tiles);
      sm90::wgmma_fence();
      sm90::wgmma_m64n64k16_ss_first<__nv_bfloat16>(d, sm90::desc_sw128(a, 16, 1024),
                                                    sm90::desc_sw128(a + 8192, 16, 1024));
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
      sm90::reg_fence(d);
      acc += 0.f * d[0];
    }
    if (r > 0) bsync(3, 256);
    if (wg == 1 && lane % 4 == 0) {
      alpha[r0] = r + 0.5f * r0;
      alpha[r0 + 8] = r + 0.5f * (r0 + 8);
    }
    if (VAR == 2 && wg == 1) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    if (SHAPE && wg == 1) {
      unsigned v;
      asm volatile("{\n .reg .pred p, q;\n setp.ne.u32 q, %1, 0;\n barrier.red.or.pred p, 1, 128, q;\n"
                   " selp.u32 %0, 1, 0, p;\n}\n" : "=r"(v) : "r"(static_cast<unsigned>(lane == 3)) : "memory");
      acc += 0.f * v;
    }
    bsync(2, 256);
    if (wg == 0) acc += alpha[r0] + alpha[r0 + 8];
    if (VAR >= 5) {   // store_o's shape: stage, fence, __syncwarp, bulk copies out
      namespace sm90 = mlagen::hopper::sm90;
      const uint32_t buf = sm90::smem_addr(tiles) + (wg * 4 + warp) * 2048;
      if (VAR == 6) {
        for (int j = 0; j < 4; ++j)
          sm90::st_shared_v2_f32(buf + (lane >> 2) * 128 + (lane & 3) * 8 + j * 32, r, t);
      } else {
        const uint32_t a = buf + (lane & 15) * 128 + (lane >> 4) * 16;
        for (int j = 0; j < 4; ++j)
          sm90::stmatrix_x4(a + j * 32, r, t, j, lane);
      }
      sm90::fence_proxy_async();
      __syncwarp();
      if (VAR != 7 && lane < 16)   // 16 bytes a lane into out's second half
        sm90::bulk_store(out + 512 + ((wg * 4 + warp) * 16 + lane) * 4, buf + lane * 128, 16);
      sm90::bulk_commit();
      sm90::bulk_wait_read();
    }
    if (SHAPE && lane == 0)
      asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(mb) : "memory");
  }
  bsync(3, 256);
  if (wg == 0 && lane % 4 == 0) out[r0] = acc;
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
  cudaMalloc(&out, 1024 * sizeof(float));   // 4 KiB: kbulk copies that much
  if (!strcmp(m, "ctrl")) k<0><<<4, 288>>>(out);
  else if (!strcmp(m, "named")) k<1><<<4, 288>>>(out);
  else if (!strcmp(m, "arrive")) k<2><<<4, 288>>>(out);
  else if (!strcmp(m, "wg3")) k3<<<4, 384>>>(out);
  else if (!strcmp(m, "quad") || !strcmp(m, "kshape") || !strcmp(m, "kwait") ||
           !strcmp(m, "kfence") || !strcmp(m, "kwgmma") || !strcmp(m, "kbulk") ||
           !strcmp(m, "kstage") || !strcmp(m, "kstage32") || !strcmp(m, "kstagenb")) {
    if (!strcmp(m, "quad")) kq<false><<<4, 384>>>(out);
    else if (!strcmp(m, "kwait")) kq<true, 1><<<4, 384>>>(out);
    else if (!strcmp(m, "kfence")) kq<true, 2><<<4, 384>>>(out);
    else if (!strcmp(m, "kwgmma")) kq<true, 3><<<4, 384>>>(out);
    else if (!strcmp(m, "kbulk")) kq<true, 4><<<4, 384>>>(out);
    else if (!strcmp(m, "kstage")) kq<true, 5><<<4, 384>>>(out);
    else if (!strcmp(m, "kstage32")) kq<true, 6><<<4, 384>>>(out);
    else if (!strcmp(m, "kstagenb")) kq<true, 7><<<4, 384>>>(out);
    else kq<true><<<4, 384>>>(out);
    float h[128];
    cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost);
    int bad = 0;   // WG0 row r0 (lane % 4 == 0): sum over r of 2r + 0.5 (2 r0 + 8)
    for (int w = 0; w < 4; ++w)
      for (int q = 0; q < 8; ++q) {
        const int r0 = w * 16 + q;
        double want = 0;
        for (int r = 0; r < 8; ++r) want += 2 * r + 0.5 * (2 * r0 + 8);
        bad += h[r0] != (float)want;
      }
    printf("%s: %s (%s)\n", m, bad ? "WRONG" : "values ok", cudaGetErrorString(cudaGetLastError()));
    return 0;
  }
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
