// The split-KV attention kernel (mma.sync main loop).
//
// Grid: (parts, row tiles).  A CTA takes one part of the scheduler's split and one tile of
// ROWS query rows (s_q * h_q rows packed token-major: row = s * h_q + h), and for each
// request piece of its part runs flash attention over the piece's keys:
//
//   per block of BKV keys (a STAGES-deep cp.async pipeline through the block table):
//     S = Q K^T        warps split the 16x8 score tiles (and the 576-deep reduction when
//                      there are fewer tiles than warps); fp32 scores go to shared memory
//     softmax          THREADS/ROWS threads per row: mask, running max and sum (log2
//                      domain), P (bf16/fp16) to shared memory, the rescale factor alpha
//     O = alpha O + P V  each warp owns 512/WARPS columns of the fp32 O accumulator for
//                      all ROWS rows; V is a transposed view of the same K tile
//
// A piece that is a request's only split writes out (q's dtype) and lse directly;
// otherwise it writes fp32 O/l and lse to the partial buffers for mla_combine.
//
// Slots outside [start, end) of a piece are zero-filled by cp.async (never read), and
// masked to -inf before the softmax, so NaN in unused pages or page tails never reaches
// the output, not even as 0 * NaN.  A block-table entry outside [0, num_blocks) is never
// dereferenced: its rows are zero-filled, the piece's output is NaN and the device error
// flag (MlaParams::error) is set; so is a negative length.
//
// Shared memory (bytes, SplitConfig::kSmem; mirrored in mlagen/schedule/resources.py):
//   Q      ROWS x 576 x 2                  (rows swizzled in 16-byte chunks)
//   K      STAGES x BKV x 576 x 2          (same swizzle)
//   P      ROWS x (BKV + 8) x 2            (padded rows)
//   S      KSPLIT x ROWS x (BKV + 4) x 4   (fp32 scores, padded rows)
//   stats  2 x ROWS x 4                    (alpha, l per row)
#pragma once
#include "mla_common.cuh"

namespace mlagen {
namespace hopper {

template <int ROWS, int BKV, int STAGES, int WARPS>
struct SplitConfig {
  static constexpr int kThreads = WARPS * 32;
  static constexpr int kMTiles = ROWS / 16;
  static constexpr int kNTilesS = BKV / 8;
  static constexpr int kTilesS = kMTiles * kNTilesS;
  // 16-row tiles keep Q in registers: every warp computes all score tiles of the block over
  // its share of the 576-deep reduction (Q is read from shared memory once per piece, and a
  // warp's MMAs form NTilesS independent chains).  Larger tiles give each warp up to 4 score
  // tiles of one row tile (one Q fragment read from shared memory feeds 4 MMAs; 3-5% faster
  // than 2 tiles per warp on the H200), and split the reduction over the warps that would
  // otherwise have no tiles.
  static constexpr bool kQInRegs = ROWS == 16;
  static constexpr int kTileGroup = kNTilesS < 4 ? kNTilesS : 4;
  static constexpr bool kSplitTiles = kTilesS / kTileGroup >= WARPS;
  static constexpr int kTilesPerWarp =
      kQInRegs ? kNTilesS : (kSplitTiles ? kTilesS / WARPS : kTileGroup);
  static constexpr int kGroups = kTilesS / kTilesPerWarp;   // warps' disjoint tile groups
  static constexpr int kKSplit = kQInRegs ? WARPS : (kSplitTiles ? 1 : WARPS / kGroups);
  // accumulator sets (alternate k steps) so that a warp has >= 4 independent MMA chains
  static constexpr int kAccSets = kTilesPerWarp >= 4 ? 1 : 2;
  static constexpr int kKSteps = kD / 16;
  static constexpr int kKStepsPerWarp = (kKSteps + kKSplit - 1) / kKSplit;
  static constexpr int kOCols = kDV / WARPS;
  static constexpr int kONTiles = kOCols / 8;
  static constexpr int kTPR = kThreads / ROWS;
  static constexpr int kCPT = BKV / kTPR;
  static constexpr int kPStride = BKV + 8;
  static constexpr int kSStride = BKV + 4;
  static constexpr int kQBytes = ROWS * kD * 2;
  static constexpr int kKBytes = STAGES * BKV * kD * 2;
  static constexpr int kPBytes = ROWS * kPStride * 2;
  static constexpr int kSBytes = kKSplit * ROWS * kSStride * 4;
  static constexpr int kStatBytes = 2 * ROWS * 4;
  static constexpr int kSmem = kQBytes + kKBytes + kPBytes + kSBytes + kStatBytes;
  // Two CTAs per SM when two fit in its 228 KiB (1 KiB per CTA is reserved) and in its
  // registers at up to 128 per thread: one CTA's loads then overlap the other's math.
  static constexpr int kMinBlocks =
      (2 * (kSmem + 1024) <= 233472 && 2 * kThreads * 128 <= 65536) ? 2 : 1;

