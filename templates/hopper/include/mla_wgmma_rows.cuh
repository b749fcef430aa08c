// The split-KV attention kernel for few query rows (s_q * h_q <= 32 per tile): the wgmma
// main loop with the rows in wgmma's N dimension ("swap AB"), mainloop = "wgmma" with
// rows_per_tile 16 or 32, so that h_q = 16 does not pay for 64 rows.
//
// Same contract as mla_wgmma.cuh (row tiles of N, the scheduler's pieces,
// direct output for a request's only split, fp32 partials for mla_combine otherwise, the
// same TMA tensor map of 64-key x 64-column boxes, 128-byte swizzle; page sizes that are
// multiples of 64).
//
// Per 64-key block, with the keys in M and the N query rows in N:
//   S^T (64 x N)  = K Q^T        36 wgmma m64nNk16, A = the K tile (K-major), B = Q (K-major)
//   softmax per query column over the block's 64 keys: a column's keys lie in the 4 warps
//   of the warpgroup, so the block max goes through shared memory (one named barrier)
//   P^T to shared memory (the B operand of a wgmma must be there), K-major [N][64 keys]
//   O^T (512 x N) += V^T P^T     8 x 4 wgmma m64nNk16, A = V^T read MN-major from the same
//                                K tile (its first 512 columns), B = P^T
// Compute is small against the 72 KiB a block reads, so the kernel is a streaming problem:
// one producer warp issues TMA boxes through the block table into a ring of 8 KiB slots
// (one box each, its own full/empty mbarriers) that fills the shared memory left over,
// 2.8 blocks deep for 16 rows (2 whole 72 KiB stages would leave 60 KiB idle); one consumer
// warpgroup waits for a block's 9 slices and hands them back as soon as its P V is done.
//
// Measured on the H200 (5569878:benchmarks/results/hopper_rows_notes.md): 16 rows 3.5-4.1 TB/s,
// 0.93-1.01 of the best anchor, 1.03-1.07x the 16-row mma_sync kernel (the 16-row class's
// default before it); 32 rows 0.77-0.87, below the 64-row kernel padded 2x (0.82-0.92),
// so the 32-row class stays on mla_wgmma.cuh.
//
// Keys at or past the piece's end in its last block are zeroed in the stage (V columns)
// before any P V and masked to -inf before the softmax; a bad block-table entry is out of
// the tensor map's bounds (TMA fills zeros), the piece's output is NaN and the device error
// flag is set; so is a negative length.
//
// Two consumer warpgroups (WG = 2, schedule warps = 8; not measured yet): each takes every
// other 64-key block of a piece (WG w the blocks i with i % 2 == w) with its own running max,
// row sums and O^T; the producer still loads blocks in order and each WG hands back its own
// blocks' slots (the rope slice right after S^T, the 8 V slices after P V).  At the end of a
// piece the two states merge through shared memory (m = max(m0, m1), each O^T and l scaled
// by exp2(m_w - m), added; WG1's O^T goes over in 2 rounds of 64-column slabs through the Q
// and P^T tiles, free by then) and WG0 writes the output.  1 producer + 2 consumer warpgroups
// (384 threads): setmaxnreg moves the producer warpgroup's registers to the consumers.
//
// Shared memory: Q (N x 576) | kSlots x 8 KiB | P^T (N x 64) a WG | column max / sum
// exchange (4 warps x N floats) a WG | [WG = 2: m, l and the bad-page flag of each WG, the
// columns' key limits] | 2 mbarriers a slot.
#pragma once
#include "mla_wgmma.cuh"   // WgmmaParams, Piece, next_piece, wgmma_params
#include "mla_fp8.cuh"     // FP8 caches: the raw layout and the conversion
#include "mla_fp8_regs.cuh"  // FP8 without a converter: the consumer converts in registers
#include "mla_sparse.cuh"  // token-sparse rows: the gather by index

namespace mlagen {
namespace hopper {

template <int N, int WG = 1, int KV = kKvNative, int CV = 1, int RS = 2, int SP = 0, int MM = 0>
struct WgmmaRowsConfig {
  static_assert(N == 16 || N == 32, "16 or 32 query rows per tile");
  static_assert(WG == 1 || WG == 2, "one or two consumer warpgroups");
  static constexpr int kRows = N;
  static constexpr int kBlock = 64;
  static constexpr int kWgs = WG;
  // token-sparse rows (SP = 1): one producer warp gathers a block's 64 keys by their cache
  // slots with cp.async (zero-filled where a slot names no key), one consumer warpgroup
  static constexpr bool kSparse = SP != 0;
  static_assert(!kSparse || (WG == 1 && CV == 1), "sparse: one consumer and one converter WG");
  // SP = 2: a second pool of keys in the same softmax (mla_sparse.cuh SparseRow)
  static_assert(SP >= 0 && SP <= 2, "SP: 0 dense, 1 one pool, 2 two pools");
  static constexpr bool kExtraPool = SP == 2;
  // FP8 caches: a converter warpgroup (WG1) between the producer and the consumer
  static constexpr bool kFp8 = KV != kKvNative;
  static_assert(!kFp8 || WG == 1 || CV == 0, "FP8 caches: one consumer warpgroup (two "
                                             "where the consumers convert, CV = 0)");
  // FP8: CV converter warpgroups (1 or 2), warpgroups 1..CV; CV = 0: no converter, the
  // consumer converts its own MMA operands in registers (mla_fp8_regs.cuh; 16 rows, dense)
  static_assert(CV == 1 || (kFp8 && (CV == 2 || CV == 0)), "0, 1 or 2 converters (FP8)");
  static constexpr int kConverters = CV;
  static constexpr bool kRegs = kFp8 && CV == 0;
  // d_qk 512 (mla_common.cuh kD): sparse rows with one consumer warpgroup (the two-warpgroup
  // and register paths hand a rope slice back early, which d_qk 512's values include)
  static_assert(kD == 576 || (SP != 0 && WG == 1 && !kRegs), "d_qk 512: sparse rows only");
  static_assert((KV == kKvUe8m0) == (kD == 512 && kFp8), "fp8_ue8m0_paged is d_qk 512's FP8");
  static_assert(!kRegs || (N == 16 && SP == 0), "register conversion: 16 rows, dense");
  // MM = 1 (fp8_mma = "mma", mla_fp8_regs.cuh): e4m3 wgmmas on the raw bytes, Q quantized
  // per row on the fly, P rounded to e4m3; the register path alone
  static constexpr bool kMma = MM != 0;
  static_assert(MM == 0 || (MM == 1 && kRegs && KV == kKvE4m3), "e4m3 MMAs: register path");
  // one consumer warpgroup + the producer warp; or two + a producer warpgroup (setmaxnreg
  // works on whole warpgroups); FP8: consumer, CV converter and producer warpgroups
  // sparse: a producer warpgroup (4 warps gather 16 keys of each block apiece)
  static constexpr int kThreads =
      kRegs ? (WG == 2 ? 384 : 160) : kFp8 ? 128 * (2 + CV) : WG == 2 ? 384 : SP ? 256 : 160;
  static constexpr int kSlices = kD / 64;
  static constexpr int kSliceBytes = 64 * 64 * 2;        // one TMA box: 64 keys x 64 columns
  static constexpr int kTileBytes = kSlices * kSliceBytes;
  static constexpr int kQSliceBytes = N * 128;           // N rows x 64 columns
  static constexpr int kMaxSmem = 232448;                // 227 KiB per CTA
  // m, l and the bad flag of each WG, the columns' key limits
  // (register conversion: the Q rows' power-of-two scales, N floats, at float kQScale)
  static constexpr int kStatBytes =
      (WG == 1 ? 0 : 2 * 2 * N * 4 + 16 + N * 4) + (kRegs ? N * 4 : 0);
  static constexpr int kQScale = WG == 1 ? 0 : 4 * N + 4 + N;
  // FP8: a ring of RS raw slots (2 or 3), one 64-key block's bytes each (Fp8Layout, 36 or
  // 41 KiB); the bf16 ring takes the rest.  A raw slot stays taken while its block is
  // converted, so RS - 1 blocks are in flight at most
  // (register conversion: no bf16 ring, so 2..5 raw slots: up to 4 blocks in flight)
  static_assert(RS == 2 || (kFp8 && RS == 3) || (kRegs && RS >= 2 && RS <= 5),
                "two or three raw slots (FP8; 2..5 with register conversion)");
  static constexpr int kRawBytes = Fp8Layout<KV>::kRawBytes;
  static constexpr int kRawSlots = kFp8 ? RS : 0;
  // a ring of 8 KiB slots, one TMA box each, filling what Q, P^T and the exchange leave
  // (a slot costs its bytes and two mbarriers): 25 slots (2.8 blocks) for 16 rows, 23 for 32
  // (22 with two consumer warpgroups); FP8 (bf16 slots written by the converter): 16 / 15
  // for 16 rows (fp8_e4m3 / fp8_ds_mla), 14 / 12 for 32
  static constexpr int kFixed = kSlices * kQSliceBytes + WG * (N * 128 + 4 * N * 4) +
                                kStatBytes + kRawSlots * (kRawBytes + 16) + 1024;
  static constexpr int kSlots = kRegs ? 0 : (kMaxSmem - kFixed) / (kSliceBytes + 16);
  static constexpr int kQOff = 0;
  static constexpr int kKOff = kQOff + kSlices * kQSliceBytes;
  static constexpr int kRawOff = kKOff + kSlots * kSliceBytes;
  static constexpr int kPOff = kRawOff + kRawSlots * kRawBytes;
  static constexpr int kRedOff = kPOff + WG * N * 128;
  static constexpr int kStatOff = kRedOff + WG * 4 * N * 4;
  static constexpr int kBarOff = kStatOff + kStatBytes;
  static constexpr int kSmem = kBarOff + 2 * (kSlots + kRawSlots) * 8 + 1024;   // + slack
  // named barriers: 1 + w of warpgroup w, 3 of both consumer warpgroups (0 is __syncthreads)
  static constexpr int kBarWg = 1, kBarBoth = 3;
  // setmaxnreg (two consumer warpgroups): __launch_bounds__ fixes the entry count at
  // 65536 / 384 = 168; the producer warpgroup keeps 24
  // (sparse: the gather's address arithmetic; 88 is what the FP8 consumer and converter leave)
  static constexpr int kProducerRegs = SP ? 88 : 24, kConsumerRegs = 240;
  static_assert(SP || kProducerRegs * 128 + 2 * kConsumerRegs * 128 <= 64512, "register file");
  // FP8: the consumer gets all 256 (one warpgroup's 32-row O^T alone is 128), a converter
  // 160 (16 bytes in, 32 out, 4 chunks in flight), or 112 each of two (512 threads enter
  // with 128)
  static constexpr int kFp8ConsumerRegs = 256, kConverterRegs = CV == 1 ? 160 : 112;
  static_assert(kProducerRegs * 128 + (kFp8ConsumerRegs + CV * kConverterRegs) * 128 <= 64512,
                "register file");
  static_assert(kKOff % 1024 == 0 && kRawOff % 1024 == 0 && kPOff % 1024 == 0,
                "tiles on the swizzle atom");
  // FP8: the consumer holds one block's 9 slots while the converter fills the next block's
  // first pairs of slices (9 slots: none ahead); the bf16 kernel's TMA keeps two blocks in
  // flight
  static_assert(kRegs || kSlots >= (kFp8 ? kSlices : 2 * kSlices), "ring too short");
  static_assert(kSmem <= kMaxSmem, "227 KiB of shared memory per CTA");
};

// The launch parameters of an FP8 cache: the raw boxes' two tensor maps (mla_fp8.cuh).
struct WgmmaFp8Params {
  MlaParams p;
  CUtensorMap tmap_raw;    // 16-bit view of the cache: 64 keys x bytes [0, 512), unswizzled
  CUtensorMap tmap_tail;   // 64 keys x bytes [512, token bytes), unswizzled
};
template <int KV>
using RowsParams = typename std::conditional<KV == kKvNative, WgmmaParams, WgmmaFp8Params>::type;

template <typename T, int N, int WG, int FAULT, int KV = kKvNative, int CV = 1, int RS = 2,
          int SP = 0, int MM = 0>
struct WgmmaRowsKernel {
  using C = WgmmaRowsConfig<N, WG, KV, CV, RS, SP, MM>;
  using L = Fp8Layout<KV>;
  using Params = RowsParams<KV>;
  static constexpr int kAcc = N / 2;   // accumulator registers of one m64nN tile per thread
  // the MMAs' input type: T, or fp16 where the consumer converts e4m3 in registers (one
  // instruction per two values; Q scaled into fp16's range per row, mla_fp8_regs.cuh)
  using TM = typename std::conditional<C::kRegs, __half, T>::type;
  static constexpr int kCols = N / 4;  // query columns per thread

