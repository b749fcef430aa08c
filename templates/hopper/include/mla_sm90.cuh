// Thin wrappers over the sm_90a PTX the wgmma main loop uses: mbarriers, TMA tensor copies
// (cp.async.bulk.tensor), proxy fences, named barriers, setmaxnreg, and warpgroup MMAs
// (wgmma.mma_async) with shared-memory descriptors.  Raw PTX, no CUTLASS/CuTe: the JIT
// builds one variant in seconds.
//
// Shared-memory operands use the 128-byte swizzle everywhere: a tile is made of 8-row x
// 128-byte atoms (1024 bytes, 1024-aligned), 16-byte chunk c of row r stored at chunk
// c ^ (r % 8).  That is what TMA writes with CU_TENSOR_MAP_SWIZZLE_128B and what a wgmma
// descriptor with layout type 1 reads.
#pragma once
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <type_traits>

namespace mlagen {
namespace hopper {
namespace sm90 {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The dynamic shared memory rounded up to the 128-byte swizzle's 1024-byte atom (the
// kernels' kSmem carry 1024 bytes of slack for it).
__device__ __forceinline__ unsigned char* smem_align1024(unsigned char* raw) {
  return reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(raw) + 1023) &
                                          ~static_cast<uintptr_t>(1023));
}

// ---- mbarriers (64-bit, in shared memory) ----
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count));
}
__device__ __forceinline__ void fence_mbar_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// 16-byte cp.async (Ampere's LDGSTS) to a shared address, src_bytes 0 when !valid: the 16
// bytes are zero-filled and nothing is read (a sparse row's missing keys).
__device__ __forceinline__ void cp_async16_to(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0) : "memory");
}
// 8 bytes (.ca: .cg copies 16 alone), zero-filled where !valid.
__device__ __forceinline__ void cp_async8_to(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 8 : 0) : "memory");
}
// An arrival on bar once this thread's cp.async copies so far have landed; .noinc: the
// barrier's count includes this arrival (mbar_init counts the arriving threads).
__device__ __forceinline__ void cp_async_mbar_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar))
               : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
               ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
// Wait until the phase with parity `parity` of the barrier has completed.  CLUSTER: acquire
// at cluster scope what another CTA's arrivals released (mbar_arrive_cluster).
template <bool CLUSTER = false>
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  const uint32_t a = smem_addr(bar);
  uint32_t done = 0;
  do {
    if constexpr (CLUSTER)
      asm volatile(
          "{\n .reg .pred p;\n"
          " mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
          " selp.u32 %0, 1, 0, p;\n}\n"
          : "=r"(done) : "r"(a), "r"(parity) : "memory");
    else
      asm volatile(
          "{\n .reg .pred p;\n"
          " mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
          " selp.u32 %0, 1, 0, p;\n}\n"
          : "=r"(done) : "r"(a), "r"(parity) : "memory");
  } while (!done);
}

// ---- thread-block clusters: distributed shared memory ----
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t cluster_nctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(r));
  return r;
}
// The shared::cluster address of this CTA's shared address `a` in CTA `rank` of the cluster.
__device__ __forceinline__ uint32_t mapa(uint32_t a, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(rank));
  return r;
}
// One arrival on another CTA's mbarrier (a shared::cluster address), releasing this
// thread's earlier writes (to that CTA's shared memory too) at cluster scope.
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t remote_bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n"
               ::"r"(remote_bar) : "memory");
}
// One arrival on another CTA's mbarrier with the default release at CTA scope: for a
// consumer letting go of a slice the other CTA's producer refills (its reads are done by
// then, wgmma_wait), where mbar_arrive_cluster's release at cluster scope costs a
// MEMBAR.ALL.GPU before each arrival (sm_90 SASS).
__device__ __forceinline__ void mbar_arrive_remote(uint32_t remote_bar) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(remote_bar) : "memory");
}
// The cluster barrier in two halves, each executed by every thread of every CTA of the
// cluster, converged (mbarrier inits before the arrive are visible after the wait).
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// `bytes` of this CTA's shared memory into another CTA's (dst and its mbarrier: shared::
// cluster addresses from mapa), completing there as transaction bytes on that mbarrier.
__device__ __forceinline__ void bulk_copy_cluster(uint32_t dst, uint32_t src, uint32_t bytes,
                                                  uint32_t remote_bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, "
      "[%3];\n" ::"r"(dst), "r"(src), "r"(bytes), "r"(remote_bar) : "memory");
}
__device__ __forceinline__ float2 ld_shared_v2_f32(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr) : "memory");
  return v;
}