  static_assert(ROWS == 16 || ROWS == 32 || ROWS == 64, "rows_per_tile must be 16, 32 or 64");
  static_assert(BKV == 16 || BKV == 32 || BKV == 64, "block_kv must be 16, 32 or 64");
  static_assert(STAGES >= 1 && STAGES <= 8, "buffers must be 1..8");
  static_assert(WARPS == 4 || WARPS == 8, "warps must be 4 or 8");
  static_assert(kTilesPerWarp <= kNTilesS, "a warp's score tiles share one row tile");
  static_assert(kQInRegs || kGroups * kKSplit == WARPS, "every warp has one tile group");
  static_assert(!kQInRegs || kNTilesS % 2 == 0, "score tiles are loaded in pairs");
  static_assert(kTPR >= 2 && kTPR <= 32 && kCPT >= 1, "softmax thread mapping");
  static_assert(kSStride % 4 == 0, "score rows start on 16-byte boundaries");
  static_assert(kONTiles % 2 == 0, "PV loads V for two column tiles at a time");
  static_assert(kThreads % ROWS == 0 && kThreads % BKV == 0, "load mapping");
};

// Element offset of 16-byte chunk `chunk` of row `row` in a swizzled 576-wide tile: the
// chunk index is XORed with the row's low 3 bits, so the 8 rows an ldmatrix reads hit 8
// different bank groups (rows are 1152 bytes, a multiple of 128).
__device__ __forceinline__ int swz(int row, int chunk) {
  return row * kD + ((chunk ^ (row & 7)) << 3);
}

template <typename T, int ROWS, int BKV, int STAGES, int WARPS>
struct SplitKernel {
  using C = SplitConfig<ROWS, BKV, STAGES, WARPS>;

  struct Smem {
    T* q;
    T* k;
    T* p;
    float* s;
    float* alpha;
    float* l;
  };

  static __device__ __forceinline__ Smem carve(unsigned char* base) {
    Smem sm;
    sm.q = reinterpret_cast<T*>(base);
    sm.k = reinterpret_cast<T*>(base + C::kQBytes);
    sm.p = reinterpret_cast<T*>(base + C::kQBytes + C::kKBytes);
    sm.s = reinterpret_cast<float*>(base + C::kQBytes + C::kKBytes + C::kPBytes);
    sm.alpha = sm.s + C::kKSplit * ROWS * C::kSStride;
    sm.l = sm.alpha + ROWS;
    return sm;
  }

  // Q rows [row0, row0 + ROWS) of request `req`; rows past s_q * h_q are zero.  Each row is
  // loaded by THREADS / ROWS threads, so a thread computes its row's address once.
  static __device__ __forceinline__ void load_q(const MlaParams& p, const Smem& sm, int req,
                                                int row0, int rows_total) {
    constexpr int kTPRow = C::kThreads / ROWS;
    const T* q = static_cast<const T*>(p.q);
    const int r = threadIdx.x / kTPRow, j = threadIdx.x % kTPRow;
    const int gr = row0 + r;
    const bool ok = gr < rows_total;
    const int s = ok ? gr / p.h_q : 0, h = ok ? gr % p.h_q : 0;
    const T* src = ok ? q + req * p.q_stride_b + s * p.q_stride_s + h * p.q_stride_h : q;
#pragma unroll
    for (int ch = j; ch < kChunks; ch += kTPRow)
      cp_async16(sm.q + swz(r, ch), src + (ok ? ch * 8 : 0), ok);
  }