  struct Smem {
    unsigned char* q;
    unsigned char* k;
    unsigned char* p;  // [WG][N x 64 keys]
    float* red;        // [WG][4 warps][N]
    float* stat;       // WG = 2: [WG][m N | l N], the bad flags [WG] (16 bytes), lim [N]
    uint64_t* full;    // [kSlots]
    uint64_t* empty;   // [kSlots]
    unsigned char* raw;      // FP8: [kRawSlots] raw blocks
    uint64_t* raw_full;      // FP8: [kRawSlots]
    uint64_t* raw_empty;     // FP8: [kRawSlots]
  };

  static __device__ __forceinline__ Smem carve(unsigned char* raw) {
    unsigned char* base = sm90::smem_align1024(raw);
    Smem sm;
    sm.q = base + C::kQOff;
    sm.k = base + C::kKOff;
    sm.p = base + C::kPOff;
    sm.red = reinterpret_cast<float*>(base + C::kRedOff);
    sm.stat = reinterpret_cast<float*>(base + C::kStatOff);
    sm.full = reinterpret_cast<uint64_t*>(base + C::kBarOff);
    sm.empty = sm.full + C::kSlots;
    sm.raw = base + C::kRawOff;
    sm.raw_full = sm.empty + C::kSlots;
    sm.raw_empty = sm.raw_full + C::kRawSlots;
    return sm;
  }

  // The ring position of the slices: slot and lap (the mbarrier phase parity is lap & 1).
  struct Ring {
    int slot = 0, lap = 0;
    __device__ __forceinline__ void next() {
      if (++slot == C::kSlots) slot = 0, ++lap;
    }
    // past one block that the other warpgroup takes (9 slices < kSlots: one wrap at most)
    __device__ __forceinline__ void skip_block() {
      slot += C::kSlices;
      if (slot >= C::kSlots) slot -= C::kSlots, ++lap;
    }
    // past n blocks
    __device__ __forceinline__ void skip_blocks(int n) {
      slot += n * C::kSlices;
      lap += slot / C::kSlots;
      slot %= C::kSlots;
    }
  };
  // FP8: the position in the ring of raw blocks.
  struct RawRing {
    int slot = 0, lap = 0;
    __device__ __forceinline__ void next() {
      if (++slot == C::kRawSlots) slot = 0, ++lap;
    }
    // past n blocks (two consumer warpgroups take every other block)
    __device__ __forceinline__ void skip(int n) {
      slot += n;
      lap += slot / C::kRawSlots;
      slot %= C::kRawSlots;
    }
  };
  // Shared address of slice j of the block whose slice 0 is in slot0.
  static __device__ __forceinline__ uint32_t slice_addr(uint32_t kbase, int slot0, int j) {
    const int sl = slot0 + j;
    return kbase + (sl >= C::kSlots ? sl - C::kSlots : sl) * C::kSliceBytes;
  }
  // One arrival of this warp on the empty barrier of slice j of the block at slot0.
  static __device__ __forceinline__ void release_slice(const Smem& sm, int slot0, int j) {
    const int sl = slot0 + j;
    sm90::mbar_arrive(&sm.empty[sl >= C::kSlots ? sl - C::kSlots : sl]);
  }

  // a block-table entry outside the cache (TMA fills zeros there): the piece is NaN
  static __device__ __forceinline__ bool bad_page(const MlaParams& p, int page) {
    return page < 0 || page >= p.num_blocks;
  }
  static __device__ __forceinline__ int page_entry(const MlaParams& p, int req, int t0) {
    const int pi = t0 / p.page_size;
    return pi < p.max_blocks ? p.block_table[static_cast<int64_t>(req) * p.bt_stride + pi] : -1;
  }

  // ---------------------------------------------------------------- producer (one thread)
  // Blocks in order, whichever warpgroup takes them.
  // ------------------------------------------ sparse producer (a warpgroup, 4 x 32 lanes)
  // Per 64-key block, warp w takes keys [16 w, 16 w + 16): lane l < 16 reads the slot of
  // key 16 w + l from the row's index list and turns it into the key's byte offset in the
  // cache (kNoKey: no key); the copies are 16-byte cp.async, zero-filled where there is no key
  // (the gather's pieces in mla_sparse.cuh, shared with the 64-row kernel).
  // bf16: slice by slice, each slot waited for on its own (as the TMA producer), a warp
  // instruction 4 keys' 128-byte rows of the slice (chunk c of key r at chunk c ^ (r % 8),
  // what the TMA boxes write); FP8: key by key (the offset broadcast from its lane) into the
  // raw block's layout (Fp8Layout: the 512 latent bytes of each key, then its tail), the
  // converter unchanged.  Every producer thread arrives on a slice's (a raw block's) full
  // barrier once its copies land (cp.async.mbarrier.arrive.noinc: 128 arrivals).
  static __device__ void sparse_producer(const Params& wp, const Smem& sm, int pt) {
    const MlaParams& p = wp.p;
    const int warp = pt / 32, lane = pt % 32;
    const unsigned char* kc = static_cast<const unsigned char*>(p.k);
    constexpr int kElem = C::kFp8 ? 1 : static_cast<int>(sizeof(T));   // bytes a stride unit
    const uint32_t kbase = sm90::smem_addr(sm.k), rbase = sm90::smem_addr(sm.raw);
    Ring rg;
    RawRing rr;
    int req = 0;
    Piece pc;
    while (next_piece(p, req, pc)) {
      const auto row = sparse_row<C::kExtraPool>(p, pc.req);
      const int n = (pc.end - pc.start + C::kBlock - 1) / C::kBlock;
#pragma unroll 1
      for (int i = 0; i < n; ++i) {
        const int t0 = pc.start + i * C::kBlock;
        int64_t off = 0;
        if constexpr (!L::kPaged) off = sparse_key_offset(p, row, t0, pc.end, warp, lane, kElem);
        const int slot0 = rg.slot, lap0 = rg.lap;
        if constexpr (L::kPaged) {
          // fp8_ue8m0_paged: a key's 576-byte data row (36 chunks: lane l the chunk l, lanes
          // 0..3 also 32 + l) and its 8-byte scale row (lane 31), from two places of its page
          int64_t sc;
          const int64_t doff = sparse_key_offset<C::kExtraPool, L::kRowBytes>(
              p, row, t0, pc.end, warp, lane, 1, &sc);
          sm90::mbar_wait(&sm.raw_empty[rr.slot], (rr.lap & 1) ^ 1);
          const uint32_t raw = rbase + rr.slot * C::kRawBytes;
#pragma unroll 4
          for (int k = 0; k < 16; ++k) {
            const int r = 16 * warp + k;
            const int64_t o = __shfl_sync(0xffffffffu, doff, k);
            const int64_t so = __shfl_sync(0xffffffffu, sc, k);
            const bool ok = sparse_has_key(o);
            const unsigned char* src = kc + (ok ? o : 0);
            sm90::cp_async16_to(raw + r * L::kRowBytes + lane * 16, src + lane * 16, ok);
            if (lane < L::kRowBytes / 16 - 32)
              sm90::cp_async16_to(raw + r * L::kRowBytes + (32 + lane) * 16,
                                  src + (32 + lane) * 16, ok);
            else if (lane == 31)
              sm90::cp_async8_to(raw + L::kLatentBytes + r * L::kTailRow, kc + (ok ? so : 0), ok);
          }
          sm90::cp_async_mbar_arrive(&sm.raw_full[rr.slot]);
          rr.next();
        } else if constexpr (C::kFp8) {
          sm90::mbar_wait(&sm.raw_empty[rr.slot], (rr.lap & 1) ^ 1);
          const uint32_t raw = rbase + rr.slot * C::kRawBytes;
          sparse_gather_keys(kc, off, warp, [&](int r, const unsigned char* src, bool ok) {
            sm90::cp_async16_to(raw + r * 512 + lane * 16, src + lane * 16, ok);
            if (lane < L::kTailRow / 16)
              sm90::cp_async16_to(raw + L::kLatentBytes + r * L::kTailRow + lane * 16,
                                  src + 512 + lane * 16, ok);
          });
          sm90::cp_async_mbar_arrive(&sm.raw_full[rr.slot]);
          rr.next();
        } else {
          // slice by slice, each on its own empty barrier (as the TMA producer): the slots
          // left over beside two blocks (25 - 18 for 16 rows) fill while the consumer still
          // holds the oldest block.  Lane l copies chunk l % 8 of keys 4 i + l / 8 (i < 4)
          // of the warp's 16: a warp instruction is 4 keys' 128-byte rows of the slice
          // (mla_sparse.cuh's slice gather, as the 64-row kernel's)
          int64_t o4[4];
          sparse_lane_keys(off, lane, o4);
#pragma unroll 1
          for (int j = 0; j < C::kSlices; ++j) {
            wait_slot(sm, slot0, lap0, j);
            sparse_copy_slice(kc, o4, slice_addr(kbase, slot0, j), j, warp, lane);
            fill_slot_async(sm, slot0, j);
          }
          rg.skip_block();
        }
      }
    }
  }