// ---- TMA: a 3-D tile of a tensor map into shared memory, completing on an mbarrier ----
__device__ __forceinline__ void tma_load_3d(void* dst, const void* tmap, uint64_t* bar, int c0,
                                            int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];\n"
      ::"r"(smem_addr(dst)), "l"(tmap), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
__device__ __forceinline__ void tma_prefetch_desc(const void* tmap) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(tmap) : "memory");
}

__device__ __forceinline__ void st_shared_zero16(uint32_t addr) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(0) : "memory");
}

// Generic-proxy writes to shared memory (st.shared, cp.async) made visible to the async
// proxy (wgmma, TMA) of this CTA.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// ---- named barriers (id 0 is __syncthreads) ----
// The non-.aligned forms: a warp may reach them diverged (after `if (lane % 4 == 0)`
// stores); bar.sync / bar.arrive would count the whole warp at its first arriving lanes.
__device__ __forceinline__ void bar_sync(int id, int threads) {
  asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int threads) {
  asm volatile("barrier.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// barrier.sync that also ORs a predicate over the participating threads (the same memory
// ordering as bar_sync): every thread gets whether any thread's v was true.
__device__ __forceinline__ bool bar_sync_or(int id, int threads, bool v) {
  uint32_t r;
  asm volatile(
      "{\n .reg .pred p, q;\n"
      " setp.ne.u32 q, %1, 0;\n"
      " barrier.red.or.pred p, %2, %3, q;\n"
      " selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(r) : "r"(static_cast<uint32_t>(v)), "r"(id), "r"(threads) : "memory");
  return r != 0;
}

// ---- register reallocation between warpgroups ----
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

// ---- wgmma ----
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accesses of an accumulator register across the asm
// statements that issue or wait for wgmma (the registers are written asynchronously).
__device__ __forceinline__ void reg_fence(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void reg_fence(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }
template <int N>
__device__ __forceinline__ void reg_fence(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) reg_fence(r[i]);
}

// Shared-memory matrix descriptor, 128-byte swizzle.  K-major operands (rows of 64
// elements along K): lbo unused (16), sbo = 1024 (next 8 rows).  MN-major operands (V read
// as the B of P V, 64 columns of N per 128-byte row): lbo = the stride between 64-column
// atoms along N, sbo = 1024 (next 8 rows along K).
// Kept as its two 32-bit halves: lo = start address >> 4 | (lbo >> 4) << 16, hi = sbo >> 4 |
// the swizzle mode.  Stepping through a tile adds to lo alone: one integer add per wgmma
// operand instead of a mask, shift and or of each byte address (584 fewer SASS
// instructions in the 64-row kernel; 1.00-1.01x in time: hopper_l2policy_h200.md).  The
// start address is masked to the 18 bits of a CTA's shared window once, here: in a cluster
// launch the shared address of CTA rank k carries k << 24 (the cluster window), which
// unmasked would add to the lbo field (wrong V strides in every CTA of rank > 0).  Within
// a tile the address stays below 2^18, so the steps need no mask.
struct SmemDesc {
  uint32_t lo, hi;
};
__host__ __device__ __forceinline__ SmemDesc make_desc_sw128(uint32_t saddr, uint32_t lbo,
                                                             uint32_t sbo) {
  return {((saddr & 0x3FFFFu) >> 4) | ((lbo >> 4) << 16), (sbo >> 4) | (1u << 30)};
}
// The descriptor of the operand `bytes` (a multiple of 16) past d's start.  (Host code: for
// tests/test_hopper_desc.py, which checks the bit layout.)
__host__ __device__ __forceinline__ uint64_t desc_at(SmemDesc d, uint32_t bytes) {
#ifdef __CUDA_ARCH__
  uint64_t r;
  asm("mov.b64 %0, {%1, %2};\n" : "=l"(r) : "r"(d.lo + (bytes >> 4)), "r"(d.hi));
  return r;
#else
  return (static_cast<uint64_t>(d.hi) << 32) | (d.lo + (bytes >> 4));
#endif
}
__device__ __forceinline__ uint64_t desc_sw128(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
  return desc_at(make_desc_sw128(saddr, lbo, sbo), 0);
}

#define MLAGEN_R8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), \
    "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define MLAGEN_R32(i) MLAGEN_R8(i), MLAGEN_R8(i + 8), MLAGEN_R8(i + 16), MLAGEN_R8(i + 24)

// D (64 x 64, fp32) += A (64 x 16, K-major, smem) * B (16 x 64, K-major, smem); the
// _first form overwrites D (its old value is not an input, so it need not stay live).
#define MLAGEN_D32                                                                            \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                   \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define MLAGEN_WG_SS64(TY, ACC, SCALE)                                                        \
  asm volatile(                                                                               \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " MLAGEN_D32 ", "             \
      "%32, %33, " SCALE ", 1, 1, 0, 0;\n"                                                    \
      : ACC(0) : "l"(da), "l"(db))
#define MLAGEN_W8(i) "=f"(d[i]), "=f"(d[i + 1]), "=f"(d[i + 2]), "=f"(d[i + 3]), \
    "=f"(d[i + 4]), "=f"(d[i + 5]), "=f"(d[i + 6]), "=f"(d[i + 7])
#define MLAGEN_W32(i) MLAGEN_W8(i), MLAGEN_W8(i + 8), MLAGEN_W8(i + 16), MLAGEN_W8(i + 24)
template <typename T>
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[32], uint64_t da, uint64_t db) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    MLAGEN_WG_SS64("bf16", MLAGEN_R32, "1");
  } else {
    MLAGEN_WG_SS64("f16", MLAGEN_R32, "1");
  }
}
template <typename T>
__device__ __forceinline__ void wgmma_m64n64k16_ss_first(float (&d)[32], uint64_t da,
                                                         uint64_t db) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    MLAGEN_WG_SS64("bf16", MLAGEN_W32, "0");
  } else {
    MLAGEN_WG_SS64("f16", MLAGEN_W32, "0");
  }
}
#undef MLAGEN_WG_SS64
#undef MLAGEN_W32
#undef MLAGEN_W8
#undef MLAGEN_D32