  // The block-table entry of this thread's key row of the block at t0 (raw, range-checked
  // in load_k; -1 past the table), and whether the row is before `end`.  Looked up one
  // block ahead of its load, so issuing the cp.async never waits on this global read.
  struct PageRef {
    int page;
    bool live;
  };
  static __device__ __forceinline__ PageRef page_of(const MlaParams& p, int req, int t0,
                                                    int end) {
    constexpr int kTPRow = C::kThreads / BKV;
    const int t = t0 + static_cast<int>(threadIdx.x) / kTPRow;
    if (t >= end) return {0, false};
    const int pi = t / p.page_size;
    const int* row = p.block_table + static_cast<int64_t>(req) * p.bt_stride;
    return {pi < p.max_blocks ? row[pi] : -1, true};
  }

  // Keys [t0, t0 + BKV) of a request into stage `stage`, given this thread's page from
  // page_of; keys at or past the piece's end are zero.  Each key row is loaded by THREADS / BKV threads
  // (interleaved 16-byte chunks, so a warp instruction reads whole 64-byte runs).  Returns
  // true if the block-table entry was out of range.
  static __device__ __forceinline__ bool load_k(const MlaParams& p, const Smem& sm, int t0,
                                                PageRef pg, int stage) {
    constexpr int kTPRow = C::kThreads / BKV;
    const T* k = static_cast<const T*>(p.k);
    const int r = threadIdx.x / kTPRow, j = threadIdx.x % kTPRow;
    const int t = t0 + r;
    bool ok = pg.live, bad = false;
    const T* src = k;
    if (ok) {
      if (pg.page < 0 || pg.page >= p.num_blocks) {
        bad = true;
        ok = false;
      } else {
        src = k + pg.page * p.k_stride_block + (t % p.page_size) * p.k_stride_token;
      }
    }
    T* dst = sm.k + stage * BKV * kD;
#pragma unroll
    for (int ch = j; ch < kChunks; ch += kTPRow)
      cp_async16(dst + swz(r, ch), src + (ok ? ch * 8 : 0), ok);
    return bad;
  }

  // This warp's Q fragments (16-row tiles): k steps [warp * 36 / W, (warp + 1) * 36 / W).
  static __device__ __forceinline__ void load_q_frags(const Smem& sm,
                                                      uint32_t (&qa)[C::kKStepsPerWarp][4]) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int ks0 = warp * C::kKSteps / C::kKSplit, ks1 = (warp + 1) * C::kKSteps / C::kKSplit;
#pragma unroll
    for (int u = 0; u < C::kKStepsPerWarp; ++u)
      if (ks0 + u < ks1) ldmatrix_x4(qa[u], sm.q + swz(lane & 15, (ks0 + u) * 2 + (lane >> 4)));
  }

  // S = Q K^T for one block with Q in registers: all score tiles, this warp's k steps;
  // the partial sums go to score buffer `warp` (the softmax adds the buffers).
  static __device__ __forceinline__ void scores_qregs(const Smem& sm, const T* kb,
                                                      const uint32_t (&qa)[C::kKStepsPerWarp][4]) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int ks0 = warp * C::kKSteps / C::kKSplit, ks1 = (warp + 1) * C::kKSteps / C::kKSplit;
    float acc[C::kNTilesS][4];
#pragma unroll
    for (int t = 0; t < C::kNTilesS; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[t][e] = 0.f;
#pragma unroll
    for (int u = 0; u < C::kKStepsPerWarp; ++u) {
      const int ks = ks0 + u;
      if (ks < ks1) {
#pragma unroll
        for (int pr = 0; pr < C::kNTilesS / 2; ++pr) {
          uint32_t b[4];
          const int tok = pr * 16 + (lane & 7) + ((lane >> 4) << 3);
          ldmatrix_x4(b, kb + swz(tok, ks * 2 + ((lane >> 3) & 1)));
          mma16816<T>(acc[2 * pr], qa[u], b[0], b[1]);
          mma16816<T>(acc[2 * pr + 1], qa[u], b[2], b[3]);
        }
      }
    }
    float* s = sm.s + warp * ROWS * C::kSStride;
    const int r = lane / 4;
#pragma unroll
    for (int t = 0; t < C::kNTilesS; ++t) {
      const int col = t * 8 + (lane % 4) * 2;
      *reinterpret_cast<float2*>(s + r * C::kSStride + col) = make_float2(acc[t][0], acc[t][1]);
      *reinterpret_cast<float2*>(s + (r + 8) * C::kSStride + col) =
          make_float2(acc[t][2], acc[t][3]);
    }
  }