  static __device__ void producer(const Params& wp, const Smem& sm) {
    const MlaParams& p = wp.p;
    if constexpr (C::kFp8) {
      sm90::tma_prefetch_desc(&wp.tmap_raw);
      sm90::tma_prefetch_desc(&wp.tmap_tail);
    } else {
      sm90::tma_prefetch_desc(&wp.tmap_k);
    }
    Ring rg;
    RawRing rr;
    int req = 0;
    Piece pc;
    while (next_piece(p, req, pc)) {
      const int n = (pc.end - pc.start + C::kBlock - 1) / C::kBlock;
      for (int i = 0; i < n; ++i) {
        const int t0 = pc.start + i * C::kBlock;
        const int page = page_entry(p, pc.req, t0);
        if constexpr (C::kFp8) {
          // a block's raw bytes, two boxes on one barrier (out of bounds: zeros, bytes
          // counted all the same)
          sm90::mbar_wait(&sm.raw_empty[rr.slot], (rr.lap & 1) ^ 1);
          sm90::mbar_arrive_expect_tx(&sm.raw_full[rr.slot], C::kRawBytes);
          unsigned char* dst = sm.raw + rr.slot * C::kRawBytes;
          if constexpr (C::kRegs) {
            // four 128-byte-swizzled latent boxes (128 columns each) and the swizzled rope
            // box: the layouts ldmatrix reads without bank conflicts (mla_fp8_regs.cuh)
#pragma unroll
            for (int q = 0; q < 4; ++q)
              sm90::tma_load_3d(dst + q * Fp8Regs::kBoxBytes, &wp.tmap_raw,
                                &sm.raw_full[rr.slot], 64 * q, t0 % p.page_size, page);
          } else {
            sm90::tma_load_3d(dst, &wp.tmap_raw, &sm.raw_full[rr.slot], 0, t0 % p.page_size,
                              page);
          }
          sm90::tma_load_3d(dst + L::kLatentBytes, &wp.tmap_tail, &sm.raw_full[rr.slot], 256,
                            t0 % p.page_size, page);
          rr.next();
        } else {
#pragma unroll 1
          for (int j = 0; j < C::kSlices; ++j, rg.next()) {
            sm90::mbar_wait(&sm.empty[rg.slot], (rg.lap & 1) ^ 1);
            sm90::mbar_arrive_expect_tx(&sm.full[rg.slot], C::kSliceBytes);
            sm90::tma_load_3d(sm.k + rg.slot * C::kSliceBytes, &wp.tmap_k, &sm.full[rg.slot],
                              j * 64, t0 % p.page_size, page);
          }
        }
      }
    }
  }

  // ---------------------------------------- converter (FP8, CV warpgroups of 4 warps)
  // Blocks in order: a raw block in, its 9 bf16 slices out, in the slices' swizzled layout
  // (16-byte chunk c of key row r at chunk c ^ (r % 8), what TMA writes for the bf16 cache).
  // The latent goes in four pairs of slices (columns [128 q, 128 q + 128), ds_mla's scale
  // tile q), so that the converter waits for two free slots at a time and the consumer's
  // next block starts filling while it still holds the last one.  Thread t of a pair takes
  // 4 / CV chunks of 16 raw bytes: key row r = (t + 128 CV it) / 8, raw chunk k8 = t % 8 of the row's
  // 128 bytes (8 lanes read 128 contiguous bytes: no bank conflict), written as two 16-byte
  // bf16 chunks of slice 2 q + k8 / 4; the odd slice's lanes store their second chunk first,
  // so that the 8 lanes of each store cover 8 distinct chunk columns.  The rope slice last:
  // e4m3 converted (fp8_e4m3), or its bf16 bytes copied (fp8_ds_mla).  Each warp's lane 0
  // arrives on a slice's full barrier (4 CV arrivals) after every lane's proxy fence.
  static __device__ __forceinline__ void wait_slot(const Smem& sm, int slot0, int lap0, int j) {
    int sl = slot0 + j, lap = lap0;
    if (sl >= C::kSlots) sl -= C::kSlots, ++lap;
    sm90::mbar_wait(&sm.empty[sl], (lap & 1) ^ 1);
  }
  // sparse: this thread's arrival on slice j's full barrier once its cp.async land
  static __device__ __forceinline__ void fill_slot_async(const Smem& sm, int slot0, int j) {
    const int sl = slot0 + j;
    sm90::cp_async_mbar_arrive(&sm.full[sl >= C::kSlots ? sl - C::kSlots : sl]);
  }
  static __device__ __forceinline__ void fill_slot(const Smem& sm, int slot0, int j) {
    const int sl = slot0 + j;
    sm90::mbar_arrive(&sm.full[sl >= C::kSlots ? sl - C::kSlots : sl]);
  }

  // fp8_ue8m0_paged: slice pair q of a raw block (its columns [128 q, 128 q + 128)) into
  // slice 2 q + k8 / 4 (dst) by this thread's chunk k8 of each of its key rows, as the
  // ds_mla latent but with one UE8M0 scale a slice (64 values); slice 7 (q = 3, k8 >= 4) is
  // the RoPE: raw bytes [448, 576) of the row copied, chunks 2 (k8 - 4) and + 1.
  static __device__ __forceinline__ void convert_paged_pair(uint32_t raw, uint32_t tail,
                                                            uint32_t dst, int q, int t, int k8) {
    constexpr int kT = 128 * C::kConverters;
    const int odd = k8 >> 2, sl = 2 * q + odd;
#pragma unroll
    for (int it = 0; it < 4 / C::kConverters; ++it) {
      const int r = (t + kT * it) >> 3;
      const uint32_t src = raw + r * L::kRowBytes;
      if (q == 3 && odd) {
        const int c = 2 * (k8 - 4);
        const uint4 a = fp8::ld_shared_v4(src + 448 + c * 16);
        const uint4 b = fp8::ld_shared_v4(src + 448 + (c + 1) * 16);
        fp8::st_shared_v4(dst + r * 128 + ((c ^ (r & 7)) << 4), a.x, a.y, a.z, a.w);
        fp8::st_shared_v4(dst + r * 128 + (((c + 1) ^ (r & 7)) << 4), b.x, b.y, b.z, b.w);
      } else {
        const int ts = FAULT == kFaultScaleWrongTile ? (sl + 1) % 7 : sl;
        const uint4 v = fp8::ld_shared_v4(src + q * 128 + k8 * 16);
        const uint32_t sc = fp8::ue8m0_bf16x2(sm90::ld_shared_u8(tail + r * L::kTailRow + ts));
        uint32_t o[8];
        fp8::convert16<T, true, FAULT == kFaultScaleTwice>(v, sc, o, fp8::odd16(k8));
        fp8::st_converted16(dst + r * 128, o, k8, r);
      }
    }
  }

  static __device__ void converter(const MlaParams& p, const Smem& sm) {
    constexpr int kT = 128 * C::kConverters;   // converter threads
    const int t = threadIdx.x - 128, lane = t % 32;
    const uint32_t kbase = sm90::smem_addr(sm.k), rbase = sm90::smem_addr(sm.raw);
    constexpr bool kScaled = KV == kKvDsMla;
    Ring rg;
    RawRing rr;
    int req = 0;
    Piece pc;
    while (next_piece(p, req, pc)) {
      const int n = (pc.end - pc.start + C::kBlock - 1) / C::kBlock;
#pragma unroll 1
      for (int i = 0; i < n; ++i) {
        const int slot0 = rg.slot, lap0 = rg.lap;
        const uint32_t raw = rbase + rr.slot * C::kRawBytes;
        const uint32_t tail = raw + L::kLatentBytes;
        sm90::mbar_wait(&sm.raw_full[rr.slot], rr.lap & 1);
#pragma unroll 1
        for (int q = 0; q < 4; ++q) {
          wait_slot(sm, slot0, lap0, 2 * q);
          wait_slot(sm, slot0, lap0, 2 * q + 1);
          const int k8 = t % 8, odd = k8 >> 2;
          if constexpr (L::kPaged) {
            convert_paged_pair(raw, tail, slice_addr(kbase, slot0, 2 * q + odd), q, t, k8);
            sm90::fence_proxy_async();
            __syncwarp();
            if (lane == 0) {
              fill_slot(sm, slot0, 2 * q);
              fill_slot(sm, slot0, 2 * q + 1);
            }
            continue;
          }
          const int tile = FAULT == kFaultScaleWrongTile ? (q + 1) & 3 : q;
          uint4 v[4];
          uint32_t sc[4] = {0u, 0u, 0u, 0u};
#pragma unroll
          for (int it = 0; it < 4 / C::kConverters; ++it) {
            const int r = (t + kT * it) >> 3;
            v[it] = fp8::ld_shared_v4(raw + r * 512 + q * 128 + k8 * 16);
            if constexpr (kScaled)
              sc[it] = fp8::scale_bf16x2(sm90::ld_shared_f32(tail + r * L::kTailRow + 4 * tile));
          }
          const uint32_t dst0 = slice_addr(kbase, slot0, 2 * q + odd);
#pragma unroll
          for (int it = 0; it < 4 / C::kConverters; ++it) {
            const int r = (t + kT * it) >> 3;
            uint32_t o[8];
            fp8::convert16<T, kScaled, FAULT == kFaultScaleTwice>(v[it], sc[it], o,
                                                                  fp8::odd16(k8));
            fp8::st_converted16(dst0 + r * 128, o, k8, r);
          }
          sm90::fence_proxy_async();
          __syncwarp();
          if (lane == 0) {
            fill_slot(sm, slot0, 2 * q);
            fill_slot(sm, slot0, 2 * q + 1);
          }
        }
        if constexpr (L::kPaged) {   // no slice past the values (d_qk 512)
          if (lane == 0) sm90::mbar_arrive(&sm.raw_empty[rr.slot]);
          rg.skip_block();
          rr.next();
          continue;
        }
        // the rope slice: columns [512, 576)
        wait_slot(sm, slot0, lap0, C::kSlices - 1);
        const uint32_t rope = slice_addr(kbase, slot0, C::kSlices - 1);
        if constexpr (KV == kKvE4m3) {
          // 64 keys x 64 raw bytes: thread t, it: key r = (t + 128 it) / 4, chunk k = t % 4
#pragma unroll
          for (int it = 0; it < 2 / C::kConverters; ++it) {
            const int g = t + kT * it, r = g >> 2, k = g & 3;
            const uint4 v = fp8::ld_shared_v4(tail + r * L::kTailRow + k * 16);
            uint32_t o[8];
            fp8::convert16<T, false, false>(v, 0u, o, false);
            const uint32_t row = rope + r * 128;
            fp8::st_shared_v4(row + (((2 * k) ^ (r & 7)) << 4), o[0], o[1], o[2], o[3]);
            fp8::st_shared_v4(row + (((2 * k + 1) ^ (r & 7)) << 4), o[4], o[5], o[6], o[7]);
          }
        } else {
          // 64 keys x 128 bf16 bytes after the 16 bytes of scales: key r = (t + 128 it) / 8
#pragma unroll
          for (int it = 0; it < 4 / C::kConverters; ++it) {
            const int g = t + kT * it, r = g >> 3, ch = g & 7;
            const uint4 v = fp8::ld_shared_v4(tail + r * L::kTailRow + 16 + ch * 16);
            fp8::st_shared_v4(rope + r * 128 + ((ch ^ (r & 7)) << 4), v.x, v.y, v.z, v.w);
          }
        }
        sm90::fence_proxy_async();
        __syncwarp();
        if (lane == 0) {
          fill_slot(sm, slot0, C::kSlices - 1);
          sm90::mbar_arrive(&sm.raw_empty[rr.slot]);   // every lane's reads are done
        }
        rg.skip_block();
        rr.next();
      }
    }
  }

