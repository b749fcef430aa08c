// FP8 KV caches in the few-rows wgmma kernel (mla_wgmma_rows.cuh; fp8_ds_mla sparse rows
// also in the 64-row kernel, mla_wgmma.cuh), "dequantize" mode: the
// cache's raw bytes come in by TMA, converter warps turn them into the bf16 (or fp16) K
// slices the consumer warpgroup reads, in the 128-byte-swizzled layout TMA would have
// written, and the consumer's code stays the bf16 kernel's.
//
// Formats (mlagen/kvformat.py):
//   fp8_e4m3    576 bytes a token, e4m3 values; true = e4m3 * k_descale (per tensor or per
//               sequence, fp32).  The descale is folded into the softmax scale and O, so the
//               converted values are the e4m3 values themselves, exact in bf16 and fp16.
//   fp8_ds_mla  656 bytes a token: 512 e4m3 latent | 4 fp32 scales (one per 128 latent
//               values, powers of two) | 64 bf16 RoPE.  Latent = e4m3 * scale, exact in bf16
//               (4 significant bits times a power of two); the RoPE bytes are copied.
//
// TMA views the cache as 16-bit elements (288 or 328 a token; token and page strides are
// multiples of 16 bytes) with two boxes a 64-key block, unswizzled: the latent bytes
// [0, 512) (64 tokens x 512 bytes, 32 KiB) and the tail [512, 576) or [512, 656) (64 x 64 or
// 64 x 144 bytes), into one raw slot.
#pragma once
#include "mla_sm90.cuh"
#include "mla_common.cuh"

