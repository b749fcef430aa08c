// The power-of-two scale of a 16-bit partial row (mla_wgmma.cuh fp16_scales: the cluster
// merge's exchange and the split partials): plain C++ on the bits, so that the host tests
// compile it with g++ (tests/test_hopper_fp16_scale.py).
#pragma once

#ifndef MLAGEN_HD
#ifdef __CUDACC__
#define MLAGEN_HD __host__ __device__
#else
#define MLAGEN_HD
#endif
#endif

namespace mlagen {
namespace hopper {

// The biased fp32 exponent sb of the scale s = 2^(sb - 127) for a row whose largest
// magnitude has the biased exponent e: s puts that magnitude in [2^14, 2^15), so fp16 keeps
// 11 significant bits relative to it and cannot overflow; sb <= 253 keeps 1 / s =
// 2^(127 - sb) a normal float (rows below 2^-112 are scaled by 2^126 only); inf and NaN
// (e = 255) get s = 1.
MLAGEN_HD inline int fp16_scale_biased(int e) {
  if (e == 0xff) return 127;
  const int sb = 268 - e;
  return sb < 253 ? sb : 253;
}

}  // namespace hopper
}  // namespace mlagen