  // Descriptors (128-byte swizzle).  K-major: k step kk (16 columns) = slice kk / 4, +32
  // bytes per step; a K tile's slices are 64 rows, Q's N rows.
  static __device__ __forceinline__ uint64_t k_desc(uint32_t kbase, int slot0, int kk) {
    return sm90::desc_sw128(slice_addr(kbase, slot0, kk >> 2) + (kk & 3) * 32, 16, 1024);
  }
  static __device__ __forceinline__ uint64_t q_desc(const unsigned char* q, int kk) {
    return sm90::desc_sw128(sm90::smem_addr(q) + (kk >> 2) * C::kQSliceBytes + (kk & 3) * 32,
                            16, 1024);
  }
  // V^T (A of O^T += V^T P^T) MN-major: value columns [64 mt, 64 mt + 64) = slice mt, keys
  // [16 kk, 16 kk + 16) = 2 atoms of 8 rows.
  static __device__ __forceinline__ uint64_t vt_desc(uint32_t kbase, int slot0, int mt, int kk) {
    return sm90::desc_sw128(slice_addr(kbase, slot0, mt) + kk * 2048, C::kSliceBytes, 1024);
  }

  // Q rows [row0, row0 + N) of a request into the swizzled Q tile (rows past s_q*h_q zero),
  // by thread t of `threads` (every consumer thread).
  static __device__ __forceinline__ void load_q(const MlaParams& p, const Smem& sm, int req,
                                                int row0, int rows_total, int t) {
    const T* q = static_cast<const T*>(p.q);
    for (int c = t; c < N * kChunks; c += 128 * WG) {
      const int r = c / kChunks, ch = c % kChunks;
      const int gr = row0 + r;
      const bool ok = gr < rows_total;
      const T* src = q;
      if (ok) {
        const int s = gr / p.h_q, h = gr % p.h_q;
        src = q + req * p.q_stride_b + s * p.q_stride_s + h * p.q_stride_h + ch * 8;
      }
      cp_async16(sm.q + (ch >> 3) * C::kQSliceBytes + r * 128 + (((ch & 7) ^ (r & 7)) << 4),
                 src, ok);
    }
    cp_async_commit();
  }

  // Zero keys [rem, 64) of a block's V slices (the last block of a piece past its end), by
  // the 128 threads of the warpgroup that takes the block (named barrier bar).
  static __device__ __forceinline__ void zero_tail(uint32_t kbase, int slot0, int rem, int t,
                                                   int bar) {
    const int chunks = (64 - rem) * 64;   // rows x (8 V slices x 8 chunks)
    for (int c = t; c < chunks; c += 128)
      sm90::st_shared_zero16(slice_addr(kbase, slot0, (c >> 3) & 7) + (rem + (c >> 6)) * 128 +
                             (c & 7) * 16);
    sm90::fence_proxy_async();
    sm90::bar_sync(bar, 128);
  }

  static __device__ __forceinline__ void issue_scores(const Smem& sm, uint32_t kbase,
                                                      int slot0, float (&s)[kAcc]) {
    sm90::wgmma_fence();
    sm90::wgmma_m64nNk16_ss_first<T, 0, N>(s, k_desc(kbase, slot0, 0), q_desc(sm.q, 0));
#pragma unroll
    for (int kk = 1; kk < kD / 16; ++kk)
      sm90::wgmma_m64nNk16_ss<T, 0, N>(s, k_desc(kbase, slot0, kk), q_desc(sm.q, kk));
    sm90::wgmma_commit();
  }

  // Q row gr (token gr / h_q, head gr % h_q) of request req at src; false (src = q) past
  // s_q * h_q, where the tile's row is zeros
  static __device__ __forceinline__ bool q_row(const MlaParams& p, int req, int gr,
                                               int rows_total, const T*& src) {
    const T* q = static_cast<const T*>(p.q);
    const bool ok = gr < rows_total;
    src = q;
    if (ok) {
      const int sq = gr / p.h_q, h = gr % p.h_q;
      src = q + req * p.q_stride_b + sq * p.q_stride_s + h * p.q_stride_h;
    }
    return ok;
  }
  // ------------------------------------ register conversion (CV = 0, mla_fp8_regs.cuh)
  // Q rows [row0, row0 + N) into the Q tile as fp16 (the MMA type TM), each 16 columns'
  // 4-byte pairs permuted as the S^T fragments hold K (pair 2m at m, 2m + 1 at m + 4; rows
  // past s_q*h_q zero).  A bf16 row is scaled by 2^e, its largest finite |q| into [2^14,
  // 2^15) (exact in fp16 down to 2^-38 of it; inf and NaN stay), and 2^-e goes to
  // sm.stat[kQScale + r] for the scores' scale.  Thread t: row t / 8, 16-byte chunks t % 8 + 8 j (8 columns =
  // 4 pairs, half h = ch % 2 of a k16 step): pair j of the chunk goes to pair
  // 2h + j / 2 + 4 (j % 2).
  static __device__ __forceinline__ void load_q_permuted(const MlaParams& p, const Smem& sm,
                                                         int req, int row0, int rows_total,
                                                         int t) {
    constexpr int kPer = kChunks / 8;   // chunks a thread: 9
    const int r = t / 8;
    const T* src;
    const bool ok = q_row(p, req, row0 + r, rows_total, src);
    uint4 v[kPer];
    float mx = 0.f;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      v[j] = ok ? *reinterpret_cast<const uint4*>(src + (t % 8 + 8 * j) * 8)
                : make_uint4(0u, 0u, 0u, 0u);
      if constexpr (!std::is_same<T, TM>::value) {
        const uint32_t w[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float a = fabsf(__uint_as_float(w[i] << 16));
          const float b = fabsf(__uint_as_float(w[i] & 0xffff0000u));
          mx = a < INFINITY ? fmaxf(mx, a) : mx;
          mx = b < INFINITY ? fmaxf(mx, b) : mx;
        }
      }
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
    // e = 14 - the exponent of mx (a subnormal mx counts as 2^-126), within [-126, 126]
    int e = 0;
    if (mx > 0.f) e = min(max(14 - (max(static_cast<int>(__float_as_uint(mx) >> 23), 1) - 127),
                              -126), 126);
    const float sc = __uint_as_float(static_cast<uint32_t>(127 + e) << 23);
    if (t % 8 == 0) sm.stat[C::kQScale + r] = __uint_as_float(static_cast<uint32_t>(127 - e) << 23);
    const uint32_t qbase = sm90::smem_addr(sm.q);
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int ch = t % 8 + 8 * j;
      uint32_t w[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
      if constexpr (!std::is_same<T, TM>::value) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const __half2 hv = __floats2half2_rn(__uint_as_float(w[i] << 16) * sc,
                                               __uint_as_float(w[i] & 0xffff0000u) * sc);
          w[i] = *reinterpret_cast<const uint32_t*>(&hv);
        }
      }
      const int k0 = 16 * (ch / 2), h = ch % 2;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int kp = k0 + 2 * (2 * h + i / 2 + 4 * (i % 2));   // k position of the pair
        const int col = kp % 64;
        sm90::st_shared_u32(qbase + (kp / 64) * C::kQSliceBytes + r * 128 +
                                (((col / 8) ^ (r & 7)) << 4) + (col % 8) * 2,
                            w[i]);
      }
    }
  }

  // Batches: the fragments of a batch's groups (an ldmatrix each, two k16 steps) are
  // converted first, then one wgmma.fence and the batch's wgmmas, one commit group.  A
  // batch's wgmmas never accumulate onto the previous batch's (S^T alternates two
  // accumulators; P V's batches take 4 of the 8 O^T tiles each): a wgmma that reads the
  // accumulator of the batch still in flight would wait for its write-back, and batches of
  // one group each, chained, ran the kernel at 132 cycles a wgmma.  Before a batch's
  // conversion the batch before the last is waited for, so that two batches' fragments are
  // live at most (ptxas keeps an in-flight wgmma's A registers).
  static constexpr int kStBatch = 3, kStBatches = kD / 32 / kStBatch;   // 6 of 3 groups
  static_assert(!C::kRegs || kStBatches * kStBatch == kD / 32, "whole S^T batches");
  static constexpr int kPvBatch = 4, kPvBatches = 16 / kPvBatch;        // 4 of 4 groups

  // S^T of a raw block (K from the latent boxes and the rope box, converted by this warp's
  // lanes into A fragments; Q^T from the permuted Q tile), issued; waited for and summed
  // into s.  Lane l gives ldmatrix the row of key 16 warp + 8 ((l / 8) % 2) + l % 8, chunk
  // + l / 16.
  static __device__ __forceinline__ void regs_scores(uint32_t raw, const Smem& sm, int warp,
                                                     int lane, float (&s)[kAcc]) {
    using P01 = fp8::Pair<0, 1>;
    using P23 = fp8::Pair<2, 3>;
    const int r = 16 * warp + 8 * ((lane >> 3) & 1) + (lane & 7), hi = lane >> 4;
    const uint32_t row = raw + r * 128, rope = raw + L::kLatentBytes + r * 64;
    // Q's descriptor once: each k16 step's is a constant offset from it (one add)
    const sm90::SmemDesc qd = sm90::make_desc_sw128(sm90::smem_addr(sm.q), 16, 1024);
    float s1[kAcc];
#pragma unroll
    for (int b = 0; b < kStBatches; ++b) {
      if (b >= 2) sm90::wgmma_wait<1>();
      uint32_t a[kStBatch][2][4];
#pragma unroll
      for (int j = 0; j < kStBatch; ++j) {
        const int kk = 2 * (kStBatch * b + j);   // two k16 steps a group: 16 latent, 2 rope
        uint32_t w[4], lo[4], hw[4];
        if (kk < 32) {
          const int c = (kk % 8) + hi;   // chunk of latent box kk / 8
          sm90::ldsm_x4(row + (kk / 8) * Fp8Regs::kBoxBytes + ((c ^ (r & 7)) << 4), w);
        } else {
          const int c = (kk - 32) + hi;   // chunk of the rope box
          sm90::ldsm_x4(rope + ((c ^ ((r >> 1) & 3)) << 4), w);
        }
        fp8::e4m3x16_f16<P01, P23>(w, lo, hw);
        a[j][0][0] = lo[0], a[j][0][1] = lo[1], a[j][0][2] = hw[0], a[j][0][3] = hw[1];
        a[j][1][0] = lo[2], a[j][1][1] = lo[3], a[j][1][2] = hw[2], a[j][1][3] = hw[3];
      }
      float(&acc)[kAcc] = b % 2 ? s1 : s;
      sm90::wgmma_fence();
#pragma unroll
      for (int j = 0; j < kStBatch; ++j) {
        const int kk = 2 * (kStBatch * b + j);
        const uint64_t d0 = sm90::desc_at(qd, (kk >> 2) * C::kQSliceBytes + (kk & 3) * 32);
        const uint64_t d1 =
            sm90::desc_at(qd, ((kk + 1) >> 2) * C::kQSliceBytes + ((kk + 1) & 3) * 32);
        if (b < 2 && j == 0)
          sm90::wgmma_m64n16k16_rs<TM, true>(acc, a[j][0], d0);
        else
          sm90::wgmma_m64n16k16_rs<TM>(acc, a[j][0], d0);
        sm90::wgmma_m64n16k16_rs<TM>(acc, a[j][1], d1);
      }
      sm90::wgmma_commit();
    }
    sm90::wgmma_wait<0>();
    sm90::reg_fence(s);
    sm90::reg_fence(s1);
#pragma unroll
    for (int i = 0; i < kAcc; ++i) s[i] += s1[i];
  }

  // O^T += V^T P^T of a raw block: V^T fragments by ldmatrix.trans from the latent boxes
  // (value columns 64 mt + 16 warp .. + 15 are chunk 4 (mt % 2) + warp of box mt / 2), keys
  // at or past rem zeroed (a piece's last block); issued, not waited for.  Lane l gives the
  // row of key 32 kp + 8 (l / 8) + l % 8: matrices 0..3 are keys 0-7, 8-15 of step 2 kp and
  // of step 2 kp + 1.  Batch b: steps 2 kp, 2 kp + 1 (kp = b / 2) of tiles 4 (b % 2) .. + 3.
  static __device__ __forceinline__ void regs_pv(uint32_t raw, uint32_t pbase, int warp,
                                                 int lane, int rem, float (&o)[8][kAcc]) {
    using P02 = fp8::Pair<0, 2>;
    using P13 = fp8::Pair<1, 3>;
    const int kc = 2 * (lane % 4);   // this lane's first key of a fragment word, per 8 keys
    const sm90::SmemDesc pd = sm90::make_desc_sw128(pbase, 16, 1024);   // P^T's, once
#pragma unroll
    for (int b = 0; b < kPvBatches; ++b) {
      const int kp = b / 2;
      const int r = 32 * kp + 8 * (lane >> 3) + (lane & 7);
      if (b >= 2) sm90::wgmma_wait<1>();
      uint32_t a[kPvBatch][2][4];
#pragma unroll
      for (int j = 0; j < kPvBatch; ++j) {
        const int mt = kPvBatch * (b % 2) + j;
        const int c = 4 * (mt % 2) + warp;
        uint32_t w[4], lo[4], hw[4];
        sm90::ldsm_x4_trans(raw + (mt / 2) * Fp8Regs::kBoxBytes + r * 128 + ((c ^ (r & 7)) << 4),
                            w);
        fp8::e4m3x16_f16<P02, P13>(w, lo, hw);
        if (rem < C::kBlock) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const uint32_t keep = fp8::keep_keys(32 * kp + 8 * i + kc, rem);
            lo[i] &= keep;
            hw[i] &= keep;
          }
        }
        a[j][0][0] = lo[0], a[j][0][1] = hw[0], a[j][0][2] = lo[1], a[j][0][3] = hw[1];
        a[j][1][0] = lo[2], a[j][1][1] = hw[2], a[j][1][2] = lo[3], a[j][1][3] = hw[3];
      }
      sm90::wgmma_fence();