namespace mlagen {
namespace hopper {

// (kKvNative: no raw slots)
// fp8_ue8m0_paged (sparse rows only, gathered key by key): a raw block is the 64 keys' data
// rows (448 e4m3 | 64 bf16 RoPE, 576 bytes), then their scale rows (7 UE8M0 bytes and the
// pad byte, in 16 bytes a key).
template <int KV>
struct Fp8Layout {
  static constexpr bool kFp8 = KV != kKvNative;
  static constexpr bool kPaged = KV == kKvUe8m0;
  static constexpr int kTokenBytes = KV == kKvE4m3 ? 576 : KV == kKvDsMla ? 656
                                   : kPaged ? 584 : 512;
  static constexpr int kRowBytes = kPaged ? 576 : 512;           // a key's bytes in the first part
  static constexpr int kLatentBytes = kFp8 ? 64 * kRowBytes : 0;   // the latent box (data rows)
  static constexpr int kTailRow = kPaged ? 16 : kTokenBytes - 512;   // 64, 144 or 16
  static constexpr int kRawBytes = kFp8 ? kLatentBytes + 64 * kTailRow : 0;   // a block's slot
  static_assert(kRawBytes % 1024 == 0, "raw slots on 1024-byte boundaries");
  static_assert(kTailRow % 16 == 0, "16-byte box rows");
};

namespace fp8 {

// prmt.b32 with a zero second word: a selector nibble of 8 + i replicates byte i's sign bit
// over the result byte (PTX ISA, prmt's default mode).
__device__ __forceinline__ uint32_t prmt0(uint32_t a, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, 0, %2;\n" : "=r"(d) : "r"(a), "r"(sel));
  return d;
}

// 4 e4m3 bytes (little-endian in w) -> 2 bf16x2 words holding each value times 2^-120,
// exactly: the sign to bit 15 and the 7 exponent-mantissa bits to bits 4..10 make a bf16
// with e4m3's exponent field (bias 7 instead of 127) and its 3 mantissa bits on top, a bf16
// subnormal for an e4m3 subnormal.  prmt makes each half the byte sign-extended to 16 bits;
// shifted left by 4, the mask keeps the sign (bit 15) and the low 7 bits (4..10) and drops
// the byte's own sign bit (now bit 11) and what the low half pushed into the high one.
// e4m3's NaN (S.1111.111) reads as +-480 * 2^-120 here: convert16 ORs NaN over it.
// (w, or where `sel` says so the word b: prmt over the pair {b, a}, its sign-replicating
// selector nibbles 8 + i, the byte indices 0-3 a's and 4-7 b's)
__device__ __forceinline__ uint32_t prmt2(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}
struct PlaceSel {   // the placement's prmt selectors: from a, or (swap) from b
  uint32_t lo, hi;
  __device__ __forceinline__ explicit PlaceSel(bool swap)
      : lo(swap ? 0xd5c4u : 0x9180u), hi(swap ? 0xf7e6u : 0xb3a2u) {}
};
__device__ __forceinline__ void e4m3x4_placed(uint32_t a, uint32_t b, PlaceSel sel,
                                              uint32_t& lo, uint32_t& hi) {
  lo = (prmt2(a, b, sel.lo) << 4) & 0x87f087f0u;
  hi = (prmt2(a, b, sel.hi) << 4) & 0x87f087f0u;
}

// Bit 7 of each byte of the result is set iff that e4m3 byte is NaN: its 7 low bits are
// all ones, so adding 1 carries into bit 7 (and no further: each byte's sum is <= 0x80).
__device__ __forceinline__ uint32_t e4m3_nan_bits(uint32_t w) {
  return (w & 0x7f7f7f7fu) + 0x01010101u;
}

// A bf16 NaN (0x7fc0) ORed over the placed halves of w's NaN bytes: prmt replicates each
// byte's bit 7 over the half it fills (a NaN in a token in use propagates, as
// docs/conventions.md promises).
__device__ __forceinline__ void e4m3_nan_halves(uint32_t w, uint32_t& lo, uint32_t& hi) {
  const uint32_t nan = e4m3_nan_bits(w);
  lo |= prmt0(nan, 0x9988u) & 0x7fc07fc0u;
  hi |= prmt0(nan, 0xbbaau) & 0x7fc07fc0u;
}

__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
constexpr uint32_t kTwo120 = 0x7B807B80u;   // bf16x2 (2^120, 2^120)
constexpr uint32_t kMaxFusedExp = 134u << 7;  // bf16 exponent field of 2^7

// Two bytes of a 4-byte word, B0 to the low half of a pair, B1 to the high: prmt's
// selector (the low 16 bits of the result).
template <int B0, int B1>
struct Pair {
  static constexpr uint32_t kBytes = B0 | B1 << 4;
};

// 4 e4m3 bytes -> two fp16x2 words, lo = (P::B0, P::B1), hi = (Q::B0, Q::B1), by the
// hardware conversion (exact: every e4m3 value is an fp16; NaN stays NaN).  Where a pair
// is a half of the word as stored (S^T's fragments), the conversion reads that half.
template <class P, class Q>
__device__ __forceinline__ void e4m3x4_f16(uint32_t w, uint32_t& lo, uint32_t& hi) {
  // one prmt puts both pairs in place (none where they are the word's halves already)
  constexpr uint32_t kSel = P::kBytes | Q::kBytes << 8;
  if constexpr (kSel == 0x3210) {
    asm("{\n .reg .b16 x, y;\n mov.b32 {x, y}, %2;\n"
        " cvt.rn.f16x2.e4m3x2 %0, x;\n cvt.rn.f16x2.e4m3x2 %1, y;\n}\n"
        : "=r"(lo), "=r"(hi) : "r"(w));
  } else {
    asm("{\n .reg .b32 a;\n .reg .b16 x, y;\n prmt.b32 a, %2, 0, %3;\n"
        " mov.b32 {x, y}, a;\n"
        " cvt.rn.f16x2.e4m3x2 %0, x;\n cvt.rn.f16x2.e4m3x2 %1, y;\n}\n"
        : "=r"(lo), "=r"(hi) : "r"(w), "n"(kSel));
  }
}

// 16 e4m3 bytes -> 16 values of T (8 words), each times `scale2` (a bf16x2 power of two;
// ds_mla's tile scale) unless SCALED is false.  TWICE: the planted fault, the scale twice.
// swap: the halves in the other order (o[0..3] from bytes 8..15, o[4..7] from 0..7), as
// st_converted16 stores them in the odd slice's lanes; bf16 folds it into the placement's
// prmt (no select of the words).
// bf16: the placed values times 2^120 * scale in one multiply, exact (a power of two), where
// that factor is a finite bf16 (scale <= 2^7, the quantizer's scales by far).  The rest is
// one branch, taken only for hostile input (a NaN byte: the quantizers saturate at 448; a
// huge, infinite or NaN scale): NaN ORed over the NaN bytes' halves, then times 2^120 and
// the scale apart.  One branch, not a select per word: ptxas computed the second multiply
// on every word and selected (16 extra instructions a call, an eighth of the 64-row
// crossover producer's).
// PRED: the rare cases predicated instead (a NaN fix-up branch, the large scale's second
// multiply on every word, selected): fewer registers live across a run of calls, for the
// two-pool crossover producer, which the branch form spilled at its 88 registers.
template <typename T, bool SCALED, bool TWICE, bool PRED = false>
__device__ __forceinline__ void convert16(const uint4& v, uint32_t scale2, uint32_t (&o)[8],
                                          bool swap) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    bool huge = false;
    uint32_t f = kTwo120;
    if constexpr (SCALED) {
      huge = (scale2 & 0x7f80u) > kMaxFusedExp;
      f = PRED && huge ? kTwo120 : mul_bf16x2(scale2, kTwo120);
    }
    const PlaceSel sel(PRED ? false : swap);
#pragma unroll
    for (int i = 0; i < 4; ++i) e4m3x4_placed(w[i], w[i ^ 2], sel, o[2 * i], o[2 * i + 1]);
    const uint32_t any = (e4m3_nan_bits(w[0]) | e4m3_nan_bits(w[1]) | e4m3_nan_bits(w[2])
                          | e4m3_nan_bits(w[3])) & 0x80808080u;
    if constexpr (PRED) {   // (and the swap by selects of the words: no live selectors)
      static_assert(SCALED, "the predicated form is the scaled one");
      if (any) {
#pragma unroll
        for (int i = 0; i < 4; ++i) e4m3_nan_halves(w[i], o[2 * i], o[2 * i + 1]);
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        o[i] = mul_bf16x2(o[i], f);
        if (huge) o[i] = mul_bf16x2(o[i], scale2);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const uint32_t a = swap ? o[4 + e] : o[e], b = swap ? o[e] : o[4 + e];
        o[e] = a;
        o[4 + e] = b;
      }
    } else if (any || huge) {
#pragma unroll
      for (int i = 0; i < 4; ++i)
        e4m3_nan_halves(swap ? w[i ^ 2] : w[i], o[2 * i], o[2 * i + 1]);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        o[i] = mul_bf16x2(o[i], kTwo120);
        if constexpr (SCALED) o[i] = mul_bf16x2(o[i], scale2);
      }
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) o[i] = mul_bf16x2(o[i], f);
    }
    if constexpr (SCALED && TWICE) {
#pragma unroll
      for (int i = 0; i < 8; ++i) o[i] = mul_bf16x2(o[i], scale2);
    }
  } else {
    // fp16 (fp8_e4m3 only: e4m3 is exact in fp16; the hardware conversion)
    static_assert(!SCALED, "fp8_ds_mla needs bf16 (its RoPE values are bf16)");
#pragma unroll
    for (int i = 0; i < 4; ++i)
      e4m3x4_f16<Pair<0, 1>, Pair<2, 3>>(swap ? w[i ^ 2] : w[i], o[2 * i], o[2 * i + 1]);
  }
}

