// max_pool2d's plane loop (max_pool.cpp), included by vec_kernels.h so it is compiled once per CPU capability
// (Note [One row kernel per CPU capability], vec.h). Note [Max pooling picks eager's element] (max_pool.cpp).
#pragma once

#include "fused/vec.h"

#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

namespace graphex::fused {
namespace CPU_CAPABILITY {

namespace pool {
using V = at::vec::Vectorized<float>;

// eager's step, `if (v > max || isnan(v)) max = v`, as a select: random data would mispredict a branch half the time
inline float keep_max(float maxval, float v) {
  const uint32_t take = 0u - static_cast<uint32_t>((v > maxval) | (v != v));
  uint32_t a, b;
  std::memcpy(&a, &maxval, sizeof(a));
  std::memcpy(&b, &v, sizeof(b));
  const uint32_t r = (b & take) | (a & ~take);
  float out;
  std::memcpy(&out, &r, sizeof(out));
  return out;
}

inline V keep_max(const V& maxval, const V& v) { return V::blendv(maxval, v, (v > maxval) | (v != v)); }

// V::size() elements src[0], src[s], src[2s], ... as float32
template <typename T>
inline V strided(const T* src, int64_t s) {
  if constexpr (std::is_same_v<T, float>) {
    if (s == 1) return V::loadu(src);
    if (s == 2) return at::vec::deinterleave2(V::loadu(src), V::loadu(src + V::size())).first;
  }
  float tmp[V::size()];
  for (int64_t l = 0; l < V::size(); ++l) tmp[l] = static_cast<float>(src[l * s]);
  return V::loadu(tmp);
}
}  // namespace pool

// One [H, W] plane into [OH, OW]. Outputs whose window lies inside the row in full go V::size() at a time, each
// lane scanning its window in eager's order (rows, then columns); the others one at a time, eager's loop as written.
template <typename T>
inline void max_pool_plane(const T* in, T* o, const MaxPool& p, int64_t H, int64_t W, int64_t OH, int64_t OW) {
  using pool::V;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int64_t oh = 0; oh < OH; ++oh) {
    int64_t ih0 = oh * p.sH - p.pH;
    const int64_t ih1 = std::min(ih0 + (p.kH - 1) * p.dH + 1, H);
    while (ih0 < 0) ih0 += p.dH;
    const int64_t inner_begin = std::min(OW, (p.pW + p.sW - 1) / p.sW);
    int64_t inner_end = inner_begin;
    // a window inside the row, and (for the two-vector load of stride 2) its last vector's read inside it too
    while (inner_end < OW && inner_end * p.sW - p.pW + (p.kW - 1) * p.dW + 1 <= W) ++inner_end;
    auto one = [&](int64_t ow) {
      int64_t iw0 = ow * p.sW - p.pW;
      const int64_t iw1 = std::min(iw0 + (p.kW - 1) * p.dW + 1, W);
      while (iw0 < 0) iw0 += p.dW;
      float maxval = kNegInf;
      for (int64_t ih = ih0; ih < ih1; ih += p.dH)
        for (int64_t iw = iw0; iw < iw1; iw += p.dW) maxval = pool::keep_max(maxval, static_cast<float>(in[ih * W + iw]));
      o[oh * OW + ow] = static_cast<T>(maxval);
    };
    int64_t ow = 0;
    for (; ow < inner_begin; ++ow) one(ow);
    // the two-vector read of stride 2 reaches src + 2 V::size() - 1: keep it inside the row
    const int64_t reach = p.sW == 2 ? 2 * V::size() : (V::size() - 1) * p.sW + 1;
    for (; ow + V::size() <= inner_end &&
           (ow * p.sW - p.pW) + (p.kW - 1) * p.dW + reach <= W;
         ow += V::size()) {
      V acc(kNegInf);
      const T* base = in + ow * p.sW - p.pW;
      for (int64_t ih = ih0; ih < ih1; ih += p.dH)
        for (int64_t kw = 0; kw < p.kW; ++kw) acc = pool::keep_max(acc, pool::strided(base + ih * W + kw * p.dW, p.sW));
      float lanes[V::size()];
      acc.store(lanes);
      for (int64_t l = 0; l < V::size(); ++l) o[oh * OW + ow + l] = static_cast<T>(lanes[l]);
    }
    for (; ow < OW; ++ow) one(ow);
  }
}

inline void max_pool_f32(const float* in, float* o, const MaxPool& p, int64_t H, int64_t W, int64_t OH, int64_t OW) {
  max_pool_plane(in, o, p, H, W, OH, OW);
}
inline void max_pool_bf16(const c10::BFloat16* in, c10::BFloat16* o, const MaxPool& p, int64_t H, int64_t W,
                          int64_t OH, int64_t OW) {
  max_pool_plane(in, o, p, H, W, OH, OW);
}
inline void max_pool_half(const c10::Half* in, c10::Half* o, const MaxPool& p, int64_t H, int64_t W, int64_t OH,
                          int64_t OW) {
  max_pool_plane(in, o, p, H, W, OH, OW);
}

}  // namespace CPU_CAPABILITY
}  // namespace graphex::fused