#pragma unroll
      for (int j = 0; j < kPvBatch; ++j) {
        const int mt = kPvBatch * (b % 2) + j;
        sm90::wgmma_m64n16k16_rs<TM>(o[mt], a[j][0], sm90::desc_at(pd, (2 * kp) * 32));
        sm90::wgmma_m64n16k16_rs<TM>(o[mt], a[j][1], sm90::desc_at(pd, (2 * kp + 1) * 32));
      }
      sm90::wgmma_commit();
    }
  }

  // ------------------------------------ e4m3 MMAs (MM = 1, fp8_mma = "mma"; mla_fp8_regs.cuh)
  // Q rows [row0, row0 + N) into the Q tile as e4m3 in plain column order: slice j (N x 128
  // bytes, 128-byte swizzle) holds columns [128 j, 128 j + 128), the last one half full;
  // each row's q_scale (amax |q| / 448; 1 for a zero row or one past s_q*h_q; NaN for a row
  // with inf or NaN, so that it stays NaN) to sm.stat[kQScale + r].  Thread t: row t / 8,
  // 8-column chunks t % 8 + 8 j.  Divisions IEEE (__fdiv_rn: the build has fast math), as
  // the reference's float32 ones; fp32 subnormal q values count as 0 (-ftz).
  static __device__ __forceinline__ void load_q_e4m3(const MlaParams& p, const Smem& sm,
                                                     int req, int row0, int rows_total, int t) {
    constexpr int kPer = kChunks / 8;   // chunks a thread: 9
    const int r = t / 8;
    const T* src;
    const bool ok = q_row(p, req, row0 + r, rows_total, src);
    uint4 v[kPer];
    float mx = 0.f;
    bool bad = false;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      v[j] = ok ? *reinterpret_cast<const uint4*>(src + (t % 8 + 8 * j) * 8)
                : make_uint4(0u, 0u, 0u, 0u);
      const T* e = reinterpret_cast<const T*>(&v[j]);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float a = fabsf(static_cast<float>(e[i]));
        bad |= !(a < INFINITY);
        mx = fmaxf(mx, a < INFINITY ? a : 0.f);
      }
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
    // the row's 8 lanes
    bad |= __shfl_xor_sync(0xffffffffu, bad, 1);
    bad |= __shfl_xor_sync(0xffffffffu, bad, 2);
    bad |= __shfl_xor_sync(0xffffffffu, bad, 4);
    // at least 2^-126: the build flushes fp32 subnormals (as the reference models it)
    const float qs = bad ? NAN : mx > 0.f ? fmaxf(__fdiv_rn(mx, 448.f), 0x1p-126f) : 1.f;
    if (t % 8 == 0) sm.stat[C::kQScale + r] = qs;
    const uint32_t qbase = sm90::smem_addr(sm.q);
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int col = (t % 8 + 8 * j) * 8;   // the chunk's first column
      const T* e = reinterpret_cast<const T*>(&v[j]);
      uint32_t w[2];
