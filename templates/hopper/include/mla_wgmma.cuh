// The split-KV attention kernel with a warp-specialized wgmma main loop (mainloop = "wgmma").
//
// Same contract as mla_split.cuh (one CTA per part and row tile, here row tiles fastest, the
// scheduler's metadata, direct output for a request's only split, fp32 partials for
// mla_combine otherwise); 64 query rows per tile, 64 keys per block, page sizes that are
// multiples of 64 (a block is one TMA box of one page).
//
// Three warpgroups of 128 threads:
//   WG0 producer   one thread walks the pieces and issues, per 64-key block, 9 TMA copies
//                  (64 keys x 64 columns, 128-byte swizzle) through the block table into one
//                  of two K stages, each slice completing on its own `full` mbarrier; it
//                  waits on a slice's `empty` mbarrier (one arrival per warp that reads it)
//                  before refilling it.
//   WG1 scores     S = Q K^T (36 wgmma m64n64k16, Q and K from shared memory), issued slice
//                  by slice as they land; the online softmax on S in registers; P and the
//                  rescale factor to shared memory for both warpgroups; O[:, 0:256] += P V
//                  (2 x 4 wgmma m64n128k16, P from shared memory).  S of block i+1 is
//                  issued before P V of block i, so the tensor cores have work while the
//                  softmax of block i+1 waits for nothing but its S.  The rope slice and
//                  the right V half are let go once S is done, the left V half once P V
//                  is: P V is two commit groups of 128 columns, and each pair of slices
//                  goes back as soon as its group is done (WG2's likewise).
//   WG2 values     O[:, 256:512] += P V with P read from shared memory, after rescaling its
//                  half of O by the factor WG1 left in shared memory (when a row's max
//                  moved: the conditional rescale, kRescaleSlack in mla_common.cuh).
// V is the first 512 columns of the same K stage, read as an MN-major operand.
//
// Named barriers between WG1 and WG2: PFULL (P and alpha written), PEMPTY (WG2 done with
// P), EPI (row sums for the epilogue).  Keys at or past the piece's end in its last block
// are zeroed in shared memory before any P V (TMA brought whatever the page held there,
// NaN included) and masked to -inf before the softmax; a block-table entry outside
// [0, num_blocks) is out of the tensor map's bounds, so TMA fills zeros, the piece's
// output is NaN and the device error flag (MlaParams::error) is set; so is a negative length.
//
// Token-sparse rows (SP = 1, attention = "sparse"): the producer warpgroup's 128 threads
// gather each block's 64 keys by their slots (mla_sparse.cuh) slice by slice with
// zero-filled cp.async into the same swizzled stages (each slice's full barrier takes the
// 128 threads' cp.async arrivals), in the order slice_at and under the empty barriers as
// the TMA producer; the consumers fence the async proxy after each wait (cp.async writes
// through the generic proxy, wgmma reads through the async one).  WG1 masks a key whose
// slot names none to -inf (a block's validity mask by two ballots a warp, no shared
// memory); a slot past the cache makes the piece NaN and sets kErrorBadPage.  No tail
// zeroing (unnamed keys are zeros), no cluster merge (not built for sparse yet), any page
// size (no tensor map).  setmaxnreg 240 / 208 / 56: the gather's addresses need more than
// the TMA thread's 24.  fp8_ds_mla (KV = kKvDsMla): the same producer warpgroup also
// converts: a block's raw e4m3 tiles land in its own stage's right V half, one block ahead,
// and become bf16 slices in place (sparse_ds_producer): no converter warpgroup (the register
// file has none to spare beside two 64-row consumers) and no raw ring (Q and the two stages
// leave 1.2 KiB).  With h_q = 128 (a token's two 64-head row tiles, side by side in the
// grid) fp8_ds_mla and fp8_ue8m0_paged launch in clusters of 2 along the row tiles (kCross,
// FlashMLA's sparse decode does the same): both CTAs of a cluster walk the same pieces, and
// each converts half of every block's keys (CTA k: keys [32 k, 32 k + 32)) into its own
// stage and, by a bulk copy a warp and slice, the other's, whose
// full barriers take those bytes as transactions; each CTA still gathers the whole RoPE
// slice itself (fp8_e4m3: its keys' RoPE as their latent), and every empty
// barrier takes both CTAs' consumers' arrivals (the other CTA writes into this one's
// stages).  Half the conversion a CTA, where without it both convert every key.  Its keys'
// 8-bit bytes go to registers as a block starts (no raw bytes in the stage, so no
// conversion waits for the next block's gather) and out as bf16 slice pair by slice pair in
// slice_at order, which S then reads (ds_load / ds_put, paged_load / paged_put).
//
// Dense rows on 8-bit caches (SP = 0, KV = kKvDsMla or kKvE4m3): the fp8_ds_mla producer
// above, the crossover wherever a part's row tiles pair up (an even count), each key's
// offset from its page's block-table entry (read a block ahead) instead of an index entry
// (key_entry / key_offset); keys past the piece's end and on a page outside
// [0, num_blocks) gather as zeros (the consumer masks the first and makes the piece NaN for
// the second, as the TMA path does).  fp8_e4m3 (576 e4m3 a token, one descale) converts the
// RoPE too: its 64 raw bytes a key land in the upper half of the key's row of slice 8 and
// are widened in place ahead of the latent tiles (the crossover widens each CTA's keys'
// RoPE straight into both CTAs' slice 8, as their latent); the descale goes into the
// scores' scale and O (the converted keys are the e4m3 values), as in mla_wgmma_rows.cuh.
// With bf16 q, fp8_e4m3 runs fp16 MMAs (kF16): the keys converted to fp16 (one instruction
// for two values), Q rows scaled into fp16's range, P rounded to bf16 and then fp16.
//
// Shared memory: Q 72 KiB (the epilogue's staging once a piece's S is done) | 2 K stages x
// 72 KiB | P 8 KiB | alpha, l (64 floats each) | mbarriers; 1024-byte aligned tiles (the
// swizzle atom).
#pragma once
#include <cstdlib>
#include <cudaTypedefs.h>   // CUtensorMap, PFN_cuTensorMapEncodeTiled (header only)

#include "mla_common.cuh"
#include "mla_fp16_scale.cuh"
#include "mla_scheduler.cuh"
#include "mla_sm90.cuh"
#include "mla_fp8.cuh"
#include "mla_sparse.cuh"

namespace mlagen {
namespace hopper {

struct WgmmaConfig {
  static constexpr int kRows = 64;
  static constexpr int kBlock = 64;
  static constexpr int kThreads = 384;
  static constexpr int kSlices = kD / 64;                 // 9 column slices of 64
  static constexpr int kSliceBytes = 64 * 64 * 2;         // 8 KiB: one TMA box
  static constexpr int kTileBytes = kSlices * kSliceBytes;  // 72 KiB
  static constexpr bool kRope = kSlices == 9;
  static constexpr int kStageRow16 = 256 * 2 + 16;
  static constexpr int kQBytes = kTileBytes >= 8 * 16 * kStageRow16 ? kTileBytes : 8 * 16 * kStageRow16;
  static constexpr int kStages = 2;
  static constexpr int kQOff = 0;
  static constexpr int kKOff = kQOff + kQBytes;
  static constexpr int kPOff = kKOff + kStages * kTileBytes;
  static constexpr int kAlphaOff = kPOff + 64 * 64 * 2;
  static constexpr int kLOff = kAlphaOff + 64 * 4;
  // d_qk 512's fp8_ue8m0_paged (paged_gather): per stage, each key's last 64 latent bytes
  // and its 8-byte scale row, which its stage's right V half has no room for
  static constexpr int kSideOff = kLOff + 64 * 4;
  static constexpr int kSideKeyBytes = 64, kSideScaleOff = 64 * kSideKeyBytes;
  static constexpr int kSideStage = kSideScaleOff + 64 * 8;
  static constexpr int kSideBytes = kRope ? 0 : kStages * kSideStage;
  static constexpr int kBarOff = kSideOff + kSideBytes;
  // mbarriers: a `full` and an `empty` one per slice of each stage.  Slices are freed,
  // refilled and consumed by S in the order slice_at(0..8): the rope slice (read by S
  // alone), then the right V half (S and WG2's P V), then the left half (S and WG1's P V,
  // which now runs under the next block's softmax and so is the last to end)
  static constexpr int kBars = 2 * kStages * kSlices + 2;   // + the cluster merge's two
  static __host__ __device__ constexpr int slice_at(int q) {
    return kRope ? (q == 0 ? 8 : (q <= 4 ? q + 3 : q - 5)) : (q < 4 ? q + 4 : q - 4);
  }
  // arrivals that free a slice: one per warp of each warpgroup reading it
  static __host__ __device__ constexpr int slice_readers(int j) { return j >= 4 && j < 8 ? 8 : 4; }
  static constexpr int kSmem = kBarOff + kBars * 8 + 1024;   // + alignment slack
  // the epilogue's staging (store_o): 9 KiB of the Q tile per consumer warp, 16 rows of 256
  // 16-bit columns (the output, or an fp16 partial), padded so that 8 rows start on
  // distinct banks
  static constexpr int kStageBytes = kQBytes / 8;
  // (d_qk 512 has no 64-row kernel: mla_common.cuh kD)
  static_assert(16 * kStageRow16 <= kStageBytes, "stage");
  static_assert(kKOff % 1024 == 0, "K stages on the swizzle atom");
  // setmaxnreg: the producer warpgroup gives its registers to the consumers, most to WG1
  // (O half, scores, softmax copy, P fragments); ptxas honours it because
  // __launch_bounds__ fixes the entry count at 65536 / 384 = 168
  static constexpr int kEntryRegs = 65536 / 384 / 8 * 8;
  static constexpr int kProducerRegs = 24;
  static constexpr int kScoreRegs = 256;
  static constexpr int kValueRegs = 224;
  // named barriers
  static constexpr int kBarWg1 = 1, kBarPFull = 2, kBarPEmpty = 3, kBarEpi = 4;
  static_assert(kSmem <= 232448, "227 KiB of shared memory per CTA");
  // The cluster merge (mla_scheduler.cuh's cluster plan: clusters of 2 CTAs along the
  // parts, each with one piece of the same request and row tile): CTA k owns output columns
  // [128 k, 128 k + 128) of each warpgroup's 256.  Once both CTAs are done with their K
  // stages, each stages the quarters of its unnormalised O the other owns and its (m, l)
  // per row in slot k of its own K stages, and one bulk copy puts it in slot k of the other
  // CTA's.  The quarters travel in fp16, each (row, warpgroup) scaled by a power of two
  // (merge_out).  A slot row: WG1's 128 halves, WG2's, then m, l and the two scales'
  // inverses: 528 bytes (a warp's 8 rows of fragments on distinct banks).
  static constexpr int kMaxCluster = 2;
  static constexpr int kMergeRow = 528, kMergeSlot = 64 * kMergeRow;
  static constexpr int kMergeStats = 512;   // m, l, then 1 / scale of WG1's and WG2's quarter
  static_assert(2 * kMergeSlot <= kStages * kTileBytes, "merge slots in the K stages");
  static_assert(kProducerRegs * 128 + (kScoreRegs + kValueRegs) * 128 <= 64512, "register file");
};

struct WgmmaParams {
  MlaParams p;
  CUtensorMap tmap_k;   // [num_blocks][page][576] of k_cache, boxes of 64 x 64, swizzled
};

// One request piece of a part (see mla_split.cuh's run()).
struct Piece {
  int req, start, end, slot;
  bool direct;
  int merge;   // the cluster plan's c (metadata [5]), else 0
};

// Grid: (row tiles, parts), the row tile fastest, so that the CTAs of one part, which read
// the same K blocks at the same time, are launched side by side (FlashMLA's order; ncu there
// shows L2 looking up each K sector once for both readers, here twice with parts fastest).
__device__ __forceinline__ int cta_part() { return blockIdx.y; }
__device__ __forceinline__ int cta_row_tile() { return blockIdx.x; }
inline dim3 split_grid(int parts, int row_tiles) { return dim3(row_tiles, parts); }

__device__ __forceinline__ bool next_piece(const MlaParams& p, int& req, Piece& pc) {
  const int* md = p.sched + cta_part() * kMetaInts;
  const int first = md[0], last = md[2];
  if (req < first) req = first;
  if (req > last || req >= p.batch) return false;
  const int seqlen = max(p.seqlens[req], 0);
  int start = req == first ? md[1] : 0;
  int end = req == last ? md[3] : seqlen;
  end = min(end, seqlen);
  start = min(start, end);
  pc.req = req;
  pc.start = start;
  pc.end = end;
  pc.slot = p.num_splits[req] + (req == first ? md[4] : 0);
  pc.direct = p.num_splits[req + 1] - p.num_splits[req] == 1;
  pc.merge = req == first ? md[5] : 0;
  ++req;
  return true;
}

// Whether a block-table entry of the piece's pages, [start / page_size, (end - 1) /
// page_size], is outside [0, num_blocks) or past the table's row (TMA then fills zeros and
// the piece's output must be NaN).  Thread t of `threads` checks every threads-th page: the
// consumers check a piece once, beside its Q load, not at every block.
__device__ __forceinline__ bool piece_has_bad_page(const MlaParams& p, const Piece& pc, int t,
                                                   int threads) {
  bool bad = false;
  if (pc.end > pc.start) {
    const int first = pc.start / p.page_size, last = (pc.end - 1) / p.page_size;
    const int* row = p.block_table + static_cast<int64_t>(pc.req) * p.bt_stride;
    for (int pi = first + t; pi <= last; pi += threads) {
      const int e = pi < p.max_blocks ? row[pi] : -1;
      bad |= e < 0 || e >= p.num_blocks;
    }
  }
  return bad;
}

// FAULT: a planted fault (mla_common.cuh's kFault codes: causal off by one, wrong scale, no
// zeroing of the last block's tail), a template argument so that a faulted library's kernel
// is another symbol than the sound one's (two libraries with one symbol share its statics).
// MERGE: the instance launched in clusters of 2: dense, the cluster merge (merge_out), the
// other instance carrying none of its code (a 57 % larger kernel ran the rows without
// clusters 2-4 % slower); sparse 8-bit pages at h_q 128, the crossover (kCross, above).
template <typename T, int FAULT, bool MERGE, int SP = 0, int KV = kKvNative>
struct WgmmaKernel {
  using C = WgmmaConfig;
  static constexpr bool kSparse = SP != 0;
  // SP = 2: a second pool of keys in the same softmax (mla_sparse.cuh SparseRow)
  static_assert(SP >= 0 && SP <= 2, "SP: 0 dense, 1 one pool, 2 two pools");
  static constexpr bool kExtraPool = SP == 2;
  static_assert(!(kSparse && MERGE) || KV == kKvDsMla || KV == kKvUe8m0,
                "sparse clusters: the 8-bit formats' crossover only");
  // the crossover: a cluster's two CTAs (a token's two row tiles; dense, two row tiles of
  // a part) convert a block half each
  static constexpr bool kCross = (kSparse || KV != kKvNative) && MERGE;
  // keys a producer lane converts a block: CTA k's 32 keys or all 64, 8 lanes a key
  static constexpr int kLaneKeys = kCross ? 2 : 4;
  // the crossover's producer converts from registers (ds_load / ds_put, paged_load /
  // paged_put), the slices in slice_at order
  static __device__ __forceinline__ int key_row(int rank, int warp, int i, int lane) {
    return kCross ? 32 * rank + 8 * warp + 4 * i + (lane >> 3) : 16 * warp + 4 * i + (lane >> 3);
  }