  // S = Q K^T for one block: this warp's score tiles (or its share of the reduction).
  static __device__ __forceinline__ void scores(const Smem& sm, const T* kb) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    // warp -> (tile group, share g of the reduction)
    const int t0 = (warp % C::kGroups) * C::kTilesPerWarp;
    const int mt = t0 / C::kNTilesS, nt0 = t0 % C::kNTilesS, g = warp / C::kGroups;
    const int ks0 = g * C::kKSteps / C::kKSplit, ks1 = (g + 1) * C::kKSteps / C::kKSplit;
    // kAccSets accumulator sets (alternate k steps) shorten the chains of dependent MMAs
    constexpr int kSets = C::kAccSets;
    float acc[kSets][C::kTilesPerWarp][4];
#pragma unroll
    for (int u = 0; u < kSets; ++u)
#pragma unroll
      for (int t = 0; t < C::kTilesPerWarp; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[u][t][e] = 0.f;
    const int arow = mt * 16 + (lane & 15);
#pragma unroll 2
    for (int ks2 = ks0; ks2 < ks1; ks2 += kSets) {
#pragma unroll
      for (int u = 0; u < kSets; ++u) {
        const int ks = ks2 + u;
        if (ks >= ks1) break;
        uint32_t a[4];
        ldmatrix_x4(a, sm.q + swz(arow, ks * 2 + (lane >> 4)));
        if constexpr (C::kTilesPerWarp == 1) {
          uint32_t b[2];
          const int tok = nt0 * 8 + (lane & 7);
          ldmatrix_x2(b, kb + swz(tok, ks * 2 + ((lane >> 3) & 1)));
          mma16816<T>(acc[u][0], a, b[0], b[1]);
        } else {
#pragma unroll
          for (int pr = 0; pr < C::kTilesPerWarp / 2; ++pr) {
            uint32_t b[4];
            const int tok = (nt0 + 2 * pr) * 8 + (lane & 7) + ((lane >> 4) << 3);
            ldmatrix_x4(b, kb + swz(tok, ks * 2 + ((lane >> 3) & 1)));
            mma16816<T>(acc[u][2 * pr], a, b[0], b[1]);
            mma16816<T>(acc[u][2 * pr + 1], a, b[2], b[3]);
          }
        }
      }
    }
#pragma unroll
    for (int u = 1; u < kSets; ++u)
#pragma unroll
      for (int t = 0; t < C::kTilesPerWarp; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[0][t][e] += acc[u][t][e];
    float* s = sm.s + g * ROWS * C::kSStride;
    const int r = mt * 16 + lane / 4;
#pragma unroll
    for (int t = 0; t < C::kTilesPerWarp; ++t) {
      const int col = (nt0 + t) * 8 + (lane % 4) * 2;
      *reinterpret_cast<float2*>(s + r * C::kSStride + col) =
          make_float2(acc[0][t][0], acc[0][t][1]);
      *reinterpret_cast<float2*>(s + (r + 8) * C::kSStride + col) =
          make_float2(acc[0][t][2], acc[0][t][3]);
    }
  }

  static __device__ __forceinline__ void piece(const MlaParams& p, const Smem& sm, int req,
                                               int start, int end, int slot, bool direct,
                                               bool bad_plan) {
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int rows_total = p.s_q * p.h_q;
    const int row0 = blockIdx.y * ROWS;
    const int seqlen = max(p.seqlens[req], 0);

    // softmax role: row r_sm, columns [j_sm * CPT, (j_sm + 1) * CPT) of each block
    const int r_sm = tid / C::kTPR, j_sm = tid % C::kTPR;
    const int gr_sm = row0 + r_sm;
    int limit = 0;   // keys < limit are visible to this row
    if (gr_sm < rows_total) {
      const int s = gr_sm / p.h_q;
      limit = p.causal ? seqlen - p.s_q + s + 1 + (kFault == kFaultCausalOffByOne) : seqlen;
    }
    limit = min(limit, end);
    float m = -INFINITY, l = 0.f;

    float acc[C::kMTiles][C::kONTiles][4];
#pragma unroll
    for (int i = 0; i < C::kMTiles; ++i)
#pragma unroll
      for (int j = 0; j < C::kONTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

    const int nblocks = end > start ? (end - start + BKV - 1) / BKV : 0;
    bool bad = false;
    uint32_t qa[C::kQInRegs ? C::kKStepsPerWarp : 1][4];   // Q fragments (16-row tiles)
    (void)qa;
    load_q(p, sm, req, row0, rows_total);
#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st) {
      if (st < nblocks)
        bad |= load_k(p, sm, start + st * BKV, page_of(p, req, start + st * BKV, end), st);
      cp_async_commit();
    }
    // page of the next block to load (block STAGES - 1, or 0 with one stage)
    const int first_ld = STAGES == 1 ? 0 : STAGES - 1;
    PageRef next_page = first_ld < nblocks ? page_of(p, req, start + first_ld * BKV, end)
                                           : PageRef{0, false};

    for (int i = 0; i < nblocks; ++i) {
      if constexpr (STAGES == 1) {
        bad |= load_k(p, sm, start + i * BKV, next_page, 0);
        cp_async_commit();
        if (i + 1 < nblocks) next_page = page_of(p, req, start + (i + 1) * BKV, end);
        cp_async_wait<0>();
        __syncthreads();
      } else {
        cp_async_wait<(kFault == kFaultEarlyBufferSwap ? STAGES - 1 : STAGES - 2)>();
        __syncthreads();   // block i landed for all threads; block i-1 fully consumed
        const int nx = i + STAGES - 1;
        if (nx < nblocks) {
          bad |= load_k(p, sm, start + nx * BKV, next_page, nx % STAGES);
          if (nx + 1 < nblocks) next_page = page_of(p, req, start + (nx + 1) * BKV, end);
        }
        cp_async_commit();
      }
      const T* kb = sm.k + (i % STAGES) * BKV * kD;

      if constexpr (C::kQInRegs) {
        if (i == 0) load_q_frags(sm, qa);   // Q landed with block 0
        scores_qregs(sm, kb, qa);
      } else {
        scores(sm, kb);
      }
      __syncthreads();

      {  // online softmax, log2 domain
        const int t0 = start + i * BKV + j_sm * C::kCPT;
        float x[C::kCPT];
#pragma unroll
        for (int c = 0; c < C::kCPT; ++c) x[c] = 0.f;
        // the partial sums, read as wide as the run of CPT columns allows (16-byte aligned
        // rows: SStride is a multiple of 4)
        constexpr int kVec = C::kCPT % 4 == 0 ? 4 : (C::kCPT % 2 == 0 ? 2 : 1);
#pragma unroll
        for (int g = 0; g < C::kKSplit; ++g) {
          const float* srow = sm.s + (g * ROWS + r_sm) * C::kSStride + j_sm * C::kCPT;
#pragma unroll
          for (int c = 0; c < C::kCPT; c += kVec) {
            if constexpr (kVec == 4) {
              const float4 v = *reinterpret_cast<const float4*>(srow + c);
              x[c] += v.x;
              x[c + 1] += v.y;
              x[c + 2] += v.z;
              x[c + 3] += v.w;
            } else if constexpr (kVec == 2) {
              const float2 v = *reinterpret_cast<const float2*>(srow + c);
              x[c] += v.x;
              x[c + 1] += v.y;
            } else {
              x[c] += srow[c];
            }
          }
        }
        float mx = -INFINITY;
#pragma unroll
        for (int c = 0; c < C::kCPT; ++c) {
          x[c] = (t0 + c < limit)
                     ? x[c] * (kFault == kFaultWrongScale ? p.scale_log2 * 1.01f : p.scale_log2)
                     : -INFINITY;
          mx = fmaxf(mx, x[c]);
        }
#pragma unroll
        for (int off = C::kTPR / 2; off >= 1; off >>= 1)
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        const float m_new = fmaxf(m, mx);
        const float alpha = m_new == -INFINITY ? 1.f : exp2f(m - m_new);
        float sum = 0.f;
        T* prow = sm.p + r_sm * C::kPStride + j_sm * C::kCPT;
#pragma unroll
        for (int c = 0; c < C::kCPT; ++c) {
          const float e = x[c] == -INFINITY ? 0.f : exp2f(x[c] - m_new);
          sum += e;
          prow[c] = static_cast<T>(e);
        }
#pragma unroll
        for (int off = C::kTPR / 2; off >= 1; off >>= 1)
          sum += __shfl_xor_sync(0xffffffffu, sum, off);
        l = l * alpha + sum;
        m = m_new;
        if (j_sm == 0) sm.alpha[r_sm] = alpha;
      }
      __syncthreads();

      {  // O = alpha O + P V over this warp's columns
#pragma unroll
        for (int mt = 0; mt < C::kMTiles; ++mt) {
          const float a0 = sm.alpha[mt * 16 + lane / 4], a1 = sm.alpha[mt * 16 + lane / 4 + 8];
#pragma unroll
          for (int nt = 0; nt < C::kONTiles; ++nt) {
            acc[mt][nt][0] *= a0;
            acc[mt][nt][1] *= a0;
            acc[mt][nt][2] *= a1;
            acc[mt][nt][3] *= a1;
          }
        }
#pragma unroll
        for (int kk = 0; kk < BKV / 16; ++kk) {
          uint32_t pa[C::kMTiles][4];
#pragma unroll
          for (int mt = 0; mt < C::kMTiles; ++mt)
            ldmatrix_x4(pa[mt], sm.p + (mt * 16 + (lane & 15)) * C::kPStride + kk * 16 +
                                    (lane >> 4) * 8);
          const int tok = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
          for (int np = 0; np < C::kONTiles / 2; ++np) {
            const int chunk = (warp * C::kOCols + np * 16) / 8 + (lane >> 4);
            uint32_t b[4];
            ldmatrix_x4_trans(b, kb + swz(tok, chunk));
#pragma unroll
            for (int mt = 0; mt < C::kMTiles; ++mt) {
              mma16816<T>(acc[mt][2 * np], pa[mt], b[0], b[1]);
              mma16816<T>(acc[mt][2 * np + 1], pa[mt], b[2], b[3]);
            }
          }
        }
      }
      if constexpr (STAGES == 1) __syncthreads();
    }
    cp_async_wait<0>();
    bad = __syncthreads_or(bad);
    const bool bad_len = p.seqlens[req] < 0;
    if ((bad || bad_len || bad_plan) && tid == 0 && p.error != nullptr)
      atomicOr(p.error, (bad ? kErrorBadPage : 0) | (bad_len ? kErrorBadLength : 0) |
                            (bad_plan ? kErrorBadPlan : 0));
    bad |= bad_len || bad_plan;

    // lse, one thread per row
    const float kLn2 = 0.69314718055994531f;
    if (j_sm == 0) {
      sm.l[r_sm] = bad ? NAN : l;
      if (gr_sm < rows_total) {
        // no visible key: +inf for a final lse (FlashMLA's convention), -inf for a partial
        // one (its weight in the combine is then 0)
        const float empty = direct ? INFINITY : -INFINITY;
        // a NaN sum (NaN in q or a seen key, or a +inf score) is a NaN row, not an empty
        // one: fmaxf skips NaN scores, so only l carries them (docs/conventions.md)
        const float lse = bad || l != l ? NAN : (l > 0.f ? (m + log2f(l)) * kLn2 : empty);
        if (direct) {
          const int s = gr_sm / p.h_q, h = gr_sm % p.h_q;
          p.lse[(static_cast<int64_t>(req) * p.h_q + h) * p.s_q + s] = lse;
        } else {
          p.lse_acc[static_cast<int64_t>(slot) * rows_total + gr_sm] = lse;
        }
      }
    }
    __syncthreads();

    // O / l, by the warp that owns the columns
#pragma unroll
    for (int mt = 0; mt < C::kMTiles; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = mt * 16 + lane / 4 + half * 8;
        const int gr = row0 + r;
        if (gr >= rows_total) continue;
        const float lv = sm.l[r];
        const float inv = lv != lv ? NAN : (lv > 0.f ? 1.f / lv : 0.f);
        const int64_t base = (direct ? static_cast<int64_t>(req) : static_cast<int64_t>(slot)) *
                                 rows_total + gr;
#pragma unroll
        for (int nt = 0; nt < C::kONTiles; ++nt) {
          const int col = warp * C::kOCols + nt * 8 + (lane % 4) * 2;
          const float v0 = acc[mt][nt][half * 2] * inv, v1 = acc[mt][nt][half * 2 + 1] * inv;
          if (direct) {
            using P2 = typename Pair<T>::type;
            reinterpret_cast<P2*>(static_cast<T*>(p.out) + base * kDV + col)[0] =
                Pair<T>::make(v0, v1);
          } else {
            *reinterpret_cast<float2*>(p.o_acc + base * kDV + col) = make_float2(v0, v1);
          }
        }
      }
    }
  }