#pragma unroll
      for (int h = 0; h < 2; ++h)
        w[h] = fp8::f32x2_e4m3(__fdiv_rn(static_cast<float>(e[4 * h]), qs),
                               __fdiv_rn(static_cast<float>(e[4 * h + 1]), qs)) |
               fp8::f32x2_e4m3(__fdiv_rn(static_cast<float>(e[4 * h + 2]), qs),
                               __fdiv_rn(static_cast<float>(e[4 * h + 3]), qs)) << 16;
      const int c = col % 128;
      const uint32_t at = qbase + (col / 128) * C::kQSliceBytes + r * 128 +
                          (((c / 16) ^ (r & 7)) << 4) + c % 16;
      sm90::st_shared_u32(at, w[0]);
      sm90::st_shared_u32(at + 4, w[1]);
    }
  }

  // S^T of a raw block with e4m3 wgmmas: 18 k32 steps (16 latent, 2 rope), each one
  // ldmatrix of K (the register conversion's, unconverted) and Q's k32 step from the e4m3 Q
  // tile (step g: slice g / 4, + 32 bytes a step); batches as regs_scores.  Each batch (96
  // products) starts a fresh accumulator, added to s in fp32 once it is waited for: the fp8
  // tensor cores accumulate with about 14 bits (DeepSeek-V3's report), so a chain of wgmmas
  // onto one accumulator would drop the low bits of every later step.
  static __device__ __forceinline__ void mma_scores(uint32_t raw, const Smem& sm, int warp,
                                                    int lane, float (&s)[kAcc]) {
    const int r = 16 * warp + 8 * ((lane >> 3) & 1) + (lane & 7), hi = lane >> 4;
    const uint32_t row = raw + r * 128, rope = raw + L::kLatentBytes + r * 64;
    const sm90::SmemDesc qd = sm90::make_desc_sw128(sm90::smem_addr(sm.q), 16, 1024);
    float t0[kAcc], t1[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) s[i] = 0.f;
#pragma unroll
    for (int b = 0; b < kStBatches; ++b) {
      float(&acc)[kAcc] = b % 2 ? t1 : t0;
      if (b >= 2) {
        sm90::wgmma_wait<1>();   // batch b - 2 (this accumulator's last) is done
        sm90::reg_fence(acc);
#pragma unroll
        for (int i = 0; i < kAcc; ++i) s[i] += acc[i];
      }
      uint32_t a[kStBatch][4];
#pragma unroll
      for (int j = 0; j < kStBatch; ++j) {
        const int g = kStBatch * b + j;   // k32 step: 32 columns
        if (g < 16) {
          const int c = 2 * (g % 4) + hi;   // chunk of latent box g / 4
          sm90::ldsm_x4(row + (g / 4) * Fp8Regs::kBoxBytes + ((c ^ (r & 7)) << 4), a[j]);
        } else {
          const int c = 2 * (g - 16) + hi;   // chunk of the rope box
          sm90::ldsm_x4(rope + ((c ^ ((r >> 1) & 3)) << 4), a[j]);
        }
      }
      sm90::wgmma_fence();
#pragma unroll
      for (int j = 0; j < kStBatch; ++j) {
        const int g = kStBatch * b + j;
        const uint64_t d = sm90::desc_at(qd, (g >> 2) * C::kQSliceBytes + (g & 3) * 32);
        if (j == 0)
          sm90::wgmma_m64n16k32_rs_e4m3<true>(acc, a[j], d);
        else
          sm90::wgmma_m64n16k32_rs_e4m3(acc, a[j], d);
      }
      sm90::wgmma_commit();
    }
    sm90::wgmma_wait<0>();
    sm90::reg_fence(t0);
    sm90::reg_fence(t1);
#pragma unroll
    for (int i = 0; i < kAcc; ++i) s[i] += t0[i] + t1[i];
  }

  // V^T P^T of a raw block with e4m3 wgmmas into pv (fresh: the caller adds it to O^T in
  // fp32 once waited for, as mma_scores does, so that O^T never chains through the fp8
  // accumulation): the ldmatrix.trans of regs_pv, its words permuted into k32 A registers
  // (mla_fp8_regs.cuh), keys at or past rem zeroed; 2 k32 steps a tile.  Batch b: step
  // b / 2 of tiles 4 (b % 2) .. + 3.  Issued, not waited for.
  static __device__ __forceinline__ void mma_pv(uint32_t raw, uint32_t pbase, int warp,
                                                int lane, int rem, float (&pv)[8][kAcc]) {
    const int kc = 2 * (lane % 4);
    const sm90::SmemDesc pd = sm90::make_desc_sw128(pbase, 16, 1024);
#pragma unroll
    for (int b = 0; b < kPvBatches; ++b) {
      const int kp = b / 2;
      const int r = 32 * kp + 8 * (lane >> 3) + (lane & 7);
      if (b >= 2) sm90::wgmma_wait<1>();
      uint32_t a[kPvBatch][4];
#pragma unroll
      for (int j = 0; j < kPvBatch; ++j) {
        const int mt = kPvBatch * (b % 2) + j;
        const int c = 4 * (mt % 2) + warp;
        uint32_t w[4];
        sm90::ldsm_x4_trans(raw + (mt / 2) * Fp8Regs::kBoxBytes + r * 128 + ((c ^ (r & 7)) << 4),
                            w);
        // bytes 0, 2 of two words: column 2 (lane / 4); bytes 1, 3: column 2 (lane / 4) + 1
        a[j][0] = fp8::prmt(w[0], w[1], 0x6420u);
        a[j][1] = fp8::prmt(w[0], w[1], 0x7531u);
        a[j][2] = fp8::prmt(w[2], w[3], 0x6420u);
        a[j][3] = fp8::prmt(w[2], w[3], 0x7531u);
        if (C::kBlock > rem) {   // a piece's last block: keys past its end zeroed
          const uint32_t k0 = fp8::keep_key_bytes(32 * kp + kc, rem);
          const uint32_t k1 = fp8::keep_key_bytes(32 * kp + 16 + kc, rem);
          a[j][0] &= k0;
          a[j][1] &= k0;
          a[j][2] &= k1;
          a[j][3] &= k1;
        }
      }
      sm90::wgmma_fence();
#pragma unroll
      for (int j = 0; j < kPvBatch; ++j) {
        if (kp == 0)
          sm90::wgmma_m64n16k32_rs_e4m3<true>(pv[kPvBatch * (b % 2) + j], a[j],
                                              sm90::desc_at(pd, 0));
        else
          sm90::wgmma_m64n16k32_rs_e4m3(pv[kPvBatch * (b % 2) + j], a[j],
                                        sm90::desc_at(pd, 32));
      }
      sm90::wgmma_commit();
    }
  }

  // Wait for a block's 9 slices (from the ring position rg on; rg moves past them), zero
  // its tail if the piece ends inside it, issue its scores.
  static __device__ __forceinline__ void start_block(const Smem& sm, Ring& rg, uint32_t kbase,
                                                     int t0, int end, int t, int bar,
                                                     float (&s)[kAcc]) {
    const int slot0 = rg.slot;
#pragma unroll 1
    for (int j = 0; j < C::kSlices; ++j, rg.next())
      sm90::mbar_wait(&sm.full[rg.slot], rg.lap & 1);
    // sparse bf16: the slices were written by cp.async (the generic proxy), read by wgmma
    if constexpr (C::kSparse && !C::kFp8) sm90::fence_proxy_async();
    if (FAULT != kFaultSkipPartialPage && end - t0 < C::kBlock)
      zero_tail(kbase, slot0, end - t0, t, bar);
    issue_scores(sm, kbase, slot0, s);
  }

  // The merge's slab j (64 value columns x N floats of WG1's O^T): Q tile, then P^T tiles.
  static constexpr int kSlabBytes = 64 * N * 4;
  static constexpr int kQSlabs = C::kSlices * C::kQSliceBytes / kSlabBytes;   // 4
  static constexpr int kRound = kQSlabs + 1;
  static_assert(WG == 1 || kSlabBytes <= WG * N * 128, "a merge slab in the P^T tiles");
  static __device__ __forceinline__ float* slab(const Smem& sm, int j) {
    return reinterpret_cast<float*>(j < kQSlabs ? sm.q + j * kSlabBytes : sm.p);
  }

  // Accumulator element i of a thread: key (M) 16 warp + lane / 4 + 8 ((i >> 1) & 1), query
  // column (N) 8 (i >> 2) + 2 (lane % 4) + (i & 1); column slot c = 2 (i >> 2) + (i & 1).
  static __device__ __forceinline__ int col_slot(int i) { return 2 * (i >> 2) + (i & 1); }

  // A block's softmax: the masked, scaled scores, their column maxima over the warpgroup,
  // the running max and sums, P^T [N][64 keys] into pbase, O^T rescaled where a max moved;
  // ends at the barrier after which P^T is complete.
  static __device__ __forceinline__ void softmax_block(
      const float (&s)[kAcc], int t0, const int (&lim)[kCols], const int* lims, bool vk0,
      bool vk1, float scale, float (&m)[kCols], float (&lsum)[kCols], float (&o)[8][kAcc],
      float* red, uint32_t pbase, int bar, int warp, int lane, int k0, int c2) {
    // masked, scaled scores (another array: C7515) and this thread's column maxima
    float xs[kAcc];
    float mx[kCols];
#pragma unroll
    for (int c = 0; c < kCols; ++c) mx[c] = -INFINITY;
#pragma unroll
    for (int i2 = 0; i2 < kAcc; ++i2) {
      const int key = t0 + k0 + 8 * ((i2 >> 1) & 1), c = col_slot(i2);
      const int lc = WG == 1 ? lim[c] : lims[8 * (c >> 1) + c2 + (c & 1)];
      const bool vk = ((i2 >> 1) & 1) ? vk1 : vk0;
      const float x = key < lc && vk ? s[i2] * scale : -INFINITY;
      xs[i2] = x;
      mx[c] = fmaxf(mx[c], x);
    }
    // over the 8 lanes of a column (lane / 4), then the 4 warps through shared memory
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      mx[c] = fmaxf(mx[c], __shfl_xor_sync(0xffffffffu, mx[c], 4));
      mx[c] = fmaxf(mx[c], __shfl_xor_sync(0xffffffffu, mx[c], 8));
      mx[c] = fmaxf(mx[c], __shfl_xor_sync(0xffffffffu, mx[c], 16));
    }
    if (lane < 4) {
#pragma unroll
      for (int c = 0; c < kCols; ++c) red[warp * N + 8 * (c >> 1) + c2 + (c & 1)] = mx[c];
    }
    sm90::bar_sync(bar, 128);
    float alpha[kCols];
    bool moved = false;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int col = 8 * (c >> 1) + c2 + (c & 1);
      float bm = fmaxf(fmaxf(red[col], red[N + col]),
                       fmaxf(red[2 * N + col], red[3 * N + col]));
      // e4m3 P: an integer running max, so that P = 2^(x - m) at any m is the final one
      // times a power of two, which rounds to e4m3 alike (the normal range)
      if constexpr (C::kMma) bm = ceilf(bm);
      // the conditional rescale (kRescaleSlack); m = -inf: any finite bm moves
      const bool move = bm > m[c] + kRescaleSlack;
      alpha[c] = move ? exp2f(m[c] - bm) : 1.f;
      m[c] = move ? bm : m[c];
      moved |= move;
      lsum[c] *= alpha[c];   // this thread's share of the column sum
    }
    // P^T [N][64 keys], K-major, 128-byte rows swizzled: key chunk (key / 8) ^ (col % 8).
    // The previous block's P V is done (waited for), so P^T may be rewritten.
#pragma unroll
    for (int i2 = 0; i2 < kAcc; ++i2) {
      const int c = col_slot(i2);
      const int key = k0 + 8 * ((i2 >> 1) & 1);
      const int col = 8 * (c >> 1) + c2 + (c & 1);
      const float x = xs[i2];
      const float pe = x == -INFINITY ? 0.f : exp2f(x - m[c]);
      if constexpr (C::kMma) {
        // e4m3 P at its k position (the V^T fragments' key order); the sum adds the rounded
        // P (a NaN stays NaN)
        const uint32_t pb = fp8::f32_e4m3(pe);
        lsum[c] += pe == pe ? fp8::e4m3_f32(pb) : pe;
        const int kp = fp8::p_kpos(key);   // P^T in the V^T fragments' key order
        fp8::st_shared_u8(pbase + col * 128 + (((kp >> 4) ^ (col & 7)) << 4) + (kp & 15), pb);
        continue;
      }
      lsum[c] += pe;
      // P rounded to T (the kernels' rounding point), then to the MMA type (register
      // conversion: fp16, exact for P >= 2^-14)
      TM pv;
      if constexpr (std::is_same<TM, T>::value)
        pv = static_cast<T>(pe);
      else
        pv = static_cast<TM>(static_cast<float>(static_cast<T>(pe)));
      sm90::st_shared_u16(pbase + col * 128 + (((key >> 3) ^ (col & 7)) << 4) + (key & 7) * 2,
                          *reinterpret_cast<uint16_t*>(&pv));
    }
    // every warp holds all N columns, so all four take this branch alike
    if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
      for (int mt = 0; mt < 8; ++mt)
#pragma unroll
        for (int i2 = 0; i2 < kAcc; ++i2) o[mt][i2] *= alpha[col_slot(i2)];
    }
    // the rescale stays ahead of wgmma_fence (else ptxas injects a fence per tile, C7519)