  // 8-bit caches: the producer warpgroup converts what it gathered
  static constexpr bool kFp8 = KV != kKvNative;
  static constexpr bool kE4m3 = KV == kKvE4m3;
  static_assert(!kFp8 || (kSparse ? KV == (kD == 576 ? kKvDsMla : kKvUe8m0)
                                  : KV == kKvDsMla || KV == kKvE4m3),
                "8-bit caches: sparse fp8_ds_mla (d_qk 576) or fp8_ue8m0_paged (512); dense "
                "fp8_ds_mla or fp8_e4m3");
  static_assert(!kFp8 || kE4m3 || std::is_same<T, __nv_bfloat16>::value,
                "bf16 RoPE values: q in bf16");
  // fp8_e4m3 with bf16 q: fp16 MMAs, as mla_fp8_regs.cuh (e4m3 -> fp16 is one instruction
  // for two values, the bf16 placement five and a NaN pass, in a producer that sets the
  // pace): Q rows scaled by a power of two into fp16's range (load_q_f16, undone in the
  // scores' scale), P rounded to bf16, then to fp16 (exact for P >= 2^-14)
  static constexpr bool kF16 = kE4m3 && std::is_same<T, __nv_bfloat16>::value;
  using TM = typename std::conditional<kF16, __half, T>::type;
  // a producer warpgroup gathers (cp.async, st.shared) instead of one TMA thread: the
  // consumers fence the async proxy after each wait; no tail zeroing (unnamed keys are zeros)
  static constexpr bool kGather = kSparse || kFp8;
  static_assert(kD == 576 || kSparse, "d_qk 512: sparse rows");
  // setmaxnreg: sparse, a producer warpgroup of 128 gathering threads (56: offsets of 4
  // keys, the slice loop; fp8_ds_mla 88: also a key's raw chunks and 4 keys' scales), from
  // the consumers' 256 / 224 (ptxas -v: no spills at 56 / 240 / 208 and 88 / 240 / 176;
  // WG1 spills at 232, the FP8 producer at 80)
  static constexpr int kProducerRegs = kFp8 ? 88 : kSparse ? 56 : C::kProducerRegs;
  static constexpr int kScoreRegs = kGather ? 240 : C::kScoreRegs;
  static constexpr int kValueRegs = kFp8 ? 176 : kSparse ? 208 : C::kValueRegs;
  static_assert(kProducerRegs * 128 + (kScoreRegs + kValueRegs) * 128 <= 64512, "register file");
  // (setmaxnreg.inc below the entry count, or .dec above it, is an illegal instruction)
  static_assert(kScoreRegs >= C::kEntryRegs && kValueRegs >= C::kEntryRegs &&
                    kProducerRegs <= C::kEntryRegs,
                "setmaxnreg: .inc for the consumers, .dec for the producer");
  static constexpr uint64_t kAllKeys = ~0ull;

  struct Smem {
    unsigned char* q;
    unsigned char* k;
    unsigned char* p;
    float* alpha;
    float* l;
    unsigned char* side;   // fp8_ue8m0_paged (kSideOff)
    uint64_t* full;    // [2 stages][9 slices]
    uint64_t* empty;   // [2 stages][9 slices]
    uint64_t* free_;   // cluster merge: phase 0 the other CTA's K stages are free, phase 1
                       // this CTA's rows have landed there (one arrival each, remote)
    uint64_t* got;     // cluster merge: the other CTA's rows have landed here (tx bytes)
  };

  static __device__ __forceinline__ Smem carve(unsigned char* raw) {
    unsigned char* base = sm90::smem_align1024(raw);
    Smem sm;
    sm.q = base + C::kQOff;
    sm.k = base + C::kKOff;
    sm.p = base + C::kPOff;
    sm.alpha = reinterpret_cast<float*>(base + C::kAlphaOff);
    sm.l = reinterpret_cast<float*>(base + C::kLOff);
    sm.side = base + C::kSideOff;
    sm.full = reinterpret_cast<uint64_t*>(base + C::kBarOff);
    sm.empty = sm.full + C::kStages * C::kSlices;
    sm.free_ = sm.empty + C::kStages * C::kSlices;
    sm.got = sm.free_ + 1;
    return sm;
  }

  // a consumer warp lets go of stage slot b (kCross: in both CTAs)
  static __device__ __forceinline__ void release(const Smem& sm, int b) {
    sm90::mbar_arrive(&sm.empty[b]);
    if constexpr (kCross)
      sm90::mbar_arrive_remote(sm90::mapa(sm90::smem_addr(&sm.empty[b]),
                                          sm90::cluster_ctarank() ^ 1));
  }

  // the block-table entry of the page holding key t0 (>= 0: unsigned division, fewer
  // registers than signed), -1 past the table
  static __device__ __forceinline__ int page_entry(const MlaParams& p, int req, int t0) {
    const int pi = static_cast<int>(static_cast<unsigned>(t0) / p.page_size);
    return pi < p.max_blocks ? p.block_table[static_cast<int64_t>(req) * p.bt_stride + pi] : -1;
  }

  // ---------------------------------------------------------------- producer (one thread)
  static __device__ void producer(const WgmmaParams& wp, const Smem& sm) {
    const MlaParams& p = wp.p;
    sm90::tma_prefetch_desc(&wp.tmap_k);
    int it = 0, req = 0;
    Piece pc;
    while (next_piece(p, req, pc)) {
      const int n = (pc.end - pc.start + C::kBlock - 1) / C::kBlock;
      for (int i = 0; i < n; ++i, ++it) {
        const int s = it & 1;
        const int t0 = pc.start + i * C::kBlock;
        const int page = page_entry(p, pc.req, t0);
        const int off = t0 % p.page_size;
        unsigned char* dst = sm.k + s * C::kTileBytes;
        uint64_t* full = sm.full + s * C::kSlices;
        uint64_t* empty = sm.empty + s * C::kSlices;
        // each slice as soon as its last reader of two blocks ago has let it go
#pragma unroll
        for (int q = 0; q < C::kSlices; ++q) {
          const int j = C::slice_at(q);
          sm90::mbar_wait(&empty[j], ((it >> 1) & 1) ^ 1);
          sm90::mbar_arrive_expect_tx(&full[j], C::kSliceBytes);
          sm90::tma_load_3d(dst + j * C::kSliceBytes, &wp.tmap_k, &full[j], j * 64, off, page);
        }
      }
    }
  }

  // ------------------------------------------ sparse producer (a warpgroup, 4 x 32 lanes)
  // The dense producer's order and barriers, the TMA box replaced by the gather of
  // mla_sparse.cuh: per block each lane takes its 4 keys' offsets once, then per slice
  // (slice_at order) waits for the slice to be free, copies its 4 chunks and arrives on
  // its full barrier (cp.async.mbarrier.arrive.noinc: 128 arrivals, each once the thread's
  // copies so far have landed).
  static __device__ void sparse_producer(const WgmmaParams& wp, const Smem& sm, int pt) {
    const MlaParams& p = wp.p;
    const int warp = pt / 32, lane = pt % 32;
    const unsigned char* kc = static_cast<const unsigned char*>(p.k);
    const uint32_t kbase = sm90::smem_addr(sm.k);
    int it = 0, req = 0;
    Piece pc;
    const int pr = 16 * warp + (lane & 15);   // lane k's key (sparse_key_offset's)
    while (next_piece(p, req, pc)) {
      const auto row = sparse_row<kExtraPool>(p, pc.req);
      const int n = (pc.end - pc.start + C::kBlock - 1) / C::kBlock;
      int er = sparse_entry(row, pc.start + pr, pc.end);   // index entries a block ahead
#pragma unroll 1
      for (int i = 0; i < n; ++i, ++it) {
        const int s = it & 1;
        const int t0 = pc.start + i * C::kBlock;
        const int nr = sparse_entry(row, t0 + C::kBlock + pr, pc.end);
        int64_t o[4];
        sparse_lane_keys(sparse_key_offset_of(p, row, t0 + pr, er, sizeof(T)), lane, o);
        er = nr;
        uint64_t* full = sm.full + s * C::kSlices;
        uint64_t* empty = sm.empty + s * C::kSlices;
#pragma unroll 1
        for (int q = 0; q < C::kSlices; ++q) {
          const int j = C::slice_at(q);
          sm90::mbar_wait(&empty[j], ((it >> 1) & 1) ^ 1);
          sparse_copy_slice(kc, o, kbase + (s * C::kSlices + j) * C::kSliceBytes, j, warp, lane);
          sm90::cp_async_mbar_arrive(&full[j]);
        }
      }
    }
  }

  // the RoPE's bf16 bytes [528, 656) of the block's 64 keys straight into the swizzled
  // slice 8 (full on the 128 cp.async arrivals), once the slice is free.  fp8_e4m3: its 64
  // e4m3 bytes [512, 576) a key, unswizzled, into the upper half of the key's row (lanes
  // c < 4), widened in place by ds_convert (rope_convert), which fills full[8]
  static __device__ __forceinline__ void ds_rope(const unsigned char* kc, const int64_t (&o)[4],
                                                 uint32_t tile, uint64_t* full, uint64_t* empty,
                                                 uint32_t par, int warp, int lane) {
    using L = Fp8Layout<KV>;
    const int c = lane & 7;
    sm90::mbar_wait(&empty[8], par);
    if constexpr (kE4m3) {
      if (c < 4) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int r = 16 * warp + 4 * i + (lane >> 3);
          const bool ok = sparse_has_key(o[i]);
          sm90::cp_async16_to(tile + 8 * C::kSliceBytes + r * 128 + 64 + c * 16,
                              kc + (ok ? o[i] : 0) + 512 + c * 16, ok);
        }
      }
      return;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = 16 * warp + 4 * i + (lane >> 3);
      const bool ok = sparse_has_key(o[i]);
      sm90::cp_async16_to(tile + 8 * C::kSliceBytes + r * 128 + ((c ^ (r & 7)) << 4),
                          kc + (ok ? o[i] : 0) + L::kTokenBytes - 128 + c * 16, ok);
    }
    sm90::cp_async_mbar_arrive(&full[8]);
  }
  // fp8_e4m3's RoPE slice, once this lane's chunks have landed: lane c of a key reads its 8
  // raw bytes [64 + 8 c, 72 + 8 c) of the row, and after the warp's reads (a key's 8 lanes
  // are in one warp and write only its row) stores them widened as the row's chunk c,
  // swizzled; then each warp's lane 0 arrives on full[8] (count 4)
  static __device__ __forceinline__ void rope_convert(uint32_t tile, uint64_t* full, int warp,
                                                      int lane) {
    const int c = lane & 7;
    uint2 v[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      v[i] = fp8::ld_shared_v2(tile + 8 * C::kSliceBytes +
                               (16 * warp + 4 * i + (lane >> 3)) * 128 + 64 + 8 * c);
    __syncwarp();
    rope_out(tile, v, full, warp, lane);
  }
  // the 8 raw RoPE bytes v[i] of chunk c of key row 16 warp + 4 i + l / 8, widened into the
  // swizzled slice 8 (this CTA's: each CTA of a crossover widens all 64 keys' RoPE)
  static __device__ __forceinline__ void rope_out(uint32_t tile, const uint2 (&v)[4],
                                                  uint64_t* full, int warp, int lane) {
    const int c = lane & 7;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = 16 * warp + 4 * i + (lane >> 3);
      uint32_t w[4];
      fp8::convert8<TM>(v[i].x, v[i].y, w);
      fp8::st_shared_v4(tile + 8 * C::kSliceBytes + r * 128 + ((c ^ (r & 7)) << 4), w[0], w[1],
                        w[2], w[3]);
    }
    sm90::fence_proxy_async();   // the generic stores, for wgmma's reads
    __syncwarp();
    if (lane == 0) sm90::mbar_arrive(&full[8]);
  }