#define MLAGEN_D128                                                                           \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                   \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "          \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "           \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "           \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "           \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "           \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, "    \
  "%111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, "      \
  "%125, %126, %127}"

// D (64 x 256, fp32) += A (64 x 16, registers: the m16n8k16 A fragment of this warp's 16
// rows) * B (16 x 256, MN-major, smem).
#define MLAGEN_WG_RS256(TY)                                                                   \
  asm volatile(                                                                               \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." TY "." TY " " MLAGEN_D128 ", "           \
      "{%128, %129, %130, %131}, %132, 1, 1, 1, 1;\n"                                         \
      : MLAGEN_R32(0), MLAGEN_R32(32), MLAGEN_R32(64), MLAGEN_R32(96)                         \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db))
template <typename T>
__device__ __forceinline__ void wgmma_m64n256k16_rs(float (&d)[128], const uint32_t (&a)[4],
                                                    uint64_t db) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    MLAGEN_WG_RS256("bf16");
  } else {
    MLAGEN_WG_RS256("f16");
  }
}
#undef MLAGEN_WG_RS256

// D (64 x 256, fp32) += A (64 x 16, K-major, smem) * B (16 x 256, MN-major, smem).
#define MLAGEN_WG_SS256(TY)                                                                   \
  asm volatile(                                                                               \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." TY "." TY " " MLAGEN_D128 ", "           \
      "%128, %129, 1, 1, 1, 0, 1;\n"                                                          \
      : MLAGEN_R32(0), MLAGEN_R32(32), MLAGEN_R32(64), MLAGEN_R32(96)                         \
      : "l"(da), "l"(db))
template <typename T>
__device__ __forceinline__ void wgmma_m64n256k16_ss(float (&d)[128], uint64_t da, uint64_t db) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    MLAGEN_WG_SS256("bf16");
  } else {
    MLAGEN_WG_SS256("f16");
  }
}
#undef MLAGEN_WG_SS256

