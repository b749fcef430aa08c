// Token-sparse rows (attention = "sparse"): each row's keys are named by its index list
// (the block table's row, entries page * page_size + offset), gathered with 16-byte
// cp.async.  Shared by the few-rows kernel (mla_wgmma_rows.cuh, SP = 1 or 2) and the
// 64-row kernel (mla_wgmma.cuh, SP = 1 or 2): a producer warpgroup of 4 warps, warp w taking
// keys [16 w, 16 w + 16) of each 64-key block.
//
// Lane l < 16 of warp w reads the slot of key 16 w + l once a block (the 64-row kernel a block
// ahead: sparse_entry, then sparse_key_offset_of) and turns it into the
// key's byte offset in the cache (kNoKey: no key); then the warp copies the keys' bytes (slice
// by slice for bf16, key by key into the rows kernel's FP8 raw layout; the offsets broadcast
// from their lanes), zero-filled (src-size 0) where there is no key, so that NaN bytes of
// unnamed slots never enter shared memory.  A slot names no key when
// it is at or past the piece's end, negative, or at or past num_blocks * page_size (that
// last one an error: the consumer makes the row NaN and sets kErrorBadPage).  Two pools
// (SP = 2): each key is the main or the extra pool's by its position (SparseRow), with that
// pool's slots, page size and strides.
#pragma once
#include "mla_common.cuh"
#include "mla_sm90.cuh"