  static __device__ void run(const MlaParams& p, unsigned char* smem) {
    const Smem sm = carve(smem);
    // No early pdl_launch_dependents(): the combine then starts as the split's CTAs exit.
    // Triggering here let the combine's CTAs sit beside the split and cost 1-6 us per call
    // on the small graph rows (5569878:benchmarks/results/hopper_pdl_ab_6768d1b.log).
    const int* md = p.sched + blockIdx.x * kMetaInts;
    const int first = md[0], last = md[2];
    for (int req = first; req <= last && req < p.batch; ++req) {
      int seqlen = max(p.seqlens[req], 0);
      if (kFault == kFaultSkipPartialPage) seqlen = seqlen / p.page_size * p.page_size;
      int start = req == first ? md[1] : 0;
      int end = req == last ? md[3] : seqlen;
      end = min(end, seqlen);
      start = min(start, end);
      const int slot = p.num_splits[req] + (req == first ? md[4] : 0);
      const bool direct = p.num_splits[req + 1] - p.num_splits[req] == 1;
      // metadata planned for the 64-row wgmma kernel's cluster merge (another library's):
      // this kernel never merges, so each half would write the output alone; NaN, flag 4
      piece(p, sm, req, start, end, slot, direct, req == first && md[5] > 0);
      __syncthreads();   // shared memory is reused by the next piece
    }
  }
};

template <typename T, int ROWS, int BKV, int STAGES, int WARPS>
__global__ void __launch_bounds__(WARPS * 32, (SplitConfig<ROWS, BKV, STAGES, WARPS>::kMinBlocks))
mla_split_kernel(const __grid_constant__ MlaParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  SplitKernel<T, ROWS, BKV, STAGES, WARPS>::run(p, smem);
}

// Raise the kernel's dynamic shared memory limit (once per process).
template <typename T, int ROWS, int BKV, int STAGES, int WARPS>
cudaError_t prepare_split() {
  static bool done = false;
  if (done) return cudaSuccess;
  cudaError_t e = cudaFuncSetAttribute(mla_split_kernel<T, ROWS, BKV, STAGES, WARPS>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       SplitConfig<ROWS, BKV, STAGES, WARPS>::kSmem);
  done = e == cudaSuccess;
  return e;
}

// CTAs of the split kernel that fit on one SM (the scheduler makes that many parts per SM).
template <typename T, int ROWS, int BKV, int STAGES, int WARPS>
cudaError_t split_ctas_per_sm_impl(int* n) {
  using C = SplitConfig<ROWS, BKV, STAGES, WARPS>;
  cudaError_t e = prepare_split<T, ROWS, BKV, STAGES, WARPS>();
  if (e != cudaSuccess) return e;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      n, mla_split_kernel<T, ROWS, BKV, STAGES, WARPS>, C::kThreads, C::kSmem);
}

template <typename T, int ROWS, int BKV, int STAGES, int WARPS>
cudaError_t launch_split_impl(const MlaParams& p, cudaStream_t stream) {
  using C = SplitConfig<ROWS, BKV, STAGES, WARPS>;
  auto kernel = mla_split_kernel<T, ROWS, BKV, STAGES, WARPS>;
  cudaError_t e = prepare_split<T, ROWS, BKV, STAGES, WARPS>();
  if (e != cudaSuccess) return e;
  const int rows_total = p.s_q * p.h_q;
  dim3 grid(p.num_parts, (rows_total + ROWS - 1) / ROWS);
  kernel<<<grid, C::kThreads, C::kSmem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace hopper
}  // namespace mlagen