// D[OFF, OFF + 64) (64 x 128, fp32: half of a 64 x 256 accumulator, whose first 64
// registers hold its columns 0-127) += A (64 x 16, K-major, smem) * B (16 x 128, MN-major,
// smem): P V over one half of a warpgroup's value columns, so that its first half's K
// slices can be let go while the second half still runs.
#define MLAGEN_D64                                                                            \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                   \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "          \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "           \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define MLAGEN_WG_SS128(TY)                                                                   \
  asm volatile(                                                                               \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " MLAGEN_D64 ", "            \
      "%64, %65, 1, 1, 1, 0, 1;\n"                                                            \
      : MLAGEN_R32(OFF), MLAGEN_R32(OFF + 32)                                                 \
      : "l"(da), "l"(db))
template <typename T, int OFF>
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[128], uint64_t da, uint64_t db) {
  static_assert(OFF == 0 || OFF == 64, "one half of a 64 x 256 accumulator");
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    MLAGEN_WG_SS128("bf16");
  } else {
    MLAGEN_WG_SS128("f16");
  }
}
#undef MLAGEN_WG_SS128
#undef MLAGEN_D64
#undef MLAGEN_D128
#undef MLAGEN_R32
#undef MLAGEN_R8

// D (64 x N, fp32, N = 16 or 32) += A (64 x 16, smem) * B (16 x N, K-major, smem), for
// the few-rows kernel (query rows in N).  TA = 1 reads A MN-major (transposed: V^T from a
// K tile), 0 K-major; the _first form overwrites D.
#define MLAGEN_R4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define MLAGEN_W4(i) "=f"(d[i]), "=f"(d[i + 1]), "=f"(d[i + 2]), "=f"(d[i + 3])
#define MLAGEN_WG_N16(TY, ACC, SCALE)                                                         \
  asm volatile(                                                                               \
      "wgmma.mma_async.sync.aligned.m64n16k16.f32." TY "." TY                                 \
      " {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, " SCALE ", 1, 1, %10, 0;\n"                 \
      : ACC(0), ACC(4) : "l"(da), "l"(db), "n"(TA))
#define MLAGEN_WG_N32(TY, ACC, SCALE)                                                         \
  asm volatile(                                                                               \
      "wgmma.mma_async.sync.aligned.m64n32k16.f32." TY "." TY                                 \
      " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15},"              \
      " %16, %17, " SCALE ", 1, 1, %18, 0;\n"                                                 \
      : ACC(0), ACC(4), ACC(8), ACC(12) : "l"(da), "l"(db), "n"(TA))
template <typename T, int TA, int N>
__device__ __forceinline__ void wgmma_m64nNk16_ss(float (&d)[N / 2], uint64_t da, uint64_t db) {
  static_assert(N == 16 || N == 32, "N = 16 or 32");
  constexpr bool bf = std::is_same<T, __nv_bfloat16>::value;
  if constexpr (N == 16) {
    if constexpr (bf) MLAGEN_WG_N16("bf16", MLAGEN_R4, "1");
    else MLAGEN_WG_N16("f16", MLAGEN_R4, "1");
  } else {
    if constexpr (bf) MLAGEN_WG_N32("bf16", MLAGEN_R4, "1");
    else MLAGEN_WG_N32("f16", MLAGEN_R4, "1");
  }
}
template <typename T, int TA, int N>
__device__ __forceinline__ void wgmma_m64nNk16_ss_first(float (&d)[N / 2], uint64_t da,
                                                        uint64_t db) {
  static_assert(N == 16 || N == 32, "N = 16 or 32");
  constexpr bool bf = std::is_same<T, __nv_bfloat16>::value;
  if constexpr (N == 16) {
    if constexpr (bf) MLAGEN_WG_N16("bf16", MLAGEN_W4, "0");
    else MLAGEN_WG_N16("f16", MLAGEN_W4, "0");
  } else {
    if constexpr (bf) MLAGEN_WG_N32("bf16", MLAGEN_W4, "0");
    else MLAGEN_WG_N32("f16", MLAGEN_W4, "0");
  }
}
// D (64 x 16, fp32) += A (64 x 16, registers: this warp's 16 rows in the m16n8k16 A
// fragment) * B (16 x 16, K-major, smem): the FP8 consumer that converts its own operands
// (mla_fp8_regs.cuh).  _first overwrites D.
#define MLAGEN_WG_RS16(TY, ACC, SCALE)                                                        \
  asm volatile(                                                                               \
      "wgmma.mma_async.sync.aligned.m64n16k16.f32." TY "." TY                                 \
      " {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, " SCALE ", 1, 1, 0;\n"     \
      : ACC(0), ACC(4) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db))
