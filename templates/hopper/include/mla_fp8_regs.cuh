// FP8 caches, "dequantize" mode without a converter warpgroup (mla_wgmma_rows.cuh, CV = 0):
// the consumer warpgroup reads the raw e4m3 bytes from shared memory with ldmatrix,
// converts them in registers to the A fragments of its wgmmas (A from registers), and no
// bf16 copy of the block is ever stored.  A block then costs shared memory its 36 KiB once
// written and twice read (S^T and P V), where the converter's bf16 ring wrote and read 72
// KiB more; and with no ring, the raw slots alone fill shared memory, 4 blocks in flight.
//
// Raw slot (fp8_e4m3, 36 KiB): four latent boxes of 64 keys x 128 bytes (columns [128 q,
// 128 q + 128)), 128-byte swizzle (16-byte chunk c of key r at c ^ (r % 8)), then the rope
// box, 64 keys x 64 bytes, 64-byte swizzle (chunk c of key r at c ^ ((r / 2) % 4)).
//
// S^T = K Q^T, A = K (keys in M): ldmatrix (not transposed) of 8 keys x 16 bytes gives lane
// l the 4 bytes 4 (l % 4) .. + 3 of key l / 4's 16 columns.  The A fragment of m64nNk16
// wants columns 2c, 2c + 1 (register 0) and 2c + 8, 2c + 9 (register 2) of a k16 step:
// bytes 0, 1 go to register 0 and bytes 2, 3 to register 2, so column 4c + j of the cache
// stands at k position 2c + j, and 4c + 2 + j at 2c + 8 + j.  Q is stored permuted the same
// way (Q's 4-byte column pair 2m of each 16 columns at pair m, 2m + 1 at pair m + 4;
// load_q_permuted), and K Q^T sums the same products.
//
// O^T += V^T P^T, A = V^T (value columns in M, keys in K): ldmatrix.trans of 8 keys x 16
// bytes gives lane l, as one 32-bit word, the bytes (key 2 (l % 4), columns 2 (l / 4) and
// + 1), (key 2 (l % 4) + 1, the same columns).  Bytes 0 and 2 (one column, two keys) make
// register 0 of M row l / 4, bytes 1 and 3 register 1 of M row l / 4 + 8: fragment row g
// holds value column 2g, row g + 8 column 2g + 1 of the warp's 16 (the epilogue's vcol).
//
// The MMAs are fp16 (one conversion instruction per two e4m3 values, where the bf16 bit
// placement of mla_fp8.cuh costs five and a NaN pass): every e4m3 value is exact in fp16;
// a bf16 Q row is scaled by a power of two into fp16's range (load_q_permuted, the scale
// undone in the scores' scale); P is rounded to bf16 first, then to fp16, exact for
// P >= 2^-14 (below, fp16 keeps 2^-24 absolute: at most n * 2^-25 of the row sum over n
// keys).
//
// fp8_mma = "mma" (MM = 1): e4m3 wgmmas (m64n16k32, A from registers) on the raw bytes, no
// conversion.  S^T = K Q^T: the k32 8-bit A fragment is register 0 = row l / 4, columns
// 4 (l % 4) .. + 3; register 1 = row l / 4 + 8, the same columns; registers 2, 3 = the same
// rows, columns + 16 (CUTLASS's GMMA ALayout_64x32).  The scores' ldmatrix above (matrices:
// keys 0-7 and 8-15 of chunk c, then of chunk c + 1) gives exactly that: Q is stored in
// plain column order.  Q is quantized per (token, head) row: q_scale = amax |q| / 448 (a zero
// row 1, a row with inf or NaN NaN), e4m3 = rn satfinite (q / q_scale), the scale folded into
// the scores' scale.  O^T += V^T P^T: ldmatrix.trans words w0 (keys 2c, 2c + 1 of keys 0-7,
// columns 2r, 2r + 1) and w1 (keys 8 + 2c, 9 + 2c) make, by two byte permutes, register 0 =
// column 2r at keys {2c, 2c + 1, 8 + 2c, 9 + 2c} (M row r) and register 1 = column 2r + 1
// (M row r + 8), the epilogue's vcol as above; registers 2, 3 the same from keys 16..31.  So
// k position 4c + j of each 16 keys is key {2c, 2c + 1, 8 + 2c, 9 + 2c}[j], and P^T (the B
// operand, [N][64 keys] e4m3) is written in that order (p_kpos).  P (<= 2^kRescaleSlack,
// under e4m3's 448) is rounded to e4m3 unscaled, at an integer running max (log2 units):
// P at any running max is then the final max's P times a power of two, and e4m3 rounding
// commutes with that in its normal range, so the online softmax rounds as one that knew
// the final max (but for weights under the final max's subnormal grid, which it may keep).  The row sum adds the rounded P: the output is a convex combination of
// the values with exactly the weights the MMA used, and the rounding's common part cancels
// (the reference's "p_e4m3" point: 2^(x - ceil(max x)) rounded, divided by the rounded
// sum; lse is that sum's).
#pragma once
#include "mla_fp8.cuh"

namespace mlagen {
namespace hopper {

struct Fp8Regs {
  static constexpr int kBoxBytes = 64 * 128;   // one latent box: 64 keys x 128 columns
};

namespace fp8 {

// Four words (an ldmatrix's) at once.
template <class P, class Q>
__device__ __forceinline__ void e4m3x16_f16(const uint32_t (&r)[4], uint32_t (&lo)[4],
                                            uint32_t (&hi)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) e4m3x4_f16<P, Q>(r[i], lo[i], hi[i]);
}

// The keys of a V^T fragment word kept below `rem` (a piece's last, partial block): half h
// of the word is key k0 + h.
__device__ __forceinline__ uint32_t keep_keys(int k0, int rem) {
  return (k0 < rem ? 0x0000ffffu : 0u) | (k0 + 1 < rem ? 0xffff0000u : 0u);
}

// ---- fp8_mma = "mma"
__device__ __forceinline__ void st_shared_u8(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.u8 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
// x rounded to e4m3 (nearest even, finite values saturate at +-448, NaN stays NaN): the byte
__device__ __forceinline__ uint32_t f32_e4m3(float x) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(0.f), "f"(x));
  return r & 0xffu;
}
// two values into two bytes: lo in byte 0
__device__ __forceinline__ uint32_t f32x2_e4m3(float lo, float hi) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}
// an e4m3 byte's value (exact in fp16)
__device__ __forceinline__ float e4m3_f32(uint32_t b) {
  uint32_t h;
  asm("{\n .reg .b16 t;\n cvt.u16.u32 t, %1;\n cvt.rn.f16x2.e4m3x2 %0, t;\n}\n"
      : "=r"(h) : "r"(b));
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h & 0xffffu)));
}
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}
// The bytes of a V^T A register kept below `rem`: byte j is key k0 + {0, 1, 8, 9}[j].
__device__ __forceinline__ uint32_t keep_key_bytes(int k0, int rem) {
  return (k0 < rem ? 0x000000ffu : 0u) | (k0 + 1 < rem ? 0x0000ff00u : 0u) |
         (k0 + 8 < rem ? 0x00ff0000u : 0u) | (k0 + 9 < rem ? 0xff000000u : 0u);
}
// The k position of a block's key in P^T (the V^T fragments' key order above).
__device__ __forceinline__ int p_kpos(int key) {
  return 16 * (key >> 4) + 4 * ((key & 7) >> 1) + 2 * ((key >> 3) & 1) + (key & 1);
}

}  // namespace fp8
}  // namespace hopper
}  // namespace mlagen