namespace mlagen {
namespace hopper {

// A row's index lists.  One pool (SP = 1): its list, keys [0, end).  Two pools (SP = 2,
// FlashMLA's extra_k_cache): the row's keys are the main list's first split entries (split:
// its length clipped to topk, MlaParams::len1) then the extra list's, so that the split
// scheduler and the pieces run over the keys that count, whatever either pool's topk.
template <bool X>
struct SparseRow {
  const int* idx;    // the main pool's index list
  const int* idx2;   // two pools: the extra pool's
  int split;         // two pools: positions [0, split) are the main pool's
};
template <bool X>
__device__ __forceinline__ SparseRow<X> sparse_row(const MlaParams& p, int req) {
  SparseRow<X> r;
  r.idx = p.block_table + static_cast<int64_t>(req) * p.bt_stride;
  if constexpr (X) {
    r.idx2 = p.idx2 + static_cast<int64_t>(req) * p.idx2_stride;
    r.split = p.len1[req];
  } else {
    r.idx2 = nullptr;
    r.split = 0;
  }
  return r;
}

// A sparse row's index entry at position pos of its keys (the main or the extra list), -1
// at or past the piece's end; read apart from its use where its load should be in flight a
// block ahead.
template <bool X>
__device__ __forceinline__ int sparse_entry(const SparseRow<X>& row, int pos, int end) {
  if (pos >= end) return -1;
  return X && pos >= row.split ? row.idx2[pos - row.split] : row.idx[pos];
}
// The cache slot that entry e (at position pos) names, negative where it names none (a
// negative entry, or -1 for one at or past its pool's slots; bad: that case, an error).
template <bool X>
__device__ __forceinline__ int sparse_slot_of(const MlaParams& p, const SparseRow<X>& row,
                                              int pos, int e, bool& bad) {
  const bool x = X && pos >= row.split;
  const int64_t slots = x ? static_cast<int64_t>(p.num_blocks2) * p.page_size2
                          : static_cast<int64_t>(p.num_blocks) * p.page_size;
  const bool out = static_cast<int64_t>(e) >= slots;
  bad |= out;
  return out ? -1 : e;
}
template <bool X>
__device__ __forceinline__ int sparse_slot(const MlaParams& p, const SparseRow<X>& row, int pos,
                                           int end, bool& bad) {
  if (pos >= end) return -1;
  return sparse_slot_of(p, row, pos, X && pos >= row.split ? row.idx2[pos - row.split]
                                                            : row.idx[pos], bad);
}

// No key: the gather's offsets are relative to the main cache, so an extra pool's key may
// lie below it (a negative offset).
constexpr int64_t kNoKey = INT64_MIN;
__device__ __forceinline__ bool sparse_has_key(int64_t off) { return off != kNoKey; }

// The byte offset from the main cache (p.k) of the key this lane announces for its warp's
// 16 keys of the block at t0 (lanes l and l + 16 alike: key 16 warp + l % 16), kNoKey where
// there is none.  elem: bytes a stride unit (both pools are in one format).
// PAGED (fp8_ue8m0_paged, bytes): a page is its keys' data rows of ROW bytes, then their
// 8-byte scale rows (the view's token stride is no key's); *scale: the key's scale row.
// sparse_key_offset_at: the same for the key at position pos; sparse_key_offset_of: for the
// entry e that sparse_entry read at pos (a block ahead: the load's latency off the chain).
template <bool X, int ROW = 0>
__device__ __forceinline__ int64_t sparse_key_offset_of(const MlaParams& p,
                                                        const SparseRow<X>& row, int pos,
                                                        int e, int elem,
                                                        int64_t* scale = nullptr) {
  const bool x = X && pos >= row.split;
  const int64_t slots = x ? static_cast<int64_t>(p.num_blocks2) * p.page_size2
                          : static_cast<int64_t>(p.num_blocks) * p.page_size;
  if (e < 0 || static_cast<int64_t>(e) >= slots) return kNoKey;   // the consumer flags it
  const int ps = x ? p.page_size2 : p.page_size;
  const int64_t base =
      (x ? reinterpret_cast<intptr_t>(p.k2) - reinterpret_cast<intptr_t>(p.k) : 0) +
      static_cast<int64_t>(e / ps) * (x ? p.k2_stride_block : p.k_stride_block) * elem;
  if constexpr (ROW > 0) {
    *scale = base + static_cast<int64_t>(ps) * ROW + (e % ps) * 8;
    return base + static_cast<int64_t>(e % ps) * ROW;
  }
  return base + (e % ps) * (x ? p.k2_stride_token : p.k_stride_token) * elem;
}
template <bool X, int ROW = 0>
__device__ __forceinline__ int64_t sparse_key_offset_at(const MlaParams& p,
                                                        const SparseRow<X>& row, int pos,
                                                        int end, int elem,
                                                        int64_t* scale = nullptr) {
  return sparse_key_offset_of<X, ROW>(p, row, pos, sparse_entry(row, pos, end), elem, scale);
}
template <bool X, int ROW = 0>
__device__ __forceinline__ int64_t sparse_key_offset(const MlaParams& p, const SparseRow<X>& row,
                                                     int t0, int end, int warp, int lane,
                                                     int elem, int64_t* scale = nullptr) {
  return sparse_key_offset_at<X, ROW>(p, row, t0 + 16 * warp + (lane & 15), end, elem, scale);
}

// Key by key (the rows kernel's FP8 raw layout): this warp's 16 keys of a block, key row
// r = 16 warp + k, its cache bytes at kc + off of lane k (sparse_key_offset), handed with
// its validity to copy(r, src, ok), which issues the row's cp.async (zero-filled where !ok).
template <typename Copy>
__device__ __forceinline__ void sparse_gather_keys(const unsigned char* kc, int64_t off,
                                                   int warp, Copy copy) {
#pragma unroll 4
  for (int k = 0; k < 16; ++k) {
    const int r = 16 * warp + k;
    const int64_t o = __shfl_sync(0xffffffffu, off, k);
    const bool ok = sparse_has_key(o);
    copy(r, kc + (ok ? o : 0), ok);
  }
}

// bf16 slice by slice (each slice completes on its own barrier, so the consumer starts on
// the first while the others land): lane l of warp w copies chunk l % 8 of keys
// 16 w + 4 i + l / 8, i < 4, of each slice.  The keys' offsets once a block (off: lane k's
// is key 16 w + k's, sparse_key_offset):
__device__ __forceinline__ void sparse_lane_keys(int64_t off, int lane, int64_t (&o)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) o[i] = __shfl_sync(0xffffffffu, off, 4 * i + (lane >> 3));
}
// then slice j (bytes [128 j, 128 j + 128) of each bf16 key) into the swizzled slice at
// dst ([64 keys][128 bytes], chunk c of row r at chunk c ^ (r % 8)), zero-filled where a
// key has no offset.
__device__ __forceinline__ void sparse_copy_slice(const unsigned char* kc, const int64_t (&o)[4],
                                                  uint32_t dst, int j, int warp, int lane) {
  const int c = lane & 7;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = 16 * warp + 4 * i + (lane >> 3);
    const bool ok = sparse_has_key(o[i]);
    sm90::cp_async16_to(dst + r * 128 + ((c ^ (r & 7)) << 4),
                        kc + (ok ? o[i] : 0) + j * 128 + c * 16, ok);
  }
}

// The valid keys of the 64-key block at t0 as a mask (bit k: key t0 + k names a key), the
// same in every lane of the warp, from the entries sparse_entry read (a block ahead) at
// t0 + lane (e0) and t0 + 32 + lane (e1).  bad: a slot past the cache in this block (the
// same in every lane).
template <bool X>
__device__ __forceinline__ uint64_t sparse_block_mask(const MlaParams& p, const SparseRow<X>& row,
                                                      int t0, int e0, int e1, int lane,
                                                      bool& bad) {
  bool b = false;
  const uint32_t lo = __ballot_sync(0xffffffffu, sparse_slot_of(p, row, t0 + lane, e0, b) >= 0);
  const uint32_t hi =
      __ballot_sync(0xffffffffu, sparse_slot_of(p, row, t0 + 32 + lane, e1, b) >= 0);
  bad |= __any_sync(0xffffffffu, b);
  return static_cast<uint64_t>(hi) << 32 | lo;
}

}  // namespace hopper
}  // namespace mlagen