template <typename T, bool FIRST = false>
__device__ __forceinline__ void wgmma_m64n16k16_rs(float (&d)[8], const uint32_t (&a)[4],
                                                   uint64_t db) {
  constexpr bool bf = std::is_same<T, __nv_bfloat16>::value;
  if constexpr (FIRST) {
    if constexpr (bf) MLAGEN_WG_RS16("bf16", MLAGEN_W4, "0");
    else MLAGEN_WG_RS16("f16", MLAGEN_W4, "0");
  } else {
    if constexpr (bf) MLAGEN_WG_RS16("bf16", MLAGEN_R4, "1");
    else MLAGEN_WG_RS16("f16", MLAGEN_R4, "1");
  }
}
// D (64 x 16, fp32) += A (64 x 32 e4m3, registers: this warp's 16 rows, 4 bytes a
// register: row lane / 4 and + 8, columns 4 (lane % 4) .. + 3 and + 16) * B (32 x 16 e4m3,
// K-major, smem): fp8_mma = "mma" (mla_fp8_regs.cuh).  8-bit types take no transpose.
#define MLAGEN_WG_RS16E4(ACC, SCALE)                                                          \
  asm volatile(                                                                               \
      "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3"                                  \
      " {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, " SCALE ", 1, 1;\n"        \
      : ACC(0), ACC(4) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db))
template <bool FIRST = false>
__device__ __forceinline__ void wgmma_m64n16k32_rs_e4m3(float (&d)[8], const uint32_t (&a)[4],
                                                        uint64_t db) {
  if constexpr (FIRST) MLAGEN_WG_RS16E4(MLAGEN_W4, "0");
  else MLAGEN_WG_RS16E4(MLAGEN_R4, "1");
}
#undef MLAGEN_WG_RS16E4
#undef MLAGEN_WG_RS16
#undef MLAGEN_WG_N32
#undef MLAGEN_WG_N16
#undef MLAGEN_W4
#undef MLAGEN_R4

// ldmatrix: four 8 x 8 matrices of 16-bit elements (lanes 8 i .. 8 i + 7 give matrix i's
// row addresses); register i holds this lane's two elements of matrix i (row lane / 4,
// elements 2 (lane % 4) and + 1; .trans: column lane / 4, rows 2 (lane % 4) and + 1).
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}

__device__ __forceinline__ void st_shared_u16(uint32_t addr, uint16_t v) {
  asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(addr), "h"(v) : "memory");
}
// Shared-memory stores and loads by address (STS/LDS, not the generic ST/LD that a plain
// pointer into a carved dynamic-smem struct compiles to).
__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t ld_shared_u32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ void st_shared_f32(uint32_t addr, float v) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory");
}
__device__ __forceinline__ uint32_t ld_shared_u8(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u8 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ float ld_shared_f32(uint32_t addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ void st_shared_v2_f32(uint32_t addr, float a, float b) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(a), "f"(b) : "memory");
}

// ---- staged output: fragments to shared memory, then bulk copies to global ----
// Four 8x8 16-bit matrices in the mma accumulator layout (thread t: row t / 4, columns
// 2 (t % 4), +1 of each); lane i gives the address of row i % 8 of matrix i / 8.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t a, uint32_t b, uint32_t c,
                                            uint32_t d) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n"
               ::"r"(addr), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}
// `bytes` (a multiple of 16, both addresses 16-byte aligned) from shared memory to global,
// by the copy engine; complete as far as the source goes after bulk_wait_read.
__device__ __forceinline__ void bulk_store(void* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n"
               ::"l"(dst), "r"(src), "r"(bytes) : "memory");
}
// The same copy with an L2 cache policy (partials kept in L2 for the combine that reads them).
__device__ __forceinline__ void bulk_store_hint(void* dst, uint32_t src, uint32_t bytes,
                                                uint64_t policy) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group.L2::cache_hint [%0], [%1], %2, %3;\n"
               ::"l"(dst), "r"(src), "r"(bytes), "l"(policy) : "memory");
}
__device__ __forceinline__ uint64_t l2_policy_evict_last() {
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(pol));
  return pol;
}
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// this thread's bulk copies have read their shared memory (it may be written again)
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}

// Two floats packed into one 32-bit register of T (low half = a).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float a, float b);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float a, float b) {
  __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float a, float b) {
  __half2 v = __floats2half2_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&v);
}

}  // namespace sm90
}  // namespace hopper
}  // namespace mlagen