#pragma unroll
    for (int mt = 0; mt < 8; ++mt) sm90::reg_fence(o[mt]);
    sm90::fence_proxy_async();
    sm90::bar_sync(bar, 128);   // P^T complete; every warp has read red
  }

  // Consumer warpgroup wg (0 or 1) of WG: the blocks i of each piece with i % WG == wg.
  static __device__ void consumer(const MlaParams& p, const Smem& sm, int wg) {
    const int t = WG == 1 ? threadIdx.x : threadIdx.x % 128, warp = t / 32, lane = t % 32;
    const int bar = C::kBarWg + wg;
    const int rows_total = p.s_q * p.h_q;
    const int row0 = cta_row_tile() * N;
    const int k0 = 16 * warp + lane / 4;   // this thread's keys of a block: k0, k0 + 8
    const int c2 = 2 * (lane % 4);
    const uint32_t kbase = sm90::smem_addr(sm.k);
    const uint32_t pbase = sm90::smem_addr(sm.p + wg * N * 128);
    float* red = sm.red + wg * 4 * N;
    Ring rg;
    RawRing rr;   // register conversion: the raw blocks, in order
    int req = 0;
    Piece pc;
    while (next_piece(p, req, pc)) {
      const int n = (pc.end - pc.start + C::kBlock - 1) / C::kBlock;
      const int seqlen = max(p.seqlens[pc.req], 0);
      int lim[kCols];   // keys below lim[c] are seen by query column c
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const int gr = row0 + 8 * (c >> 1) + c2 + (c & 1);
        int l = 0;
        if (gr < rows_total) l = p.causal ? seqlen - p.s_q + gr / p.h_q + 1 : seqlen;
        lim[c] = min(l + (FAULT == kFaultCausalOffByOne), pc.end);
      }
      // two warpgroups: the limits wait in shared memory (read again at each block's mask,
      // not held in 8 registers through the loop: the 32-row consumer is at its 240);
      // written before the Q barrier, after the last piece's merge (its last reader)
      int* lims = reinterpret_cast<int*>(sm.stat + 4 * N) + 4;
      if constexpr (WG == 2) {
        if (wg == 0 && warp == 0 && lane < 4) {
#pragma unroll
          for (int c = 0; c < kCols; ++c) lims[8 * (c >> 1) + c2 + (c & 1)] = lim[c];
        }
      }
      // fp8_e4m3: the converted keys are the e4m3 values, true = e4m3 * k_descale: the
      // descale goes into the scores' scale and into O; q's descale (8-bit caches, vLLM's
      // descale_q) into the scores' scale alone (1 otherwise).  A descale not finite and
      // > 0 makes the piece NaN and sets kErrorBadDescale (no host check: graph-safe).
      float dk = 1.f, dq = 1.f;
      if constexpr (KV == kKvE4m3) {
        dk = p.k_descale[pc.req * p.k_descale_stride];
        if constexpr (FAULT == kFaultScaleTwice) dk *= dk;
      }
      if constexpr (C::kFp8) {
        if (p.q_descale != nullptr) dq = p.q_descale[pc.req * p.q_descale_stride];
      }
      const bool bad_descale = !(dk > 0.f && dk < INFINITY && dq > 0.f && dq < INFINITY);
      const float scale =
          (FAULT == kFaultWrongScale ? p.scale_log2 * 1.01f : p.scale_log2) * (dk * dq);
      const float o_scale = FAULT == kFaultDescaleNotInOutput ? 1.f : dk;
      // Q of this piece: with two warpgroups both load it and both wait (the last piece's
      // S^T were waited for before its merge, so Q may be rewritten)
      if constexpr (C::kMma) {
        if (wg == 0) load_q_e4m3(p, sm, pc.req, row0, rows_total, t);
      } else if constexpr (C::kRegs) {
        if (wg == 0) load_q_permuted(p, sm, pc.req, row0, rows_total, t);
      } else
        load_q(p, sm, pc.req, row0, rows_total, threadIdx.x);
      cp_async_wait<0>();
      sm90::fence_proxy_async();
      if constexpr (WG == 1)
        sm90::bar_sync(C::kBarWg, 128);
      else
        sm90::bar_sync(C::kBarBoth, 256);

      float o[8][kAcc];
#pragma unroll
      for (int mt = 0; mt < 8; ++mt)
#pragma unroll
        for (int i = 0; i < kAcc; ++i) o[mt][i] = 0.f;
      float s[kAcc];
      float m[kCols], lsum[kCols];
#pragma unroll
      for (int c = 0; c < kCols; ++c) m[c] = -INFINITY, lsum[c] = 0.f;
      bool bad = false;
#pragma unroll
      for (int mt = 0; mt < 8; ++mt) sm90::reg_fence(o[mt]);
      // register conversion (CV = 0): a block's raw slot goes back once its P V is done
      if constexpr (C::kRegs) {
        const uint32_t rbase = sm90::smem_addr(sm.raw);
        float qinv[kCols];   // 2^-e of this thread's query columns (load_q_permuted)
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          if constexpr (C::kMma)
            qinv[c] = sm.stat[C::kQScale + c2 + (c & 1) + 8 * (c >> 1)];   // its q_scale
          else
            qinv[c] = sm.stat[C::kQScale + 8 * (c >> 1) + c2 + (c & 1)];
        }
        // two warpgroups: each takes every other block, so every other raw slot
        RawRing rb = rr;
        if constexpr (WG == 2) rb.skip(wg);
#pragma unroll 1
        for (int i = wg; i < n; i += WG) {
          const int t0 = pc.start + i * C::kBlock;
          const int page = page_entry(p, pc.req, t0);
          bad |= bad_page(p, page);
          const uint32_t raw = rbase + rb.slot * C::kRawBytes;
          sm90::mbar_wait(&sm.raw_full[rb.slot], rb.lap & 1);
          if constexpr (C::kMma)
            mma_scores(raw, sm, warp, lane, s);
          else
            regs_scores(raw, sm, warp, lane, s);
#pragma unroll
          for (int i2 = 0; i2 < kAcc; ++i2) s[i2] *= qinv[col_slot(i2)];
#pragma unroll
          for (int mt = 0; mt < 8; ++mt) sm90::reg_fence(o[mt]);
          softmax_block(s, t0, lim, lims, true, true, scale, m, lsum, o, red, pbase, bar, warp,
                        lane, k0, c2);
          const int rem = FAULT == kFaultSkipPartialPage ? C::kBlock : pc.end - t0;
          if constexpr (C::kMma) {
            float pv[8][kAcc];
            mma_pv(raw, pbase, warp, lane, rem, pv);
            sm90::wgmma_wait<0>();
#pragma unroll
            for (int mt = 0; mt < 8; ++mt) {
              sm90::reg_fence(pv[mt]);
#pragma unroll
              for (int i = 0; i < kAcc; ++i) o[mt][i] += pv[mt][i];
            }
          } else {
            regs_pv(raw, pbase, warp, lane, rem, o);
            sm90::wgmma_wait<0>();
          }
#pragma unroll
          for (int mt = 0; mt < 8; ++mt) sm90::reg_fence(o[mt]);
          __syncwarp();
          if (lane == 0) sm90::mbar_arrive(&sm.raw_empty[rb.slot]);
          rb.skip(WG);
        }
        rr.skip(n);   // past the piece's blocks, both warpgroups alike
      } else
      // one block at a time: its slots go back to the producer as soon as its P V is done,
      // before the next block's wait (holding them through that wait halves the bytes in
      // flight when the loads are the limit)
      for (int i = wg; i < n; i += WG) {
        const int t0 = pc.start + i * C::kBlock;
        // this thread's two keys (k0, k0 + 8): sparse, whether their slots name a key (an
        // entry past the cache's slots makes the piece NaN, as a bad page does)
        bool vk0 = true, vk1 = true;
        if constexpr (C::kSparse) {
          const auto row = sparse_row<C::kExtraPool>(p, pc.req);
          vk0 = sparse_slot(p, row, t0 + k0, pc.end, bad) >= 0;
          vk1 = sparse_slot(p, row, t0 + k0 + 8, pc.end, bad) >= 0;
        } else {
          const int page = page_entry(p, pc.req, t0);
          bad |= bad_page(p, page);
        }
        // the ring position of block i (one warpgroup: the last block's end)
        Ring rb = rg;
        if constexpr (WG == 2) rb.skip_blocks(i);
        const int slot0 = rb.slot;
        start_block(sm, rb, kbase, t0, pc.end, t, bar, s);
        if constexpr (WG == 1) rg = rb;
        sm90::wgmma_wait<0>();
        sm90::reg_fence(s);
#pragma unroll
        for (int mt = 0; mt < 8; ++mt) sm90::reg_fence(o[mt]);
        // two warpgroups: the rope slice (read by S^T alone) goes back now, so the ring
        // holds only V while the softmax and P V run
        if (WG == 2 && lane == 0) release_slice(sm, slot0, C::kSlices - 1);

        softmax_block(s, t0, lim, lims, vk0, vk1, scale, m, lsum, o, red, pbase, bar, warp,
                      lane, k0, c2);

        sm90::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
#pragma unroll
          for (int mt = 0; mt < 8; ++mt)
            sm90::wgmma_m64nNk16_ss<T, 1, N>(
                o[mt], vt_desc(kbase, slot0, mt, kk),
                sm90::desc_sw128(pbase + kk * 32, 16, 1024));
        sm90::wgmma_commit();
        sm90::wgmma_wait<0>();
#pragma unroll
        for (int mt = 0; mt < 8; ++mt) sm90::reg_fence(o[mt]);
        // lane j of each warp hands back slice j's slot (the V slices only, with two WGs)
        if (lane < (WG == 1 ? C::kSlices : C::kSlices - 1)) release_slice(sm, slot0, lane);
      }
      if constexpr (WG == 2 && !C::kRegs) rg.skip_blocks(n);   // past the piece's blocks
      const bool bad_len = p.seqlens[pc.req] < 0;
      // metadata planned for the 64-row kernel's cluster merge (another library's): this
      // kernel never merges, so each half would write the output alone; NaN and flag 4
      const bool bad_plan = pc.merge > 0;

      // sparse: a slot past the cache was one thread's key; a NaN in every column sum of
      // its warp makes the whole row NaN through the reduction below (as a bad page does)
      if constexpr (C::kSparse) {
        if (__any_sync(0xffffffffu, bad)) {
#pragma unroll
          for (int c = 0; c < kCols; ++c) lsum[c] = NAN;
          if (lane == 0 && p.error != nullptr) atomicOr(p.error, kErrorBadPage);
        }
        bad = false;
      }
      // column sums: the 8 lanes of a column, then the 4 warps
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        lsum[c] += __shfl_xor_sync(0xffffffffu, lsum[c], 4);
        lsum[c] += __shfl_xor_sync(0xffffffffu, lsum[c], 8);
        lsum[c] += __shfl_xor_sync(0xffffffffu, lsum[c], 16);
      }
      if (lane < 4) {
#pragma unroll
        for (int c = 0; c < kCols; ++c)
          red[warp * N + 8 * (c >> 1) + c2 + (c & 1)] = lsum[c];
      }
      sm90::bar_sync(bar, 128);
      float l[kCols];
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const int col = 8 * (c >> 1) + c2 + (c & 1);
        l[c] = red[col] + red[N + col] + red[2 * N + col] + red[3 * N + col];
      }
      if constexpr (WG == 2) {
        // the merge: m, l and the bad flag of each warpgroup through shared memory
        float* st = sm.stat + wg * 2 * N;
        int* bad_of = reinterpret_cast<int*>(sm.stat + 4 * N);
        if (warp == 0 && lane < 4) {
#pragma unroll
          for (int c = 0; c < kCols; ++c) {
            const int col = 8 * (c >> 1) + c2 + (c & 1);
            st[col] = m[c];
            st[N + col] = l[c];
          }
        }
        if (t == 0) bad_of[wg] = bad;
        sm90::bar_sync(C::kBarBoth, 256);   // both states written; every P V done
        float f[kCols];   // exp2(m_wg - m) of this warpgroup's columns
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          const int col = 8 * (c >> 1) + c2 + (c & 1);
          const float m0 = sm.stat[col], m1 = sm.stat[2 * N + col];
          const float mm = fmaxf(m0, m1);
          const float f0 = m0 == -INFINITY ? 0.f : exp2f(m0 - mm);
          const float f1 = m1 == -INFINITY ? 0.f : exp2f(m1 - mm);
          f[c] = wg == 0 ? f0 : f1;
          l[c] = sm.stat[N + col] * f0 + sm.stat[3 * N + col] * f1;
          m[c] = mm;
        }
        bad = bad_of[0] | bad_of[1];
        // WG1's O^T to WG0 in 64-column slabs (64 x N floats, [element][thread] so that a
        // warp's stores and loads are consecutive words), kRound at a time: 4 in the Q tile
        // and 1 in the P^T tiles, both free once both warpgroups' last S^T and P V are done
        // (the next piece's Q and P^T are written after the last round's barrier)
#pragma unroll
        for (int r0 = 0; r0 < 8; r0 += kRound) {
          if (wg == 1) {
#pragma unroll
            for (int mt = r0; mt < r0 + kRound && mt < 8; ++mt)
#pragma unroll
              for (int i2 = 0; i2 < kAcc; ++i2)
                slab(sm, mt - r0)[i2 * 128 + t] = o[mt][i2] * f[col_slot(i2)];
          }
          sm90::bar_sync(C::kBarBoth, 256);
          if (wg == 0) {
#pragma unroll
            for (int mt = r0; mt < r0 + kRound && mt < 8; ++mt)
#pragma unroll
              for (int i2 = 0; i2 < kAcc; ++i2)
                o[mt][i2] = o[mt][i2] * f[col_slot(i2)] + slab(sm, mt - r0)[i2 * 128 + t];
          }
          sm90::bar_sync(C::kBarBoth, 256);   // the slabs and sm.stat may be rewritten
        }
        if (wg == 1) continue;   // WG0 writes the piece's output
      }
      if ((bad || bad_len || bad_plan || bad_descale) && t == 0 && p.error != nullptr)
        atomicOr(p.error, (bad ? kErrorBadPage : 0) | (bad_len ? kErrorBadLength : 0) |
                              (bad_plan ? kErrorBadPlan : 0) |
                              (bad_descale ? kErrorBadDescale : 0));
      bad |= bad_len || bad_plan || bad_descale;

      const float kLn2 = 0.69314718055994531f;
      float inv[kCols];
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const int col = 8 * (c >> 1) + c2 + (c & 1), gr = row0 + col;
        const float empty = pc.direct ? INFINITY : -INFINITY;
        const float lse = bad || l[c] != l[c] ? NAN
                                              : (l[c] > 0.f ? (m[c] + log2f(l[c])) * kLn2 : empty);
        // a direct row is final: its sink scales it here (a split row's, in the combine)
        const float keep = pc.direct && p.sink != nullptr && gr < rows_total
                               ? sink_keep(lse, p.sink[gr % p.h_q]) : 1.f;
        // a NaN sum is a NaN row, not an empty one (fmaxf skips NaN scores)
        inv[c] = bad || l[c] != l[c] ? NAN : (l[c] > 0.f ? o_scale / l[c] * keep : 0.f);
        if (warp == 0 && lane < 4 && gr < rows_total) {
          if (pc.direct) {
            const int sq = gr / p.h_q, hq = gr % p.h_q;
            p.lse[(static_cast<int64_t>(pc.req) * p.h_q + hq) * p.s_q + sq] = lse;
          } else {
            p.lse_acc[static_cast<int64_t>(pc.slot) * rows_total + gr] = lse;
          }
        }
      }
      if constexpr (WG == 1) sm90::bar_sync(C::kBarWg, 128);   // red may be rewritten

      // O^T element (value column 64 mt + key slot, query column) / l