  // a producer's stage for block it: its K tile, full / empty barriers and the parity its
  // empty waits take
  struct Stage {
    int s;
    uint32_t par, tile;
    uint64_t* full;
    uint64_t* empty;
  };
  static __device__ __forceinline__ Stage stage_at(const Smem& sm, int it) {
    const int s = it & 1;
    return {s, ((it >> 1) & 1) ^ 1u, sm90::smem_addr(sm.k) + s * C::kTileBytes,
            sm.full + s * C::kSlices, sm.empty + s * C::kSlices};
  }

  // ------------------------------ sparse fp8_ds_mla producer (a warpgroup): gather, convert
  // Without the crossover (kCross: ds_load / ds_put below, from registers):
  // No room for a raw ring beside Q and the two stages, so a block's raw bytes land in its
  // own stage: lane l of warp w gathers its 4 keys r = 16 w + 4 i + l / 8 (as the bf16
  // gather), chunk c = l % 8 of each 128-byte row: the RoPE's bf16 bytes [528, 656) straight
  // into the swizzled slice 8 (full on the 128 cp.async arrivals), the latent's 128-column
  // tile q (e4m3 bytes [128 q, 128 q + 128)) unswizzled into slice 4 + q (the right V half,
  // which the consumers let go first).  Then, one block behind the gather (so a block's
  // bytes are in flight while the previous one is converted), the same lane converts the
  // chunks it gathered: per key, its 4 raw chunks to registers, __syncwarp (the key's 8
  // lanes are in this warp and its row is all they overwrite), 4 x 16 values times the
  // tile's scale (read from the cache, 16 bytes a key) into slices 2 q + c / 4
  // (st_converted16), then fence, and each warp's lane 0 arrives on full[0..7] (count 4).
  static __device__ __forceinline__ void ds_gather(const Smem& sm, const unsigned char* kc,
                                                   const int64_t (&o)[4], int it, int warp,
                                                   int lane) {
    static_assert(!kCross, "the crossover loads into registers (ds_load)");
    const auto [s, par, tile, full, empty] = stage_at(sm, it);
    const int c = lane & 7;
    ds_rope(kc, o, tile, full, empty, par, warp, lane);
#pragma unroll 1
    for (int q = 0; q < 4; ++q) {
      sm90::mbar_wait(&empty[4 + q], par);
#pragma unroll
      for (int i = 0; i < kLaneKeys; ++i) {
        const int r = key_row(0, warp, i, lane);
        const bool ok = sparse_has_key(o[i]);
        sm90::cp_async16_to(tile + (4 + q) * C::kSliceBytes + r * 128 + c * 16,
                            kc + (ok ? o[i] : 0) + q * 128 + c * 16, ok);
      }
    }
    cp_async_commit();
  }
  template <int PENDING>   // cp.async groups that may stay in flight (the next block's)
  static __device__ __forceinline__ void ds_convert(const Smem& sm, const unsigned char* kc,
                                                    const int64_t (&o)[kLaneKeys], int it,
                                                    int warp, int lane) {
    const auto [s, par, tile, full, empty] = stage_at(sm, it);
    const int c = lane & 7;
    static_assert(PENDING >= 0 && !kCross, "the crossover converts from registers (ds_put)");
    // the 4 tile scales of each key (fp32 powers of two after the latent; none: 0;
    // fp8_e4m3: none, the descale is the consumers')
    float4 sc[kLaneKeys];
#pragma unroll
    for (int i = 0; i < kLaneKeys; ++i)
      sc[i] = !kE4m3 && sparse_has_key(o[i])
                  ? __ldg(reinterpret_cast<const float4*>(kc + o[i] + 512))
                  : make_float4(0.f, 0.f, 0.f, 0.f);
    cp_async_wait<PENDING>();   // this lane's own chunks have landed
    if constexpr (kE4m3) rope_convert(tile, full, warp, lane);   // S reads it first
    // tile by tile (q: raw slice 4 + q into slices 2 q, 2 q + 1), each pair's full barriers
    // as it is done, so that S starts on slices 0 and 1 while the rest convert (score_slice);
    // a tile's raw chunks of the 4 keys are read before any lane writes (__syncwarp: a
    // key's 8 lanes are in this warp and overwrite only its row), which also orders the
    // reads of tiles 0 and 1 before tile 2's writes over them
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      if (q < 2) {   // the left V half, as WG1's P V lets go of each pair
        sm90::mbar_wait(&empty[2 * q], par);
        sm90::mbar_wait(&empty[2 * q + 1], par);
      }
      uint4 v[kLaneKeys];
#pragma unroll
      for (int i = 0; i < kLaneKeys; ++i)
        v[i] = fp8::ld_shared_v4(tile + (4 + q) * C::kSliceBytes +
                                 key_row(0, warp, i, lane) * 128 + c * 16);
      __syncwarp();
#pragma unroll
      for (int i = 0; i < kLaneKeys; ++i)
        ds_tile_out(tile, v[i], sc[i], q, key_row(0, warp, i, lane), c);
      tile_done(full, q, true, warp, lane);
    }
  }
  // chunk c of key row r's latent tile q (v: its 16 e4m3 bytes; sc: the key's 4 tile scales)
  // as 16 bf16 values into slices 2 q + c / 4 of this CTA's stage at tile (kCross: the
  // other CTA's rows follow by peer_copy)
  static __device__ __forceinline__ void ds_tile_out(uint32_t tile, const uint4& v,
                                                     const float4& sc, int q, int r, int c) {
    uint32_t w[8];
    if constexpr (kE4m3) {   // the e4m3 values themselves (the descale: scores' scale, O)
      fp8::convert16<TM, false, false>(v, 0u, w, fp8::odd16(c));
    } else {
      const float f[4] = {sc.x, sc.y, sc.z, sc.w};
      const float scale = f[FAULT == kFaultScaleWrongTile ? (q + 1) & 3 : q];
      // (the dense crossover's producer, the predicated form: the branch form spilled)
      fp8::convert16<T, true, FAULT == kFaultScaleTwice, kCross && !kSparse>(
          v, fp8::scale_bf16x2(scale), w, fp8::odd16(c));
    }
    const int sl = 2 * q + (c >> 2);
    fp8::st_converted16(tile + sl * C::kSliceBytes + r * 128, w, c, r);
  }
  // a warp's rows of tile q are stored: slices 2 q and (two) 2 q + 1 complete
  static __device__ __forceinline__ void tile_done(uint64_t* full, int q, bool two, int warp,
                                                   int lane) {
    sm90::fence_proxy_async();   // the generic stores, for wgmma's reads
    __syncwarp();
    if (lane == 0) {
      // kCross: warp 0's arrival also expects the other CTA's half of the pair's rows
      // (32 keys x 128 bytes a slice; its copies may land before or after)
      if (kCross && warp == 0) {
        sm90::mbar_arrive_expect_tx(&full[2 * q], 32 * 128);
        if (two) sm90::mbar_arrive_expect_tx(&full[2 * q + 1], 32 * 128);
      } else {
        sm90::mbar_arrive(&full[2 * q]);
        if (two) sm90::mbar_arrive(&full[2 * q + 1]);
      }
    }
  }
  // kCross, the register path: no raw bytes in shared memory.  A block's latent chunks of
  // this CTA's 32 keys (lane l: chunk l % 8 of its 2 keys' 4 tiles) and their scales are
  // loaded into registers as the block starts, before its stage is free, so that they are
  // in flight while the producer waits; then the RoPE gather as ds_gather, and the tiles
  // converted into both CTAs' stages in the order the consumers free and read the slices
  // (slice_at: tiles 2, 3, the right V half, then 0, 1).  Unnamed keys load as zeros with
  // scale 0.
  struct DsRegs {
    uint4 v[kLaneKeys][4];
    float4 sc[kLaneKeys];
    uint2 rope[kLaneKeys];   // fp8_e4m3: the same keys' RoPE bytes [512 + 8 c, 520 + 8 c)
  };
  static __device__ __forceinline__ void ds_load(const unsigned char* kc,
                                                 const int64_t (&ol)[kLaneKeys], int lane,
                                                 DsRegs& g) {
    const int c = lane & 7;
#pragma unroll
    for (int i = 0; i < kLaneKeys; ++i) {
      const bool ok = sparse_has_key(ol[i]);
      const unsigned char* src = kc + (ok ? ol[i] : 0);
#pragma unroll
      for (int q = 0; q < 4; ++q)
        g.v[i][q] = ok ? __ldg(reinterpret_cast<const uint4*>(src + q * 128 + c * 16))
                       : make_uint4(0u, 0u, 0u, 0u);
      g.sc[i] = ok && !kE4m3 ? __ldg(reinterpret_cast<const float4*>(src + 512))
                             : make_float4(0.f, 0.f, 0.f, 0.f);
      if constexpr (kE4m3)
        g.rope[i] = ok ? __ldg(reinterpret_cast<const uint2*>(src + 512 + 8 * c))
                       : make_uint2(0u, 0u);
    }
  }
  // A warp's 8 key rows of a slice (1 KiB at offset at; stored and fenced: tile_done) into
  // the same rows of the other CTA's, one bulk copy completing on its full barrier: the
  // copy engine moves them, where 16-byte st.async from every lane held the producer's
  // issue (and its fences waited for their round trips).
  static __device__ __forceinline__ void peer_copy(uint32_t tile, uint32_t rtile, uint32_t at,
                                                   uint32_t rbar, int lane) {
    if (lane == 0) sm90::bulk_copy_cluster(rtile + at, tile + at, 8 * 128, rbar);
  }
  static __device__ __forceinline__ void ds_put(const Smem& sm, const unsigned char* kc,
                                                const int64_t (&o)[4], const DsRegs& g, int it,
                                                int warp, int lane, int rank) {
    const auto [s, par, tile, full, empty] = stage_at(sm, it);
    const int c = lane & 7;
    const uint32_t rtile = sm90::mapa(tile, rank ^ 1);
    const uint32_t rfull = sm90::mapa(sm90::smem_addr(full), rank ^ 1);
    const uint32_t rows = (32 * rank + 8 * warp) * 128;   // this warp's keys' rows of a slice
    if constexpr (kE4m3) {   // this CTA's keys' RoPE, as their latent: into both CTAs' slice 8
      sm90::mbar_wait(&empty[8], par);
#pragma unroll
      for (int i = 0; i < kLaneKeys; ++i) {
        const int r = key_row(rank, warp, i, lane);
        const uint32_t at = 8 * C::kSliceBytes + r * 128 + ((c ^ (r & 7)) << 4);
        uint32_t w[4];
        fp8::convert8<TM>(g.rope[i].x, g.rope[i].y, w);
        fp8::st_shared_v4(tile + at, w[0], w[1], w[2], w[3]);
      }
      tile_done(full, 4, false, warp, lane);   // full[8]
      peer_copy(tile, rtile, 8 * C::kSliceBytes + rows, rfull + 8 * 8, lane);
    } else {
      ds_rope(kc, o, tile, full, empty, par, warp, lane);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int q = (u + 2) & 3;
      sm90::mbar_wait(&empty[2 * q], par);
      sm90::mbar_wait(&empty[2 * q + 1], par);
#pragma unroll
      for (int i = 0; i < kLaneKeys; ++i)
        ds_tile_out(tile, g.v[i][q], g.sc[i], q, key_row(rank, warp, i, lane), c);
      tile_done(full, q, true, warp, lane);
      peer_copy(tile, rtile, 2 * q * C::kSliceBytes + rows, rfull + 2 * q * 8, lane);
      peer_copy(tile, rtile, (2 * q + 1) * C::kSliceBytes + rows, rfull + (2 * q + 1) * 8, lane);
    }
  }
  // -------------------- sparse fp8_ue8m0_paged producer (d_qk 512; a warpgroup): the same
  // scheme for a page's 576-byte data row (448 e4m3, 64 bf16 RoPE) and its 8-byte UE8M0
  // scale row (one scale a 64-value slice): the latent's tiles 0..2 (bytes [128 q, 128 q +
  // 128)) unswizzled into slices 4..6, the RoPE straight into the swizzled slice 7 (full on
  // the 128 cp.async arrivals), and what the stage has no room for in its side buffer:
  // the latent's last 64 bytes (lanes c < 4, a chunk each) and the scale row (lane c = 4).
  // Unnamed keys are zero bytes with scale byte 0, which convert to 0: the conversion needs
  // no offsets.  Then a block later, slices 2 q + c / 4 from chunk c of tile q (q = 3: c < 4,
  // slice 6), each by its slice's scale; full[0..6] on each warp's lane 0.
  // (Without the crossover; kCross: paged_load / paged_put below.)
  // the RoPE's bf16 bytes [448, 576) of the block's 64 keys straight into the swizzled
  // slice 7 (full on the 128 cp.async arrivals), once the slice is free
  static __device__ __forceinline__ void paged_rope(const unsigned char* kc,
                                                    const int64_t (&o)[4], uint32_t tile,
                                                    uint64_t* full, uint64_t* empty,
                                                    uint32_t par, int warp, int lane) {
    const int c = lane & 7;
    sm90::mbar_wait(&empty[7], par);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = 16 * warp + 4 * i + (lane >> 3);
      const bool ok = sparse_has_key(o[i]);
      sm90::cp_async16_to(tile + 7 * C::kSliceBytes + r * 128 + ((c ^ (r & 7)) << 4),
                          kc + (ok ? o[i] : 0) + 448 + c * 16, ok);
    }
    sm90::cp_async_mbar_arrive(&full[7]);
  }
  // the latent's last 64 bytes, chunk c < 4 (tile 3), of the key at o
  static __device__ __forceinline__ const unsigned char* paged_tail(const unsigned char* kc,
                                                                    int64_t o, int c) {
    return kc + (sparse_has_key(o) ? o : 0) + 384 + c * 16;
  }
  // the scale-row byte of slice sl (tile q): one scale a 64-value slice
  static __device__ __forceinline__ int paged_slot(int q, int sl) {
    const int ts = FAULT == kFaultScaleWrongTile ? (sl + 1) % 7 : sl;
    return ts & 7;
  }
  // chunk c of key row r's slice sl (v: 16 e4m3 bytes, e: the slice's UE8M0 byte) as 16
  // bf16 values into this CTA's stage at tile (kCross: the other CTA's rows follow by
  // peer_copy)
  static __device__ __forceinline__ void paged_tile_out(uint32_t tile, const uint4& v,
                                                        uint32_t e, int sl, int r, int c) {
    uint32_t w[8];
    fp8::convert16<T, true, FAULT == kFaultScaleTwice, kCross>(
        v, fp8::ue8m0_bf16x2(e), w, fp8::odd16(c));
    fp8::st_converted16(tile + sl * C::kSliceBytes + r * 128, w, c, r);
  }
  static __device__ __forceinline__ void paged_gather(const Smem& sm, const unsigned char* kc,
                                                      const int64_t (&o)[4],
                                                      const int64_t (&so)[4], int it, int warp,
                                                      int lane) {
    static_assert(!kCross, "the crossover loads into registers (paged_load)");
    const auto [s, par, tile, full, empty] = stage_at(sm, it);
    const int c = lane & 7;
    const uint32_t side = sm90::smem_addr(sm.side) + s * C::kSideStage;
#pragma unroll 1
    for (int q = 0; q < 3; ++q) {
      sm90::mbar_wait(&empty[4 + q], par);
#pragma unroll
      for (int i = 0; i < kLaneKeys; ++i) {
        const int r = key_row(0, warp, i, lane);
        const bool ok = sparse_has_key(o[i]);
        sm90::cp_async16_to(tile + (4 + q) * C::kSliceBytes + r * 128 + c * 16,
                            kc + (ok ? o[i] : 0) + q * 128 + c * 16, ok);
      }
    }
#pragma unroll
    for (int i = 0; i < kLaneKeys; ++i) {
      const int r = key_row(0, warp, i, lane);
      const bool ok = sparse_has_key(o[i]);
      if (c < 4)
        sm90::cp_async16_to(side + r * C::kSideKeyBytes + c * 16, paged_tail(kc, o[i], c), ok);
      else if (c == 4)
        sm90::cp_async8_to(side + C::kSideScaleOff + r * 8, kc + (ok ? so[i] : 0), ok);
    }
    paged_rope(kc, o, tile, full, empty, par, warp, lane);
    cp_async_commit();
  }
  template <int PENDING>   // cp.async groups that may stay in flight (the next block's)
  static __device__ __forceinline__ void paged_convert(const Smem& sm, int it, int warp,
                                                       int lane) {
    const auto [s, par, tile, full, empty] = stage_at(sm, it);
    const int c = lane & 7;
    const uint32_t side = sm90::smem_addr(sm.side) + s * C::kSideStage;
    static_assert(PENDING >= 0 && !kCross, "the crossover converts from registers (paged_put)");
    cp_async_wait<PENDING>();   // this lane's own chunks have landed
    __syncwarp();               // and the scale rows its key's lane 4 copied
    // tile by tile as ds_convert (tile 3 from the side buffer into slice 6, lanes c < 4)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      if (q < 2) {   // the left V half, as WG1's P V lets go of each pair
        sm90::mbar_wait(&empty[2 * q], par);
        sm90::mbar_wait(&empty[2 * q + 1], par);
      }
      const int sl = 2 * q + (c >> 2);
      const int ts = paged_slot(q, sl);
      uint4 v[kLaneKeys];
      uint32_t e[kLaneKeys];
