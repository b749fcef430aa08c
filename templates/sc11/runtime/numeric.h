// Numerics of the emulated BDC: 16-bit storage formats and fp32 compute kernels.
// The inner loops use GCC vector extensions so they vectorise without -ffast-math
// (NaN and inf must keep their IEEE meaning: masked scores are -inf).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace sc11 {

struct Bf16 {
  static inline float to_f32(uint16_t h) {
    uint32_t u = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  static inline uint16_t from_f32(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
    return uint16_t(u >> 16);
  }
};

struct Fp16 {
  static inline float to_f32(uint16_t h) {
    _Float16 x;
    std::memcpy(&x, &h, 2);
    return float(x);
  }
  static inline uint16_t from_f32(float f) {
    _Float16 x = _Float16(f);
    uint16_t h;
    std::memcpy(&h, &x, 2);
    return h;
  }
};

// float8_e4m3fn (1 sign, 4 exponent bits of bias 7, 3 mantissa bits; no infinities, the
// all-ones exponent and mantissa is NaN): every value is exact in bf16, fp16 and fp32.
inline float e4m3_to_f32(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return std::numeric_limits<float>::quiet_NaN();
  const float v = e ? std::ldexp(1.0f + m / 8.0f, e - 7) : std::ldexp((float)m, -9);
  return (b & 0x80) ? -v : v;
}
// Unaligned little-endian fields of a packed token (fp8_ds_mla's scales and rope values).
inline float f32_at(const uint8_t* p) {
  float f;
  std::memcpy(&f, p, 4);
  return f;
}
inline uint16_t u16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}
// The 256 values, looked up as the BDC's conversion would produce them.
inline const float* e4m3_table() {
  struct Table {
    float v[256];
    Table() {
      for (int i = 0; i < 256; ++i) v[i] = e4m3_to_f32((uint8_t)i);
    }
  };
  static const Table t;
  return t.v;
}

template <class T>
inline void to_f32(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = T::to_f32(src[i]);
}
template <class T>
inline void from_f32(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = T::from_f32(src[i]);
}

typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));

// C[MR x 32] (+)= A[MR x K] B[K x 32]: accumulators stay in registers.
template <int MR>
inline void micro_32(int K, const float* A, int lda, const float* B, int ldb, float* C, int ldc,
                     bool acc) {
  v16 c[MR][2];
  for (int r = 0; r < MR; ++r) {
    if (acc) {
      c[r][0] = *(const v16u*)(C + r * ldc);
      c[r][1] = *(const v16u*)(C + r * ldc + 16);
    } else {
      c[r][0] = v16{} ;
      c[r][1] = v16{};
    }
  }
  for (int k = 0; k < K; ++k) {
    const v16 b0 = *(const v16u*)(B + (int64_t)k * ldb);
    const v16 b1 = *(const v16u*)(B + (int64_t)k * ldb + 16);
    for (int r = 0; r < MR; ++r) {
      const float a = A[(int64_t)r * lda + k];
      c[r][0] += a * b0;
      c[r][1] += a * b1;
    }
  }
  for (int r = 0; r < MR; ++r) {
    *(v16u*)(C + r * ldc) = c[r][0];
    *(v16u*)(C + r * ldc + 16) = c[r][1];
  }
}

// C[M x N] (+)= A[M x K] B[K x N], fp32 row-major with leading dimensions.
// Column panels of 32 outer so a panel of B stays in cache across the rows of A.
inline void gemm(int M, int N, int K, const float* A, int lda, const float* B, int ldb, float* C,
                 int ldc, bool acc) {
  int j0 = 0;
  for (; j0 + 32 <= N; j0 += 32) {
    int i = 0;
    for (; i + 4 <= M; i += 4)
      micro_32<4>(K, A + (int64_t)i * lda, lda, B + j0, ldb, C + (int64_t)i * ldc + j0, ldc, acc);
    for (; i < M; ++i)
      micro_32<1>(K, A + (int64_t)i * lda, lda, B + j0, ldb, C + (int64_t)i * ldc + j0, ldc, acc);
  }
  if (j0 < N) {  // column tail: plain loops (short)
    for (int i = 0; i < M; ++i) {
      float* c = C + (int64_t)i * ldc;
      if (!acc)
        for (int j = j0; j < N; ++j) c[j] = 0.f;
      for (int k = 0; k < K; ++k) {
        const float a = A[(int64_t)i * lda + k];
        const float* b = B + (int64_t)k * ldb;
        for (int j = j0; j < N; ++j) c[j] += a * b[j];
      }
    }
  }
}

}  // namespace sc11