#pragma unroll
      for (int i2 = 0; i2 < kAcc; ++i2) {
        const int c = col_slot(i2);
        const int gr = row0 + 8 * (c >> 1) + c2 + (c & 1);
        if (gr >= rows_total) continue;
        // one address per (row, slot), the 8 value tiles at immediate offsets from it (the
        // epilogue runs once per piece from a cold instruction cache: its size is its time)
        // the value column of O^T's M row (register conversion: rows g, g + 8 of a warp
        // hold its columns 2g, 2g + 1, mla_fp8_regs.cuh)
        const int vc = C::kRegs ? 16 * warp + 2 * (lane / 4) + ((i2 >> 1) & 1)
                                : k0 + 8 * ((i2 >> 1) & 1);
        const int64_t base =
            ((pc.direct ? static_cast<int64_t>(pc.req) : static_cast<int64_t>(pc.slot)) *
                 rows_total + gr) * kDV + vc;
        if (pc.direct) {
          T* dst = static_cast<T*>(p.out) + base;
#pragma unroll
          for (int mt = 0; mt < 8; ++mt) dst[64 * mt] = static_cast<T>(o[mt][i2] * inv[c]);
        } else {
          float* dst = p.o_acc + base;
#pragma unroll
          for (int mt = 0; mt < 8; ++mt) dst[64 * mt] = o[mt][i2] * inv[c];
        }
      }
    }
  }

  static __device__ void run(const Params& wp, unsigned char* raw) {
    const Smem sm = carve(raw);
    if (threadIdx.x == 0) {
      for (int s = 0; s < C::kSlots; ++s) {
        // the producer's expect_tx, or FP8: one arrival per converter warp
        // sparse bf16: the producer warpgroup's 128 cp.async arrivals
        sm90::mbar_init(&sm.full[s], C::kFp8 ? 4 * C::kConverters : C::kSparse ? 128 : 1);
        sm90::mbar_init(&sm.empty[s], 4);   // one arrival per warp of the consuming WG
      }
      for (int s = 0; s < C::kRawSlots; ++s) {
        sm90::mbar_init(&sm.raw_full[s], C::kSparse ? 128 : 1);
        // one a converter warp (register conversion: one a consumer warp)
        sm90::mbar_init(&sm.raw_empty[s], 4 * (C::kRegs ? 1 : C::kConverters));
      }
      sm90::fence_mbar_init();
    }
    __syncthreads();
    pdl_wait_primary();   // launched as a dependent of the stream's last kernel
    if constexpr (C::kRegs && WG == 1) {
      if (threadIdx.x < 128)
        consumer(wp.p, sm, 0);
      else if (threadIdx.x == 128)
        producer(wp, sm);
    } else if constexpr (C::kFp8 && !C::kRegs) {
      const int wg = threadIdx.x / 128;
      if (wg == 0) {
        sm90::setmaxnreg_inc<C::kFp8ConsumerRegs>();
        consumer(wp.p, sm, 0);
      } else if (wg <= C::kConverters) {
        sm90::setmaxnreg_dec<C::kConverterRegs>();
        converter(wp.p, sm);
      } else {
        sm90::setmaxnreg_dec<C::kProducerRegs>();
        if constexpr (C::kSparse)
          sparse_producer(wp, sm, threadIdx.x % 128);
        else if (threadIdx.x == 128 * (1 + C::kConverters)) {
          producer(wp, sm);
        }
      }
    } else if constexpr (WG == 1) {
      if (threadIdx.x < 128)
        consumer(wp.p, sm, 0);
      else if (C::kSparse)
        sparse_producer(wp, sm, threadIdx.x - 128);
      else if (threadIdx.x == 128)
        producer(wp, sm);
    } else {
      const int wg = threadIdx.x / 128;
      if (wg < 2) {
        sm90::setmaxnreg_inc<C::kConsumerRegs>();
        consumer(wp.p, sm, wg);
      } else {
        sm90::setmaxnreg_dec<C::kProducerRegs>();
        if (threadIdx.x == 256) producer(wp, sm);
      }
    }
  }
};

template <typename T, int N, int WG, int FAULT, int KV, int CV, int RS, int SP, int MM>
__global__ void __launch_bounds__(WgmmaRowsConfig<N, WG, KV, CV, RS, SP, MM>::kThreads, 1)
mla_split_wgmma_rows_kernel(const __grid_constant__ RowsParams<KV> wp) {
  extern __shared__ __align__(1024) unsigned char smem[];
  WgmmaRowsKernel<T, N, WG, FAULT, KV, CV, RS, SP, MM>::run(wp, smem);
}

template <typename T, int N, int WG, int FAULT, int KV, int CV, int RS, int SP, int MM>
cudaError_t prepare_split_wgmma_rows() {
  static bool done = false;
  if (done) return cudaSuccess;
  cudaError_t e = cudaFuncSetAttribute(mla_split_wgmma_rows_kernel<T, N, WG, FAULT, KV, CV, RS, SP, MM>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       WgmmaRowsConfig<N, WG, KV, CV, RS, SP, MM>::kSmem);
  done = e == cudaSuccess;
  return e;
}

template <typename T, int N, int WG, int FAULT, int KV = kKvNative, int CV = 1, int RS = 2,
          int SP = 0, int MM = 0>
cudaError_t split_wgmma_rows_ctas_per_sm_impl(int* n) {
  cudaError_t e = prepare_split_wgmma_rows<T, N, WG, FAULT, KV, CV, RS, SP, MM>();
  if (e != cudaSuccess) return e;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      n, mla_split_wgmma_rows_kernel<T, N, WG, FAULT, KV, CV, RS, SP, MM>,
      WgmmaRowsConfig<N, WG, KV, CV, RS, SP, MM>::kThreads, WgmmaRowsConfig<N, WG, KV, CV, RS, SP, MM>::kSmem);
}

// The FP8 cache's two tensor maps over its bytes as 16-bit elements (mla_fp8.cuh): the
// latent box (256 elements x 64 keys) and the tail box from element 256 on, both
// unswizzled; reused while the cache tensor is the same (as wgmma_params).  REGS (register
// conversion, mla_fp8_regs.cuh): 128-byte-swizzled latent boxes of 64 elements (128
// columns) and a 64-byte-swizzled rope box (fp8_e4m3's 64 bytes), for ldmatrix.
template <int KV, bool REGS = false>
cudaError_t fp8_params(const MlaParams& p, WgmmaFp8Params* wp) {
  using L = Fp8Layout<KV>;
  if (p.page_size % 64 != 0) return cudaErrorInvalidValue;
  if (KV == kKvE4m3 && p.k_descale == nullptr) return cudaErrorInvalidValue;
  wp->p = p;
  struct Last {
    const void* k = nullptr;
    int64_t page = 0, blocks = 0, st_token = 0, st_block = 0;
    CUtensorMap raw, tail;
  };
  static thread_local Last last;
  if (last.k == p.k && last.page == p.page_size && last.blocks == p.num_blocks &&
      last.st_token == p.k_stride_token && last.st_block == p.k_stride_block && p.k != nullptr) {
    wp->tmap_raw = last.raw;
    wp->tmap_tail = last.tail;
    return cudaSuccess;
  }
  auto encode = tensor_map_encoder();
  if (!encode) return cudaErrorNotSupported;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(L::kTokenBytes / 2),
                              static_cast<cuuint64_t>(p.page_size),
                              static_cast<cuuint64_t>(p.num_blocks)};
  // the strides are in bytes already (a byte is an element of an FP8 cache)
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(p.k_stride_token),
                                 static_cast<cuuint64_t>(p.k_stride_block)};
  static_assert(!REGS || KV == kKvE4m3, "register conversion: fp8_e4m3");
  const cuuint32_t box_raw[3] = {REGS ? 64u : 256u, 64, 1};
  const cuuint32_t box_tail[3] = {static_cast<cuuint32_t>(L::kTailRow / 2), 64, 1};
  const auto sw_raw = REGS ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE;
  const auto sw_tail = REGS ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_NONE;
  const cuuint32_t elem[3] = {1, 1, 1};
  void* base = const_cast<void*>(p.k);
  if (encode(&wp->tmap_raw, CU_TENSOR_MAP_DATA_TYPE_UINT16, 3, base, dims, strides, box_raw,
             elem, CU_TENSOR_MAP_INTERLEAVE_NONE, sw_raw,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) !=
          CUDA_SUCCESS ||
      encode(&wp->tmap_tail, CU_TENSOR_MAP_DATA_TYPE_UINT16, 3, base, dims, strides, box_tail,
             elem, CU_TENSOR_MAP_INTERLEAVE_NONE, sw_tail,
             CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
    return cudaErrorInvalidValue;
  last = Last{p.k, p.page_size, p.num_blocks, p.k_stride_token, p.k_stride_block,
              wp->tmap_raw, wp->tmap_tail};
  return cudaSuccess;
}

template <typename T, int N, int WG, int FAULT, int KV = kKvNative, int CV = 1, int RS = 2,
          int SP = 0, int MM = 0>
cudaError_t launch_split_wgmma_rows_impl(const MlaParams& p, cudaStream_t stream) {
  RowsParams<KV> wp{};
  cudaError_t e;
  if constexpr (SP != 0) {
    wp.p = p;   // sparse: the producer's cp.async take any page size, no tensor map
    e = cudaSuccess;
  } else if constexpr (KV == kKvNative)
    e = wgmma_params<T>(p, &wp);
  else
    e = fp8_params<KV, CV == 0>(p, &wp);
  if (e != cudaSuccess) return e;
  e = prepare_split_wgmma_rows<T, N, WG, FAULT, KV, CV, RS, SP, MM>();
  if (e != cudaSuccess) return e;
  const int rows_total = p.s_q * p.h_q;
  const dim3 grid = split_grid(p.num_parts, (rows_total + N - 1) / N);
  return launch_dependent(mla_split_wgmma_rows_kernel<T, N, WG, FAULT, KV, CV, RS, SP, MM>, grid,
                          WgmmaRowsConfig<N, WG, KV, CV, RS, SP, MM>::kThreads,
                          WgmmaRowsConfig<N, WG, KV, CV, RS, SP, MM>::kSmem, stream, 1, wp);
}

}  // namespace hopper
}  // namespace mlagen