#pragma unroll
      for (int i = 0; i < kLaneKeys; ++i) {
        const int r = key_row(0, warp, i, lane);
        v[i] = fp8::ld_shared_v4(q < 3 ? tile + (4 + q) * C::kSliceBytes + r * 128 + c * 16
                                       : side + r * C::kSideKeyBytes + (c & 3) * 16);
        e[i] = sm90::ld_shared_u8(side + C::kSideScaleOff + r * 8 + ts);
      }
      __syncwarp();
      if (q < 3 || c < 4) {   // (q = 3, c >= 4: slice 7, the RoPE, already in place)
#pragma unroll
        for (int i = 0; i < kLaneKeys; ++i)
          paged_tile_out(tile, v[i], e[i], sl, key_row(0, warp, i, lane), c);
      }
      tile_done(full, q, q < 3, warp, lane);
    }
  }
  // kCross, the register path (as ds_load / ds_put): tiles 0..2 and (lanes c < 4) the
  // tail chunk, and the scale row, loaded as the block starts; then into both CTAs' stages
  // in slice_at order: tile 2 (slices 4, 5), tile 3 (slice 6), the RoPE (slice 7), tiles 0, 1
  struct PagedRegs {
    uint4 v[kLaneKeys][4];
    uint2 e[kLaneKeys];
  };
  static __device__ __forceinline__ void paged_load(const unsigned char* kc,
                                                    const int64_t (&ol)[kLaneKeys],
                                                    const int64_t (&sol)[kLaneKeys], int lane,
                                                    PagedRegs& g) {
    const int c = lane & 7;
#pragma unroll
    for (int i = 0; i < kLaneKeys; ++i) {
      const bool ok = sparse_has_key(ol[i]);
      const unsigned char* src = kc + (ok ? ol[i] : 0);
#pragma unroll
      for (int q = 0; q < 3; ++q)
        g.v[i][q] = ok ? __ldg(reinterpret_cast<const uint4*>(src + q * 128 + c * 16))
                       : make_uint4(0u, 0u, 0u, 0u);
      g.v[i][3] = ok && c < 4 ? __ldg(reinterpret_cast<const uint4*>(paged_tail(kc, ol[i], c)))
                              : make_uint4(0u, 0u, 0u, 0u);
      g.e[i] = ok ? __ldg(reinterpret_cast<const uint2*>(kc + sol[i])) : make_uint2(0u, 0u);
    }
  }
  // (off: this lane's announced RoPE key, sparse_key_offset; spread to the 4 keys it copies
  // only for the RoPE, which keeps 6 registers free while the tiles convert)
  static __device__ __forceinline__ void paged_put(const Smem& sm, const unsigned char* kc,
                                                   int64_t off, const PagedRegs& g, int it,
                                                   int warp, int lane, int rank) {
    const auto [s, par, tile, full, empty] = stage_at(sm, it);
    const int c = lane & 7;
    const uint32_t rtile = sm90::mapa(tile, rank ^ 1);
    const uint32_t rfull = sm90::mapa(sm90::smem_addr(full), rank ^ 1);
    const uint32_t rows = (32 * rank + 8 * warp) * 128;   // this warp's keys' rows of a slice
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int q = (u + 2) & 3;
      sm90::mbar_wait(&empty[2 * q], par);
      if (q < 3) sm90::mbar_wait(&empty[2 * q + 1], par);
      const int sl = 2 * q + (c >> 2);
      const int ts = paged_slot(q, sl);
      if (q < 3 || c < 4) {   // (q = 3, c >= 4: slice 7, the RoPE's)
#pragma unroll
        for (int i = 0; i < kLaneKeys; ++i) {
          const uint32_t e = ((ts < 4 ? g.e[i].x : g.e[i].y) >> (8 * (ts & 3))) & 0xffu;
          paged_tile_out(tile, g.v[i][q], e, sl, key_row(rank, warp, i, lane), c);
        }
      }
      tile_done(full, q, q < 3, warp, lane);
#pragma unroll
      for (int h = 0; h < (q < 3 ? 2 : 1); ++h)   // slices 2 q, 2 q + 1 (tile 3: slice 6)
        peer_copy(tile, rtile, (2 * q + h) * C::kSliceBytes + rows, rfull + (2 * q + h) * 8, lane);
      if (q == 3) {
        int64_t o[4];
        sparse_lane_keys(off, lane, o);
        paged_rope(kc, o, tile, full, empty, par, warp, lane);
      }
    }
  }
  static __device__ void sparse_paged_producer(const WgmmaParams& wp, const Smem& sm, int pt) {
    using L = Fp8Layout<kKvUe8m0>;
    const MlaParams& p = wp.p;
    const int warp = pt / 32, lane = pt % 32;
    const int rank = kCross ? static_cast<int>(sm90::cluster_ctarank()) : 0;
    const unsigned char* kc = static_cast<const unsigned char*>(p.k);
    int it = 0, req = 0;
    Piece pc;
    // lane k's key 16 warp + k % 16 (sparse_key_offset's) and, kCross, its data key 32 rank +
    // 8 warp + k % 8 (as the fp8_ds_mla one): their index entries read a block ahead
    const int pl = 32 * rank + 8 * warp + (lane & 7), pr = 16 * warp + (lane & 15);
    while (next_piece(p, req, pc)) {
      const auto row = sparse_row<kExtraPool>(p, pc.req);
      const int n = (pc.end - pc.start + C::kBlock - 1) / C::kBlock;
      int el = 0;
      if constexpr (kCross) el = sparse_entry(row, pc.start + pl, pc.end);
      int er = sparse_entry(row, pc.start + pr, pc.end);
#pragma unroll 1
      for (int i = 0; i < n; ++i, ++it) {
        const int t0 = pc.start + i * C::kBlock;
        int64_t sc;
        if constexpr (kCross) {
          const int nl = sparse_entry(row, t0 + C::kBlock + pl, pc.end);
          const int nr = sparse_entry(row, t0 + C::kBlock + pr, pc.end);
          // the data and scale rows loaded before the RoPE's offsets are made
          int64_t xs, ol[kLaneKeys], sol[kLaneKeys];
          const int64_t x = sparse_key_offset_of<kExtraPool, L::kRowBytes>(
              p, row, t0 + pl, el, 1, &xs);
#pragma unroll
          for (int k = 0; k < kLaneKeys; ++k) {
            ol[k] = __shfl_sync(0xffffffffu, x, 4 * k + (lane >> 3));
            sol[k] = __shfl_sync(0xffffffffu, xs, 4 * k + (lane >> 3));
          }
          PagedRegs g;
          paged_load(kc, ol, sol, lane, g);
          const int64_t off = sparse_key_offset_of<kExtraPool, L::kRowBytes>(
              p, row, t0 + pr, er, 1, &sc);
          paged_put(sm, kc, off, g, it, warp, lane, rank);
          el = nl;
          er = nr;
        } else {
          const int nr = sparse_entry(row, t0 + C::kBlock + pr, pc.end);
          int64_t o[4], so[4];
          sparse_lane_keys(sparse_key_offset_of<kExtraPool, L::kRowBytes>(
                               p, row, t0 + pr, er, 1, &sc), lane, o);
          er = nr;
          sparse_lane_keys(sc, lane, so);
          paged_gather(sm, kc, o, so, it, warp, lane);
          if (it > 0) paged_convert<1>(sm, it - 1, warp, lane);
        }
      }
    }
    if constexpr (!kCross) {
      if (it > 0) paged_convert<0>(sm, it - 1, warp, lane);
    }
  }

  // A key's entry, read a block ahead of its use: sparse, its index entry; dense, its page's
  // block-table entry (-1 at or past the piece's end); then its byte offset (kNoKey: none).
  static __device__ __forceinline__ int key_entry(const MlaParams& p,
                                                  const SparseRow<kExtraPool>& row, int req,
                                                  int pos, int end) {
    if constexpr (kSparse) {
      return sparse_entry(row, pos, end);
    } else {
      return pos < end ? page_entry(p, req, pos) : -1;
    }
  }
  static __device__ __forceinline__ int64_t key_offset(const MlaParams& p,
                                                       const SparseRow<kExtraPool>& row, int pos,
                                                       int e) {
    if constexpr (kSparse) {
      return sparse_key_offset_of(p, row, pos, e, 1);
    } else {
      if (e < 0 || e >= p.num_blocks) return kNoKey;   // the consumer flags the page
      return static_cast<int64_t>(e) * p.k_stride_block +
             static_cast<int64_t>(static_cast<unsigned>(pos) % p.page_size) * p.k_stride_token;
    }
  }

  static __device__ void convert_producer(const WgmmaParams& wp, const Smem& sm, int pt) {
    const MlaParams& p = wp.p;
    const int warp = pt / 32, lane = pt % 32;
    const unsigned char* kc = static_cast<const unsigned char*>(p.k);
    int it = 0, req = 0;
    Piece pc;
    if constexpr (kCross) {
      const int rank = static_cast<int>(sm90::cluster_ctarank());
      // lane k's latent key: 32 rank + 8 warp + k % 8; its RoPE key: 16 warp + k % 16
      const int pl = 32 * rank + 8 * warp + (lane & 7), pr = 16 * warp + (lane & 15);
      while (next_piece(p, req, pc)) {
        const auto row = sparse_row<kExtraPool>(p, pc.req);
        const int n = (pc.end - pc.start + C::kBlock - 1) / C::kBlock;
        // index entries a block ahead: the next block's load in flight over this one
        int el = key_entry(p, row, pc.req, pc.start + pl, pc.end);
        int er = key_entry(p, row, pc.req, pc.start + pr, pc.end);
#pragma unroll 1
        for (int i = 0; i < n; ++i, ++it) {
          const int t0 = pc.start + i * C::kBlock;
          const int nl = key_entry(p, row, pc.req, t0 + C::kBlock + pl, pc.end);
          const int nr = key_entry(p, row, pc.req, t0 + C::kBlock + pr, pc.end);
          // the latent loaded before the RoPE's offsets are made
          int64_t o[4], ol[kLaneKeys];
          const int64_t x = key_offset(p, row, t0 + pl, el);
#pragma unroll
          for (int k = 0; k < kLaneKeys; ++k)
            ol[k] = __shfl_sync(0xffffffffu, x, 4 * k + (lane >> 3));
          DsRegs g;
          ds_load(kc, ol, lane, g);
          if constexpr (!kE4m3) {   // (fp8_e4m3's RoPE comes with the latent's keys)
            const int64_t xr = key_offset(p, row, t0 + pr, er);   // the RoPE's keys
            sparse_lane_keys(xr, lane, o);
          }
          ds_put(sm, kc, o, g, it, warp, lane, rank);
          el = nl;
          er = nr;
        }
      }
    } else {
      int pend = -1;   // the block gathered and not converted yet
      int64_t po[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) po[k] = kNoKey;
      const int pr = 16 * warp + (lane & 15);   // lane k's key (sparse_key_offset's)
      while (next_piece(p, req, pc)) {
        const auto row = sparse_row<kExtraPool>(p, pc.req);
        const int n = (pc.end - pc.start + C::kBlock - 1) / C::kBlock;
        int er = key_entry(p, row, pc.req, pc.start + pr, pc.end);   // a block ahead
#pragma unroll 1
        for (int i = 0; i < n; ++i, ++it) {
          const int t0 = pc.start + i * C::kBlock;
          const int nr = key_entry(p, row, pc.req, t0 + C::kBlock + pr, pc.end);
          int64_t o[4];
          sparse_lane_keys(key_offset(p, row, t0 + pr, er), lane, o);
          er = nr;
          ds_gather(sm, kc, o, it, warp, lane);
          if (pend >= 0) ds_convert<1>(sm, kc, po, pend, warp, lane);
          pend = it;
#pragma unroll
          for (int k = 0; k < 4; ++k) po[k] = o[k];
        }
      }
      if (pend >= 0) ds_convert<0>(sm, kc, po, pend, warp, lane);
    }
  }

  // Descriptors.  Tiles are 9 slices of [64 rows][128 bytes], 128-byte swizzle; each
  // operand's descriptor is its tile's plus a constant (sm90::desc_at).
  // K-major (Q, K for S = Q K^T; P): k step kk (16 columns) = slice kk / 4, +32 bytes a step.
  static __device__ __forceinline__ sm90::SmemDesc kmajor_tile(const unsigned char* tile) {
    return sm90::make_desc_sw128(sm90::smem_addr(tile), 16, 1024);
  }
  static __device__ __forceinline__ uint64_t kmajor_desc(sm90::SmemDesc tile, int kk) {
    return sm90::desc_at(tile, (kk >> 2) * C::kSliceBytes + (kk & 3) * 32);
  }
  // MN-major V (B of P V): columns [256 h + 64 q, 256 h + 256) = slices 4h+q..4h+3, keys
  // [16 kk, 16 kk + 16) = 2 atoms of 8 rows.
  static __device__ __forceinline__ sm90::SmemDesc v_tile(const unsigned char* tile) {
    return sm90::make_desc_sw128(sm90::smem_addr(tile), C::kSliceBytes, 1024);
  }
  static __device__ __forceinline__ uint64_t v_desc(sm90::SmemDesc tile, int h, int kk,
                                                    int q = 0) {
    return sm90::desc_at(tile, (h * 4 + q) * C::kSliceBytes + kk * 2048);
  }

  // ---------------------------------------------------------------- WG1
  // thread t's first chunk of Q row row0 + t / 2 (its half: t odd, +8 values); ok: a row
  static __device__ __forceinline__ const T* q_row_chunk(const MlaParams& p, int req, int row0,
                                                         int rows_total, int t, bool& ok) {
    const int gr = row0 + (t >> 1);
    ok = gr < rows_total;
    const T* src = static_cast<const T*>(p.q);
    if (ok) src += req * p.q_stride_b + (gr / p.h_q) * p.q_stride_s + (gr % p.h_q) * p.q_stride_h;
    return src + (t & 1) * 8;
  }
  // Q rows [row0, row0 + 64) of a request into the swizzled Q tile (rows past s_q*h_q zero).
  // Threads 2r and 2r + 1 copy row r's even and odd 16-byte chunks: one row address per
  // thread (not a division per chunk), the chunks at immediate offsets from it.
  static __device__ __forceinline__ void load_q(const MlaParams& p, const Smem& sm, int req,
                                                int row0, int rows_total, int t) {
    const int r = t >> 1, odd = t & 1;
    bool ok;
    const T* src = q_row_chunk(p, req, row0, rows_total, t, ok);
    // chunk 2k + odd: slice k / 4, swizzled column ((2k) & 7) ^ odd ^ (r & 7)
    unsigned char* dst = sm.q + r * 128;
    const int x = odd ^ (r & 7);
#pragma unroll
    for (int k = 0; k < kChunks / 2; ++k)
      cp_async16(dst + (k >> 2) * C::kSliceBytes + ((((2 * k) & 7) ^ x) << 4), src + 16 * k, ok);
    cp_async_commit();
  }

  // kF16: Q rows [row0, row0 + 64) as load_q places them, in fp16, each row times 2^e (e =
  // 14 - the exponent of its largest finite |value|, in [-126, 126]: the row's values
  // under 2^15, its small ones exact down to 2^-24 of its largest); returns e of row t / 2.
  // Two passes over the row's chunks (the second from L1), no cp.async.
  static __device__ __forceinline__ int load_q_f16(const MlaParams& p, const Smem& sm, int req,
                                                   int row0, int rows_total, int t) {
    const int r = t >> 1, odd = t & 1;
    bool ok;
    const T* src = q_row_chunk(p, req, row0, rows_total, t, ok);
    const uint4* s4 = reinterpret_cast<const uint4*>(src);   // chunk 2 k + odd: s4[2 k]
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    float mx = 0.f;
#pragma unroll 4
    for (int k = 0; k < kChunks / 2; ++k) {
      const uint4 v = ok ? s4[2 * k] : zero;
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float a = fabsf(__uint_as_float(w[i] << 16));
        const float b = fabsf(__uint_as_float(w[i] & 0xffff0000u));
        mx = a < INFINITY ? fmaxf(mx, a) : mx;   // (inf and NaN pass through unscaled)
        mx = b < INFINITY ? fmaxf(mx, b) : mx;
      }
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));   // the row's other half
    int e = 0;
    if (mx > 0.f)
      e = min(max(14 - (max(static_cast<int>(__float_as_uint(mx) >> 23), 1) - 127), -126), 126);
    const float sc = __uint_as_float(static_cast<uint32_t>(127 + e) << 23);
    const uint32_t dst = sm90::smem_addr(sm.q) + r * 128;
    const int x = odd ^ (r & 7);