// 8 e4m3 bytes (a, b, little-endian) -> 8 values of T (4 words) unscaled, as convert16
// (fp8_e4m3's RoPE: 64 bytes a key, 8 a lane)
template <typename T>
__device__ __forceinline__ void convert8(uint32_t a, uint32_t b, uint32_t (&o)[4]) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    const PlaceSel sel(false);
    e4m3x4_placed(a, a, sel, o[0], o[1]);
    e4m3x4_placed(b, b, sel, o[2], o[3]);
    if ((e4m3_nan_bits(a) | e4m3_nan_bits(b)) & 0x80808080u) {
      e4m3_nan_halves(a, o[0], o[1]);
      e4m3_nan_halves(b, o[2], o[3]);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) o[i] = mul_bf16x2(o[i], kTwo120);
  } else {
    e4m3x4_f16<Pair<0, 1>, Pair<2, 3>>(a, o[0], o[1]);
    e4m3x4_f16<Pair<0, 1>, Pair<2, 3>>(b, o[2], o[3]);
  }
}

// A UE8M0 scale byte (2^(e - 127); 255: NaN) as bf16x2: bf16 has fp32's exponent range, so
// the byte is the exponent field (e = 0, 2^-127, a bf16 subnormal).
__device__ __forceinline__ uint32_t ue8m0_bf16x2(uint32_t e) {
  const uint32_t b = e == 255u ? 0x7fc0u : e == 0u ? 0x0040u : e << 7;
  return b | (b << 16);
}

// A power-of-two fp32 scale as bf16x2 (its low 16 bits are zero).
__device__ __forceinline__ uint32_t scale_bf16x2(float s) {
  const uint32_t b = __float_as_uint(s) >> 16;
  return b | (b << 16);
}

__device__ __forceinline__ uint4 ld_shared_v4(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ uint2 ld_shared_v2(uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ void st_shared_v4(uint32_t addr, uint32_t a, uint32_t b, uint32_t c,
                                             uint32_t d) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n"
               ::"r"(addr), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}

// 16 converted values from 16 raw bytes at chunk k8 of a 128-byte tile row, into key row r
// of the swizzled slice pair: slice 2 q + k8 / 4 (row at `row`, chunk c of row r at chunk
// c ^ (r % 8)), chunks 2 (k8 % 4) and + 1.  The odd slice's lanes store their second chunk
// first, so that the 8 lanes of a key row cover 8 distinct chunk columns in each store: o
// comes in store order, convert16's halves swapped where k8 >= 4 (convert16(..., odd16(k8))).
__device__ __forceinline__ bool odd16(int k8) { return k8 >= 4; }
__device__ __forceinline__ void st_converted16(uint32_t row, const uint32_t (&o)[8], int k8,
                                               int r) {
  const int odd = k8 >> 2, c = 2 * (k8 & 3);
  const int c1 = (c + odd) ^ (r & 7), c2 = (c + 1 - odd) ^ (r & 7);
  st_shared_v4(row + (c1 << 4), o[0], o[1], o[2], o[3]);
  st_shared_v4(row + (c2 << 4), o[4], o[5], o[6], o[7]);
}
}  // namespace fp8
}  // namespace hopper
}  // namespace mlagen