#pragma unroll 4
    for (int k = 0; k < kChunks / 2; ++k) {
      const uint4 v = ok ? s4[2 * k] : zero;
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
      uint32_t h[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const __half2 hv = __floats2half2_rn(__uint_as_float(w[i] << 16) * sc,
                                             __uint_as_float(w[i] & 0xffff0000u) * sc);
        h[i] = *reinterpret_cast<const uint32_t*>(&hv);
      }
      fp8::st_shared_v4(dst + (k >> 2) * C::kSliceBytes + ((((2 * k) & 7) ^ x) << 4), h[0], h[1],
                        h[2], h[3]);
    }
    return e;
  }

  // Zero keys [rem, 64) of a stage's V columns (the last block of a piece past its end).
  static __device__ __forceinline__ void zero_tail(unsigned char* tile, int rem, int t) {
    const int chunks = (64 - rem) * 64;   // rows x (8 V slices x 8 chunks)
    const uint32_t base = sm90::smem_addr(tile) + rem * 128;
    for (int c = t; c < chunks; c += 128)
      sm90::st_shared_zero16(base + ((c >> 3) & 7) * C::kSliceBytes + (c >> 6) * 128 +
                             (c & 7) * 16);
    sm90::fence_proxy_async();
    sm90::bar_sync(C::kBarWg1, 128);
  }

  // S = Q K^T, each slice's 4 k steps issued once that slice has landed.
  // S's slice order: as refilled (slice_at), or 8-bit caches as the producer finishes them:
  // the RoPE slice (copied, the last), then the converted ones from 0
  static __device__ __forceinline__ constexpr int score_slice(int q) {
    return kFp8 && !kCross ? (q == 0 ? C::kSlices - 1 : q - 1) : C::slice_at(q);
  }
  static __device__ __forceinline__ void issue_scores(const Smem& sm, const unsigned char* kt,
                                                      uint64_t* full, uint32_t parity,
                                                      float (&s)[32]) {
    const sm90::SmemDesc dq = kmajor_tile(sm.q), dk = kmajor_tile(kt);
#pragma unroll
    for (int q = 0; q < C::kSlices; ++q) {   // the slices in the order they land
      const int j = score_slice(q);
      sm90::mbar_wait(&full[j], parity);
      if constexpr (kGather) sm90::fence_proxy_async();   // cp.async's writes, for wgmma
      sm90::wgmma_fence();   // (after a wait ptxas wants a fresh warpgroup.arrive: C7519)
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if (q == 0 && k == 0)
          sm90::wgmma_m64n64k16_ss_first<TM>(s, kmajor_desc(dq, 4 * j), kmajor_desc(dk, 4 * j));
        else
          sm90::wgmma_m64n64k16_ss<TM>(s, kmajor_desc(dq, 4 * j + k), kmajor_desc(dk, 4 * j + k));
      }
    }
    sm90::wgmma_commit();
  }

  // O[:, 256 half, 256 half + 256) += P V with P from shared memory (half 0: WG1's values,
  // 1: WG2's).  WG1 does not take P from registers: its P V stays in flight through the
  // next block's softmax, and registers a wgmma reads asynchronously are not protected
  // from reuse meanwhile.
  // Two commit groups of 128 columns each (its slices 4 half, 4 half + 1, then the other
  // two): the first pair of slices goes back to the producer while the second is read.
  static __device__ __forceinline__ void issue_pv(const Smem& sm, float (&o)[128],
                                                  const unsigned char* kt, int half) {
    const sm90::SmemDesc dp = kmajor_tile(sm.p), dv = v_tile(kt);
    sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      sm90::wgmma_m64n128k16_ss<TM, 0>(o, kmajor_desc(dp, kk), v_desc(dv, half, kk));
    sm90::wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      sm90::wgmma_m64n128k16_ss<TM, 64>(o, kmajor_desc(dp, kk), v_desc(dv, half, kk, 2));
    sm90::wgmma_commit();
  }
  // O's first 64 registers (columns 0-127 of the half), after the first group's wait
  static __device__ __forceinline__ void fence_first_half(float (&o)[128]) {
#pragma unroll
    for (int i = 0; i < 64; ++i) sm90::reg_fence(o[i]);
  }

  // O *= alpha, a factor per row (this thread's rows r0, r0 + 8), skipped by a warp
  // whose 16 rows all keep their max (warp-uniform: WG1's and WG2's warp w hold the
  // same rows, so both skip together)
  static __device__ __forceinline__ void rescale(float (&o)[128], float a0, float a1) {
    if (__any_sync(0xffffffffu, a0 != 1.f || a1 != 1.f)) {
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        o[4 * j + 0] *= a0;
        o[4 * j + 1] *= a0;
        o[4 * j + 2] *= a1;
        o[4 * j + 3] *= a1;
      }
    }
    sm90::reg_fence(o);   // ahead of the P V's wgmma_fence (else ptxas injects one: C7519)
  }

  // Block it's scores: if the piece ends inside the block, all its slices first and the
  // tail zeroed; else each slice as it lands.
  static __device__ __forceinline__ void start_block(const Smem& sm, int it, int t0, int end,
                                                     int t, float (&s)[32]) {
    const int st = it & 1;
    const uint32_t parity = (it >> 1) & 1;
    unsigned char* kt = sm.k + st * C::kTileBytes;
    uint64_t* full = sm.full + st * C::kSlices;
    if (!kGather && FAULT != kFaultSkipPartialPage && end - t0 < C::kBlock) {
      for (int j = 0; j < C::kSlices; ++j) sm90::mbar_wait(&full[j], parity);
      zero_tail(kt, end - t0, t);
    }
    issue_scores(sm, kt, full, parity, s);
  }

  static __device__ void scores_wg(const MlaParams& p, const Smem& sm) {
    const int t = threadIdx.x, warp = t / 32, lane = t % 32;
    const int rows_total = p.s_q * p.h_q;
    const int row0 = cta_row_tile() * C::kRows;
    const int r0 = warp * 16 + lane / 4;   // this thread's rows: r0, r0 + 8
    const int c2 = 2 * (lane % 4);
    int it = 0, req = 0;
    Piece pc;
    while (next_piece(p, req, pc)) {
      const int n = (pc.end - pc.start + C::kBlock - 1) / C::kBlock;
      const int seqlen = max(p.seqlens[pc.req], 0);
      int lim[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int gr = row0 + r0 + 8 * h;
        int l = 0;
        if (gr < rows_total) l = p.causal ? seqlen - p.s_q + gr / p.h_q + 1 : seqlen;
        lim[h] = min(l + (FAULT == kFaultCausalOffByOne), pc.end);
      }
      // dense 8-bit caches, as mla_wgmma_rows.cuh: fp8_e4m3's k_descale into the scores'
      // scale and O, q's descale (vLLM's descale_q) into the scores' scale; one not finite
      // and > 0 makes the piece NaN and sets kErrorBadDescale (no host check: graph-safe)
      float dk = 1.f, dq = 1.f;
      if constexpr (kE4m3) {
        dk = p.k_descale[pc.req * p.k_descale_stride];
        if constexpr (FAULT == kFaultScaleTwice) dk *= dk;
      }
      if constexpr (kFp8 && !kSparse) {
        if (p.q_descale != nullptr) dq = p.q_descale[pc.req * p.q_descale_stride];
      }
      const bool bad_descale = !(dk > 0.f && dk < INFINITY && dq > 0.f && dq < INFINITY);
      const float scale =
          (FAULT == kFaultWrongScale ? p.scale_log2 * 1.01f : p.scale_log2) * (dk * dq);
      // kF16: each row's scores times 2^-e (load_q_f16; row r0 was loaded by lane
      // 2 (lane / 4) of this warp, r0 + 8 by that lane + 16)
      float sc2[2] = {scale, scale};
      if constexpr (kF16) {
        const int e = load_q_f16(p, sm, pc.req, row0, rows_total, t);
#pragma unroll
        for (int h = 0; h < 2; ++h)
          sc2[h] = scale * __uint_as_float(static_cast<uint32_t>(
                               127 - __shfl_sync(0xffffffffu, e, 2 * (lane >> 2) + 16 * h)) << 23);
      } else {
        load_q(p, sm, pc.req, row0, rows_total, t);
      }
      // beside Q's load (sparse: the slots are checked block by block, sparse_block_mask)
      const bool bad_mine = !kSparse && piece_has_bad_page(p, pc, t, 128);
      const auto row = sparse_row<kExtraPool>(p, pc.req);
      cp_async_wait<0>();
      sm90::fence_proxy_async();
      bool bad = sm90::bar_sync_or(C::kBarWg1, 128, bad_mine);

      float o[128];
#pragma unroll
      for (int i = 0; i < 128; ++i) o[i] = 0.f;
      float s[32];
      float m[2] = {-INFINITY, -INFINITY}, lsum[2] = {0.f, 0.f};
      sm90::reg_fence(o);   // O's zeros are defined before any wgmma is in flight
      // the loop is entered and continued only with S in flight, so the scores the loop
      // carries are always the wgmma's (no copies while a wgmma owns the registers).
      // S of block i + 1 is issued before P V of block i, so that P V runs on the tensor
      // cores while this warpgroup's softmax of block i + 1 waits for nothing but S.
      // (ptxas serializes every wgmma (C7514) if on some path to a read of S or O a wgmma
      // on them may be in flight: the first block's S is waited for before the loop, and
      // on every path back to its head S was committed before P V.)
      if (n > 0) {
        start_block(sm, it, pc.start, pc.end, t, s);
        sm90::wgmma_wait<0>();
      }
      // sparse: the block's index entries, read a block ahead (lane l: keys l and l + 32)
      int ea = 0, eb = 0;
      if constexpr (kSparse) {
        ea = sparse_entry(row, pc.start + lane, pc.end);
        eb = sparse_entry(row, pc.start + 32 + lane, pc.end);
      }
      for (int i = 0; n > 0; ++i) {
        const int bit = it + i, st = bit & 1;
        const int t0 = pc.start + i * C::kBlock;
        // sparse: which of the block's keys are named (while S is in flight)
        uint64_t vmask = kAllKeys;
        if constexpr (kSparse) {
          vmask = sparse_block_mask(p, row, t0, ea, eb, lane, bad);
          ea = sparse_entry(row, t0 + C::kBlock + lane, pc.end);
          eb = sparse_entry(row, t0 + C::kBlock + 32 + lane, pc.end);
        }
        // in flight: S of this block and, behind it, the two halves of P V of the previous
        sm90::wgmma_wait<2>();
        sm90::reg_fence(s);
        // S done: this warpgroup lets go of the block's rope slice and right V half
        if (lane == 0) {
          if constexpr (C::kRope) release(sm, st * C::kSlices + 8);
#pragma unroll
          for (int j = 4; j < 8; ++j) release(sm, st * C::kSlices + j);
        }

        // online softmax (log2 domain) on this thread's 2 rows x 16 keys, on raw scores
        // (the scale is positive: max(s) scale = max(s scale)) and one FFMA + EX2 a key;
        // only a block that reaches a row's limit (a piece's last, causal rows) is masked
        // (into another array: ptxas serializes every wgmma of the kernel (C7515) when
        // non-wgmma instructions write the scores' accumulator registers)
        float xs[32];
        if (t0 + C::kBlock <= min(lim[0], lim[1]) && vmask == kAllKeys) {
#pragma unroll
          for (int e = 0; e < 32; ++e) xs[e] = s[e];
        } else {
#pragma unroll
          for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int k = 8 * j + c2 + (e & 1);   // the key in the block
              const bool named = !kSparse || ((vmask >> k) & 1);   // (dense: no shifts)
              xs[4 * j + e] = t0 + k < lim[e >> 1] && named ? s[4 * j + e] : -INFINITY;
            }
        }
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int e = 0; e < 32; ++e) mx[(e >> 1) & 1] = fmaxf(mx[(e >> 1) & 1], xs[e]);
        float alpha[2], ms[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
          mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
          // the conditional rescale (kRescaleSlack): O's (both warpgroups: 256 FMULs a
          // thread pair) is then skipped for nearly every block
          const float mc = mx[h] * (kF16 ? sc2[h] : scale);
          const bool move = mc > m[h] + kRescaleSlack;   // m = -inf: any finite mc moves
          const float mn = move ? mc : m[h];
          alpha[h] = move ? exp2f(m[h] - mn) : 1.f;
          m[h] = mn;
          ms[h] = mn == -INFINITY ? 0.f : mn;   // a row with every key masked: exp2(-inf) = 0
        }
        float sum[2] = {0.f, 0.f};
#pragma unroll
        for (int e = 0; e < 32; ++e) {
          const int h = (e >> 1) & 1;
          const float pe = exp2f(fmaf(xs[e], kF16 ? sc2[h] : scale, -ms[h]));
          xs[e] = pe;
          sum[h] += pe;
        }
        // the previous block's P V (queued behind this block's S, so about done by now): its
        // left V half goes back to the producer here, mid-softmax; P and O wait for it below
        sm90::wgmma_wait<1>();
        fence_first_half(o);
        if (i > 0 && lane == 0) {
          release(sm, (st ^ 1) * C::kSlices + 0);
          release(sm, (st ^ 1) * C::kSlices + 1);
        }
        sm90::wgmma_wait<0>();
        sm90::reg_fence(o);
        if (i > 0 && lane == 0) {
          release(sm, (st ^ 1) * C::kSlices + 2);
          release(sm, (st ^ 1) * C::kSlices + 3);
        }
        // P as the A fragments of 4 k steps (16 keys each)
        uint32_t pn[4][4];
        if constexpr (kF16) {   // P at the reference's bf16 rounding point, then fp16
#pragma unroll
          for (int e = 0; e < 32; ++e) xs[e] = __bfloat162float(__float2bfloat16_rn(xs[e]));
        }
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          pn[kk][0] = sm90::pack2<TM>(xs[8 * kk + 0], xs[8 * kk + 1]);
          pn[kk][1] = sm90::pack2<TM>(xs[8 * kk + 2], xs[8 * kk + 3]);
          pn[kk][2] = sm90::pack2<TM>(xs[8 * kk + 4], xs[8 * kk + 5]);
          pn[kk][3] = sm90::pack2<TM>(xs[8 * kk + 6], xs[8 * kk + 7]);
        }
        lsum[0] = lsum[0] * alpha[0] + sum[0];
        lsum[1] = lsum[1] * alpha[1] + sum[1];
        // P and alpha for both warpgroups (after WG2 is done with the previous block's P)
        if (i > 0) sm90::bar_sync(C::kBarPEmpty, 256);
        const uint32_t pbase = sm90::smem_addr(sm.p), abase = sm90::smem_addr(sm.alpha);
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int r = r0 + 8 * h;
            sm90::st_shared_u32(pbase + r * 128 + ((j ^ (r & 7)) << 4) + c2 * 2,
                                pn[j >> 1][(j & 1) * 2 + h]);
          }
        if (lane % 4 == 0) {
          sm90::st_shared_f32(abase + r0 * 4, alpha[0]);
          sm90::st_shared_f32(abase + (r0 + 8) * 4, alpha[1]);
        }
        sm90::fence_proxy_async();
        sm90::bar_arrive(C::kBarPFull, 256);
        sm90::bar_sync(C::kBarWg1, 128);   // all of P written, for this warpgroup's P V too
        rescale(o, alpha[0], alpha[1]);
        const unsigned char* kt = sm.k + st * C::kTileBytes;
        if (i + 1 >= n) {   // the last block: its P V alone
          issue_pv(sm, o, kt, 0);
          break;
        }
        // (two copies of the P V issue: on every path back to the loop's head the groups in
        // flight are S then P V, so that ptxas sees S done at wait<1>)
        start_block(sm, bit + 1, t0 + C::kBlock, pc.end, t, s);
        issue_pv(sm, o, kt, 0);
      }
      sm90::wgmma_wait<0>();   // unconditional: ptxas must see every path drained
      sm90::reg_fence(o);
      if (n > 0) {
        if (lane == 0) {   // the last block's left V half
#pragma unroll
          for (int j = 0; j < 4; ++j)
            release(sm, ((it + n - 1) & 1) * C::kSlices + j);
        }
        sm90::bar_sync(C::kBarPEmpty, 256);   // WG2 is done with the last P
      }
      it += n;
      // device error flags, as mla_split.cuh: a bad page (or a length past the table's
      // row) and a negative length make the piece NaN
      const bool bad_len = p.seqlens[pc.req] < 0;
      // metadata planned for a cluster merge this launch cannot do (another batch's or
      // library's): every piece writes NaN and says so, not a silently wrong output
      const bool bad_plan = pc.merge > 0 && !merging(pc);
      if ((bad || bad_len || bad_plan || bad_descale) && t == 0 && p.error != nullptr)
        atomicOr(p.error, (bad ? kErrorBadPage : 0) | (bad_len ? kErrorBadLength : 0) |
                              (bad_plan ? kErrorBadPlan : 0) |
                              (bad_descale ? kErrorBadDescale : 0));
      bad |= bad_len || bad_plan || bad_descale;
      const bool merge = merging(pc);

      // row sums over the 4 threads of a row; lse; l for WG2
      const float kLn2 = 0.69314718055994531f;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float l = lsum[h];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        lsum[h] = bad ? NAN : l;
        const int r = r0 + 8 * h, gr = row0 + r;
        const float empty = pc.direct ? INFINITY : -INFINITY;
        // a NaN sum is a NaN row, not an empty one (fmaxf skips NaN scores)
        const float lse = bad || l != l ? NAN : (l > 0.f ? (m[h] + log2f(l)) * kLn2 : empty);
        if constexpr (kSparse) {
          // a direct row is final: its sink scales it here, O / (l / keep) for both
          // warpgroups (a split row's: the combine; keep 0, sink +inf: l / 0 = inf, out 0)
          if (pc.direct && p.sink != nullptr && gr < rows_total && l > 0.f)
            lsum[h] /= sink_keep(lse, p.sink[gr % p.h_q]);
        }
        if constexpr (kE4m3)   // O times the descale: O / (l / dk), for both warpgroups
          if (FAULT != kFaultDescaleNotInOutput) lsum[h] /= dk;
        if (lane % 4 == 0 && !merge) {
          sm.l[r] = lsum[h];
          if (gr < rows_total) {
            if (pc.direct) {
              const int sq = gr / p.h_q, hq = gr % p.h_q;
              p.lse[(static_cast<int64_t>(pc.req) * p.h_q + hq) * p.s_q + sq] = lse;
            } else {
              p.lse_acc[static_cast<int64_t>(pc.slot) * rows_total + gr] = lse;
            }
          }
        }
      }
      sm90::bar_sync(C::kBarEpi, 256);
      if (merge) {   // the part's only piece
        merge_out(p, pc, sm, o, m, lsum, row0, warp, lane, 0);
        continue;
      }
      store_o(p, pc, sm, o, lsum, row0, warp, lane, 0);
      sm90::bar_sync(C::kBarEpi, 256);   // sm.l and the Q tile may be rewritten now
    }
  }

  // Whether this piece merges through the cluster: the plan says so and the launch's
  // clusters are of the plan's size.
  static __device__ __forceinline__ bool merging(const Piece& pc) {
    return MERGE && !kCross && pc.merge == 2 && sm90::cluster_nctarank() == 2;
  }

  // The cluster merge of one piece (both consumer warpgroups, after the EPI barrier that
  // follows the last P V).  CTA k owns output columns [128 k, 128 k + 128) of each
  // warpgroup's 256, so both warpgroups merge and write at once.  1) WG1's thread 0 expects
  // the other CTA's slot on `got` and tells it that this CTA's K stages are free; 2) each
  // warpgroup stages its quarter the other CTA owns (rank 1 first swaps its fragments'
  // halves, so the owned quarter is always j < 16: compile-time register indices), WG1
  // this CTA's (m, l), in slot `rank`; 3) once the other CTA's stages are free, one bulk
  // copy (shared::cta -> shared::cluster, completing on its `got`) sends the slot; 4) when
  // the other CTA's slot has landed, WG1's thread 0 tells it so at once (its slot may be
  // let go), and each warpgroup weights both quarters by exp2(m_k - M) (M the rows' max
  // over the cluster), adds them (its own first: the same order in every call) and writes
  // out / L, rank 0's WG1 the lse; 5) before the CTA exits, thread 0 waits for the same
  // word on its own slot (the copy reads this CTA's shared memory).
  static __device__ __forceinline__ void merge_out(const MlaParams& p, const Piece& pc,
                                                   const Smem& sm, float (&o)[128],
                                                   const float (&m)[2], const float (&l)[2],
                                                   int row0, int warp, int lane, int half) {
    const int rank = static_cast<int>(sm90::cluster_ctarank()), peer = rank ^ 1;
    const int r0 = warp * 16 + lane / 4, c2 = 2 * (lane % 4);
    const uint32_t mine = sm90::smem_addr(sm.k) + rank * C::kMergeSlot;
    const uint32_t theirs = sm90::smem_addr(sm.k) + peer * C::kMergeSlot;
    const bool lead = half == 0 && warp == 0 && lane == 0;
    if (lead) {
      sm90::mbar_arrive_expect_tx(sm.got, C::kMergeSlot);
      sm90::mbar_arrive_cluster(sm90::mapa(sm90::smem_addr(sm.free_), peer));
    }
    if (rank == 1) {   // owned columns to j < 16 (128 moves, not dynamic register indexing)
#pragma unroll
      for (int i = 0; i < 64; ++i) {
        const float x = o[i];
        o[i] = o[i + 64];
        o[i + 64] = x;
      }
    }
    // The sent quarter in fp16 (fp16_scales): half the bytes of fp32; the copy runs at the
    // cluster network's rate (docs/hopper.md step 32).
    const uint32_t a = mine + r0 * C::kMergeRow + half * 256 + c2 * 2;
    float sc[2], inv[2];
    fp16_scales<16, 16>(o, sc, inv, make_float2(1.f, 1.f));
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t row = a + 8 * h * C::kMergeRow;
#pragma unroll
      for (int j = 0; j < 16; ++j)
        sm90::st_shared_u32(row + j * 16, sm90::pack2<__half>(o[64 + 4 * j + 2 * h] * sc[h],
                                                              o[64 + 4 * j + 2 * h + 1] * sc[h]));
      if (lane % 4 == 0) {
        const uint32_t stats = mine + (r0 + 8 * h) * C::kMergeRow + C::kMergeStats;
        if (half == 0) sm90::st_shared_v2_f32(stats, m[h], l[h]);
        sm90::st_shared_f32(stats + 8 + 4 * half, inv[h]);
      }
    }
    sm90::fence_proxy_async();   // the staging, for the bulk copy's reads
    sm90::bar_sync(C::kBarEpi, 256);
    if (lead) {
      sm90::mbar_wait<true>(sm.free_, 0);
      sm90::bulk_copy_cluster(sm90::mapa(mine, peer), mine, C::kMergeSlot,
                              sm90::mapa(sm90::smem_addr(sm.got), peer));
    }
    sm90::mbar_wait(sm.got, 0);
    if (lead) sm90::mbar_arrive_cluster(sm90::mapa(sm90::smem_addr(sm.free_), peer));
    float w[2][2], L[2], M[2];   // w[k][h]: CTA k's weight on row h
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float2 a0 = sm90::ld_shared_v2_f32((rank == 0 ? mine : theirs) +
                                               (r0 + 8 * h) * C::kMergeRow + C::kMergeStats);
      const float2 b0 = sm90::ld_shared_v2_f32((rank == 0 ? theirs : mine) +
                                               (r0 + 8 * h) * C::kMergeRow + C::kMergeStats);
      M[h] = fmaxf(a0.x, b0.x);
      w[0][h] = M[h] == -INFINITY ? 0.f : exp2f(a0.x - M[h]);   // all empty: 0, not NaN
      w[1][h] = M[h] == -INFINITY ? 0.f : exp2f(b0.x - M[h]);
      if (FAULT == kFaultBadSplitMerge) w[0][h] = w[1][h] = 1.f;   // summed unweighted
      L[h] = a0.y * w[0][h] + b0.y * w[1][h];
    }
    const uint32_t b = theirs + r0 * C::kMergeRow + half * 256 + c2 * 2;
    float ws[2], wp[2];   // this CTA's weight; the other's, times its quarter's 1 / scale
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      ws[h] = rank == 0 ? w[0][h] : w[1][h];
      wp[h] = (rank == 0 ? w[1][h] : w[0][h]) *
              sm90::ld_shared_f32(theirs + (r0 + 8 * h) * C::kMergeRow + C::kMergeStats + 8 +
                                  4 * half);
    }
#pragma unroll
    for (int j = 0; j < 16; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float2 v =
            unpack_half2(sm90::ld_shared_u32(b + 8 * h * C::kMergeRow + j * 16));
        o[4 * j + 2 * h] = fmaf(v.x, wp[h], o[4 * j + 2 * h] * ws[h]);
        o[4 * j + 2 * h + 1] = fmaf(v.y, wp[h], o[4 * j + 2 * h + 1] * ws[h]);
      }
    }
    if (rank == 0 && half == 0 && lane % 4 == 0) {
      const int rows_total = p.s_q * p.h_q;
      const float kLn2 = 0.69314718055994531f;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int gr = row0 + r0 + 8 * h;
        if (gr < rows_total) {
          const float lse =
              L[h] != L[h] ? NAN : (L[h] > 0.f ? (M[h] + log2f(L[h])) * kLn2 : INFINITY);
          const int sq = gr / p.h_q, hq = gr % p.h_q;
          p.lse[(static_cast<int64_t>(pc.req) * p.h_q + hq) * p.s_q + sq] = lse;
        }
      }
    }
    scale_rows<16>(o, L);
    store_direct<16>(p, pc, sm, o, row0, warp, lane, half, 128 * rank);
    sm90::bulk_wait_read();
    if (lead) sm90::mbar_wait<true>(sm.free_, 1);
  }

  // O / l for this thread's 2 rows, columns [256 half, 256 half + 256), written through
  // shared memory: each warp stages its 16 rows in its own 9 KiB of the Q tile (free once
  // the piece's last S is done) and lanes 0-15 copy one row each to global memory with a
  // bulk copy.  (Direct 4-byte stores from the fragments were a quarter of the one-token
  // kernel's stall samples, lg throttle: 8 half-filled sectors per instruction.)  Rows go
  // in one round by stmatrix: the output in T, a partial in fp16 with a power-of-two scale
  // per (row, warpgroup) whose inverse goes to o_scale (fp16_scales; half the bytes of fp32
  // partials for the split to write and the combine to read).  Every lane waits until its
  // copies have read the tile before returning: the next piece's Q load overwrites it.
  static __device__ __forceinline__ void store_o(const MlaParams& p, const Piece& pc,
                                                 const Smem& sm, float (&o)[128],
                                                 const float (&l)[2], int row0, int warp,
                                                 int lane, int half) {
    const float2 il = inv_rows(l);
    float mul[2] = {il.x, il.y}, inv[2];   // a partial's: 1 / l times its fp16 scale
    if (!pc.direct) fp16_scales<0, 32>(o, mul, inv, il);
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        o[4 * j + 2 * h] *= mul[h];
        o[4 * j + 2 * h + 1] *= mul[h];
      }
    if (pc.direct) {
      store_direct(p, pc, sm, o, row0, warp, lane, half);
    } else {
      const int rows_total = p.s_q * p.h_q;
      const uint32_t buf = stage16<__half, 32>(sm, o, warp, lane, half);
      const int gr = row0 + warp * 16 + lane;   // the row lane < 16 copies out
      const int64_t slot0 = static_cast<int64_t>(pc.slot) * rows_total;
      if (lane < 16 && gr < rows_total)   // the combine reads it right after: kept in L2
        sm90::bulk_store_hint(reinterpret_cast<__half*>(p.o_acc) + (slot0 + gr) * kDV +
                                  half * 256,
                              buf + lane * C::kStageRow16, 256 * 2, sm90::l2_policy_evict_last());
      sm90::bulk_commit();
      if (lane % 4 == 0) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = row0 + warp * 16 + lane / 4 + 8 * h;
          if (r < rows_total) p.o_scale[(slot0 + r) * 2 + half] = inv[h];
        }
      }
    }
    sm90::bulk_wait_read();
  }

  // For each row h of this thread, the power of two s that puts the row's largest |pre[h] o|
  // over its quad and the fragments' 8-column groups [J0, J0 + NJ) in [2^14, 2^15): in fp16,
  // s pre[h] o then keeps 11 significant bits relative to that largest value, whatever V's
  // range (NaN and inf pass through, with s = 1).  mul[h] = s pre[h], inv[h] = 1 / s.
  template <int J0, int NJ>
  static __device__ __forceinline__ void fp16_scales(const float (&o)[128], float (&mul)[2],
                                                     float (&inv)[2], float2 pre) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float amax = 0.f;
#pragma unroll
      for (int j = J0; j < J0 + NJ; ++j)
        amax = fmaxf(amax, fmaxf(fabsf(o[4 * j + 2 * h]), fabsf(o[4 * j + 2 * h + 1])));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
      const float ph = h ? pre.y : pre.x;
      const int sb = fp16_scale_biased((__float_as_int(amax * fabsf(ph)) >> 23) & 0xff);
      mul[h] = __int_as_float(sb << 23) * ph;
      inv[h] = __int_as_float((254 - sb) << 23);
    }
  }

  // O / l, a row's l NaN (a bad piece) making the row NaN, 0 making it 0 (no keys).
  // (NJ: the first NJ of the 32 8-column groups)
  static __device__ __forceinline__ float2 inv_rows(const float (&l)[2]) {
    float inv[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) inv[h] = l[h] != l[h] ? NAN : (l[h] > 0.f ? 1.f / l[h] : 0.f);
    return make_float2(inv[0], inv[1]);
  }
  template <int NJ = 32>
  static __device__ __forceinline__ void scale_rows(float (&o)[128], const float (&l)[2]) {
    const float2 inv2 = inv_rows(l);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float inv = h ? inv2.y : inv2.x;
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        o[4 * j + 2 * h] *= inv;
        o[4 * j + 2 * h + 1] *= inv;
      }
    }
  }

  // The output columns [256 half + col, + 8 NJ) of this warp's 16 rows (the fragments' first
  // NJ 8-column groups), in T, staged by stmatrix in the warp's part of the Q tile and
  // copied out a row per lane (store_o; merge_out: 16 groups, col = 128 rank).
  template <int NJ = 32>
  static __device__ __forceinline__ void store_direct(const MlaParams& p, const Piece& pc,
                                                      const Smem& sm, float (&o)[128],
                                                      int row0, int warp, int lane, int half,
                                                      int col = 0) {
    const int rows_total = p.s_q * p.h_q;
    const uint32_t buf = stage16<T, NJ>(sm, o, warp, lane, half);
    const int gr = row0 + warp * 16 + lane;   // the row lane < 16 copies out
    if (lane < 16 && gr < rows_total)
      sm90::bulk_store(static_cast<T*>(p.out) + (static_cast<int64_t>(pc.req) * rows_total + gr) *
                                                     kDV + half * 256 + col,
                       buf + lane * C::kStageRow16, NJ * 8 * sizeof(T));
    sm90::bulk_commit();
  }

  // The fragments' first NJ 8-column groups of this warp's 16 rows, in the 16-bit type TT,
  // by stmatrix into the warp's part of the Q tile; returns its address (row i at
  // + i kStageRow16), ready for the bulk copies.
  template <typename TT, int NJ>
  static __device__ __forceinline__ uint32_t stage16(const Smem& sm, const float (&o)[128],
                                                     int warp, int lane, int half) {
    const uint32_t buf = sm90::smem_addr(sm.q) + (half * 4 + warp) * C::kStageBytes;
    // matrices (row half, 8-column block): (0, j), (1, j), (0, j + 1), (1, j + 1)
    const uint32_t a =
        buf + ((lane & 7) + ((lane >> 3) & 1) * 8) * C::kStageRow16 + (lane >> 4) * 16;
#pragma unroll
    for (int j = 0; j < NJ; j += 2)
      sm90::stmatrix_x4(a + j * 16, sm90::pack2<TT>(o[4 * j], o[4 * j + 1]),
                        sm90::pack2<TT>(o[4 * j + 2], o[4 * j + 3]),
                        sm90::pack2<TT>(o[4 * j + 4], o[4 * j + 5]),
                        sm90::pack2<TT>(o[4 * j + 6], o[4 * j + 7]));
    sm90::fence_proxy_async();
    __syncwarp();
    return buf;
  }

  // ---------------------------------------------------------------- WG2
  static __device__ void values_wg(const MlaParams& p, const Smem& sm) {
    const int t = threadIdx.x - 128, warp = t / 32, lane = t % 32;
    const int row0 = cta_row_tile() * C::kRows;
    const int r0 = warp * 16 + lane / 4;
    int it = 0, req = 0;
    Piece pc;
    while (next_piece(p, req, pc)) {
      const int n = (pc.end - pc.start + C::kBlock - 1) / C::kBlock;
      float o[128];
#pragma unroll
      for (int i = 0; i < 128; ++i) o[i] = 0.f;
      for (int i = 0; i < n; ++i, ++it) {
        const int st = it & 1;
        // this warpgroup's V slices (4-7) of the stage
#pragma unroll
        for (int j = 4; j < 8; ++j) sm90::mbar_wait(&sm.full[st * C::kSlices + j], (it >> 1) & 1);
        if constexpr (kGather) sm90::fence_proxy_async();   // cp.async's writes, for wgmma
        sm90::bar_sync(C::kBarPFull, 256);
        const uint32_t abase = sm90::smem_addr(sm.alpha);
        const float a0 = sm90::ld_shared_f32(abase + r0 * 4);
        const float a1 = sm90::ld_shared_f32(abase + (r0 + 8) * 4);
        rescale(o, a0, a1);
        issue_pv(sm, o, sm.k + st * C::kTileBytes, 1);
        // this block's right V half, as far as this warpgroup goes: slices 4 and 5 as soon
        // as their P V group is done, 6 and 7 after the other
        sm90::wgmma_wait<1>();
        fence_first_half(o);
        if (lane == 0) {
          release(sm, st * C::kSlices + 4);
          release(sm, st * C::kSlices + 5);
        }
        sm90::wgmma_wait<0>();
        sm90::reg_fence(o);
        if (lane == 0) {
          release(sm, st * C::kSlices + 6);
          release(sm, st * C::kSlices + 7);
        }
        sm90::bar_arrive(C::kBarPEmpty, 256);
      }
      sm90::bar_sync(C::kBarEpi, 256);
      if (merging(pc)) {   // the part's only piece; its (m, l) are WG1's, in shared memory
        const float none[2] = {0.f, 0.f};
        merge_out(p, pc, sm, o, none, none, row0, warp, lane, 1);
        continue;
      }
      const float l[2] = {sm.l[r0], sm.l[r0 + 8]};
      store_o(p, pc, sm, o, l, row0, warp, lane, 1);
      sm90::bar_sync(C::kBarEpi, 256);
    }
  }

  static __device__ void run(const WgmmaParams& wp, unsigned char* raw) {
    const Smem sm = carve(raw);
    if (threadIdx.x == 0) {
      for (int s = 0; s < C::kStages * C::kSlices; ++s) {
        // the TMA thread's expect_tx, or sparse: the producer warpgroup's 128 cp.async
        // arrivals (fp8_ds_mla: those for the RoPE slice, a converter warp's for the others)
        const bool rope = s % C::kSlices == C::kSlices - 1;
        sm90::mbar_init(&sm.full[s], kFp8 && (!rope || kE4m3) ? 4 : kGather ? 128 : 1);
        sm90::mbar_init(&sm.empty[s], C::slice_readers(s % C::kSlices) * (kCross ? 2 : 1));
      }
      if (MERGE) {   // the cluster merge's barriers (merge_out)
        sm90::mbar_init(sm.free_, 1);
        sm90::mbar_init(sm.got, 1);
      }
      sm90::fence_mbar_init();
    }
    __syncthreads();
    // in a cluster launch no CTA may arrive on the other's barriers before they exist: the
    // cluster barrier is passed under the previous kernel's tail (PDL)
    if (MERGE) sm90::cluster_arrive_relaxed();
    pdl_wait_primary();   // launched as a dependent of the stream's last kernel
    if (MERGE) sm90::cluster_wait();
    const int wg = threadIdx.x / 128;
    if (wg == 0) {
      sm90::setmaxnreg_inc<kScoreRegs>();
      scores_wg(wp.p, sm);
    } else if (wg == 1) {
      sm90::setmaxnreg_inc<kValueRegs>();
      values_wg(wp.p, sm);
    } else {
      sm90::setmaxnreg_dec<kProducerRegs>();
      if constexpr (KV == kKvUe8m0)
        sparse_paged_producer(wp, sm, threadIdx.x - 256);
      else if constexpr (kFp8)
        convert_producer(wp, sm, threadIdx.x - 256);
      else if constexpr (kSparse)
        sparse_producer(wp, sm, threadIdx.x - 256);
      else if (threadIdx.x == 256)
        producer(wp, sm);
    }
    // kCross: no CTA leaves while the other may still arrive on its barriers
    if constexpr (kCross) {
      __syncwarp();
      sm90::cluster_arrive_relaxed();
      sm90::cluster_wait();
    }
  }
};

template <typename T, int FAULT, bool MERGE, int SP = 0, int KV = kKvNative>
__global__ void __launch_bounds__(WgmmaConfig::kThreads, 1)
mla_split_wgmma_kernel(const __grid_constant__ WgmmaParams wp) {
  extern __shared__ __align__(1024) unsigned char smem[];
  WgmmaKernel<T, FAULT, MERGE, SP, KV>::run(wp, smem);
}

// cuTensorMapEncodeTiled through the runtime's driver entry point (no -lcuda link).
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  if (!fn) {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }
  return fn;
}

// The launch parameters of both wgmma kernels (this one and mla_wgmma_rows.cuh): p, and the
// K tensor map over k_cache as (576 columns, tokens in a page, pages) in boxes of 64 columns
// x 64 keys of one page, 128-byte swizzled (the layout the consumers' descriptors expect).
template <typename T>
cudaError_t wgmma_params(const MlaParams& p, WgmmaParams* wp) {
  // a 64-key block must be one box of one page (the API gives other page sizes the mma_sync
  // kernel, or refuses them for an explicit wgmma schedule)
  if (p.page_size % 64 != 0) return cudaErrorInvalidValue;
  wp->p = p;
  // The last map this host thread encoded, reused while the cache tensor is the same: every
  // layer of a decode step passes one k_cache shape, and encoding is host time per call.
  struct Last {
    const void* k = nullptr;
    int64_t page = 0, blocks = 0, st_token = 0, st_block = 0;
    CUtensorMap map;
  };
  static thread_local Last last;
  if (last.k == p.k && last.page == p.page_size && last.blocks == p.num_blocks &&
      last.st_token == p.k_stride_token && last.st_block == p.k_stride_block && p.k != nullptr) {
    wp->tmap_k = last.map;
    return cudaSuccess;
  }
  auto encode = tensor_map_encoder();
  if (!encode) return cudaErrorNotSupported;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(kD), static_cast<cuuint64_t>(p.page_size),
                              static_cast<cuuint64_t>(p.num_blocks)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(p.k_stride_token) * 2,
                                 static_cast<cuuint64_t>(p.k_stride_block) * 2};
  const cuuint32_t box[3] = {64, 64, 1};
  const cuuint32_t elem[3] = {1, 1, 1};
  // L2 promotion 128 B, not 256: a box row is 128 bytes of a 1152-byte token, so a 256-byte
  // promotion fetches half of a neighbouring slice's row ahead of its own request; a probe
  // streaming shuffled pages with no math read 4.21 TB/s with 256 B and 4.56 with 128 B or
  // none (5569878:benchmarks/tma_stream_probe.cu, H200; 5569878:benchmarks/results/l2promo/)
  const CUtensorMapDataType dt = std::is_same<T, __nv_bfloat16>::value
                                     ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                     : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  if (encode(&wp->tmap_k, dt, 3, const_cast<void*>(p.k), dims, strides, box, elem,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
    return cudaErrorInvalidValue;
  last = Last{p.k, p.page_size, p.num_blocks, p.k_stride_token, p.k_stride_block, wp->tmap_k};
  return cudaSuccess;
}

template <typename T, int FAULT, bool MERGE, int SP = 0, int KV = kKvNative>
cudaError_t prepare_split_wgmma() {
  static bool done = false;
  if (done) return cudaSuccess;
  cudaError_t e = cudaFuncSetAttribute(mla_split_wgmma_kernel<T, FAULT, MERGE, SP, KV>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       WgmmaConfig::kSmem);
  done = e == cudaSuccess;
  return e;
}

template <typename T, int FAULT, int SP = 0, int KV = kKvNative>
cudaError_t split_wgmma_ctas_per_sm_impl(int* n) {
  cudaError_t e = prepare_split_wgmma<T, FAULT, false, SP, KV>();
  if (e != cudaSuccess) return e;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(n, mla_split_wgmma_kernel<T, FAULT, false, SP, KV>,
                                                       WgmmaConfig::kThreads, WgmmaConfig::kSmem);
}

// The cluster size of the split launch (and of the scheduler's cluster plan) for a batch
// over num_parts parts: mla_scheduler.cuh's sched_cluster, given how many clusters of 2
// and of 4 CTAs of this kernel the device holds at once (asked once per process and size;
// a failed query leaves that size out).
// MLAGEN_HOPPER_CLUSTER=0: no clusters, neither the merge nor the crossover (read once per
// process, so the scheduler and the split launch always agree).
inline bool clusters_off() {
  static const bool off = [] {
    const char* v = getenv("MLAGEN_HOPPER_CLUSTER");
    return v != nullptr && v[0] == '0' && v[1] == 0;
  }();
  return off;
}

template <typename T, int FAULT>
int split_wgmma_cluster(int batch, int num_parts) {
  static int resident[WgmmaConfig::kMaxCluster + 1] = {};
  static int device = -1;
  if (clusters_off()) return 1;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 1;
  if (dev != device) {
    if (prepare_split_wgmma<T, FAULT, true>() != cudaSuccess) return 1;
    for (int c = 2; c <= WgmmaConfig::kMaxCluster; c *= 2) {
      cudaLaunchConfig_t cfg{};
      cfg.gridDim = dim3(1, c);
      cfg.blockDim = dim3(WgmmaConfig::kThreads);
      cfg.dynamicSmemBytes = WgmmaConfig::kSmem;
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeClusterDimension;
      attr[0].val.clusterDim.x = 1;
      attr[0].val.clusterDim.y = c;
      attr[0].val.clusterDim.z = 1;
      cfg.attrs = attr;
      cfg.numAttrs = 1;
      int n = 0;
      if (cudaOccupancyMaxActiveClusters(&n, mla_split_wgmma_kernel<T, FAULT, true>, &cfg) !=
          cudaSuccess) {
        cudaGetLastError();   // not sticky: clear it
        n = 0;
      }
      resident[c] = n;
    }
    device = dev;
  }
  return sched_cluster(batch, num_parts, WgmmaConfig::kMaxCluster, resident);
}

// The crossover's parts (split_cluster_parts): its clusters of 2 the device holds at once
// (asked once per process and device; an SM left over in a GPC holds none), capped at
// parts.  An H100 holds fewer than 66 at one CTA an SM, and a 67th part would double a
// call's time (a second wave).
template <typename T, int FAULT, int SP = 0, int KV = kKvNative>
int split_wgmma_cluster_parts(int parts) {
  if constexpr (KV == kKvNative) {
    return parts;
  } else {
    static int resident = 0;
    static int device = -1;
    if (clusters_off()) return parts;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return parts;
    if (dev != device) {
      if (prepare_split_wgmma<T, FAULT, true, SP, KV>() != cudaSuccess) return parts;
      cudaLaunchConfig_t cfg{};
      cfg.gridDim = dim3(2, 1);
      cfg.blockDim = dim3(WgmmaConfig::kThreads);
      cfg.dynamicSmemBytes = WgmmaConfig::kSmem;
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeClusterDimension;
      attr[0].val.clusterDim.x = 2;
      attr[0].val.clusterDim.y = 1;
      attr[0].val.clusterDim.z = 1;
      cfg.attrs = attr;
      cfg.numAttrs = 1;
      int n = 0;
      if (cudaOccupancyMaxActiveClusters(&n, mla_split_wgmma_kernel<T, FAULT, true, SP, KV>,
                                         &cfg) != cudaSuccess) {
        cudaGetLastError();   // not sticky: clear it
        n = 0;
      }
      resident = n;
      device = dev;
    }
    return resident > 0 && resident < parts ? resident : parts;
  }
}

template <typename T, int FAULT, int SP = 0, int KV = kKvNative>
cudaError_t launch_split_wgmma_impl(const MlaParams& p, cudaStream_t stream) {
  const int rows_total = p.s_q * p.h_q;
  const dim3 grid =
      split_grid(p.num_parts, (rows_total + WgmmaConfig::kRows - 1) / WgmmaConfig::kRows);
  if constexpr (SP != 0 || KV != kKvNative) {   // gathered: cp.async of any page size, no tensor map
    WgmmaParams wp{};
    wp.p = p;
    cudaError_t e;
    if constexpr (KV == kKvE4m3) {
      if (p.k_descale == nullptr) return cudaErrorInvalidValue;
    }
    if constexpr (KV != kKvNative) {   // row tiles in pairs (sparse: a token's two): clusters
      if ((SP != 0 ? grid.x == 2 : grid.x % 2 == 0) && !clusters_off()) {
        e = prepare_split_wgmma<T, FAULT, true, SP, KV>();
        if (e != cudaSuccess) return e;
        return launch_dependent(mla_split_wgmma_kernel<T, FAULT, true, SP, KV>, grid,
                                WgmmaConfig::kThreads, WgmmaConfig::kSmem, stream, dim3(2, 1),
                                wp);
      }
    }
    e = prepare_split_wgmma<T, FAULT, false, SP, KV>();
    if (e != cudaSuccess) return e;
    return launch_dependent(mla_split_wgmma_kernel<T, FAULT, false, SP, KV>, grid,
                            WgmmaConfig::kThreads, WgmmaConfig::kSmem, stream, dim3(1, 1), wp);
  } else {
    WgmmaParams wp;
    cudaError_t e = wgmma_params<T>(p, &wp);
    if (e != cudaSuccess) return e;
    if (split_wgmma_cluster<T, FAULT>(p.batch, p.num_parts) == 2) {
      e = prepare_split_wgmma<T, FAULT, true>();
      if (e != cudaSuccess) return e;
      return launch_dependent(mla_split_wgmma_kernel<T, FAULT, true>, grid,
                              WgmmaConfig::kThreads, WgmmaConfig::kSmem, stream, dim3(1, 2), wp);
    }
    e = prepare_split_wgmma<T, FAULT, false>();
    if (e != cudaSuccess) return e;
    return launch_dependent(mla_split_wgmma_kernel<T, FAULT, false>, grid, WgmmaConfig::kThreads,
                            WgmmaConfig::kSmem, stream, dim3(1, 1), wp);
  }
}

}  // namespace hopper
}  // namespace mlagen
