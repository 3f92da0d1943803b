// The row kernels' bodies: included by vec_default.cpp and vec_avx2.cpp only, each compiling them for
// its CPU capability (Note [One row kernel per CPU capability], vec.h).
#pragma once

#include "fused/max_pool_kernels.h"
#include "fused/pointwise_kernels.h"
#include "fused/vec.h"

#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <tuple>
#include <type_traits>

namespace graphex::fused {
namespace CPU_CAPABILITY {

using Vec = at::vec::Vectorized<float>;

inline float sum_lanes(const Vec& v) {
  float lanes[Vec::size()];
  v.store(lanes);
  float sum = 0.f;
  for (int64_t l = 0; l < Vec::size(); ++l) sum += lanes[l];
  return sum;
}

inline void rms_norm_row(const float* x, const float* w, bool w_broadcast, float* out, int64_t n, float eps) {
  Vec acc0(0.f), acc1(0.f);
  int64_t i = 0;
  for (; i + 2 * Vec::size() <= n; i += 2 * Vec::size()) {
    Vec a = Vec::loadu(x + i), b = Vec::loadu(x + i + Vec::size());
    acc0 = acc0 + a * a;
    acc1 = acc1 + b * b;
  }
  float sum = sum_lanes(acc0 + acc1);
  for (; i < n; ++i) sum += x[i] * x[i];
  const float inv = 1.f / std::sqrt(sum / static_cast<float>(n) + eps);
  const Vec vinv(inv);
  i = 0;
  if (!w_broadcast) {
    for (; i + Vec::size() <= n; i += Vec::size()) ((Vec::loadu(x + i) * vinv) * Vec::loadu(w + i)).store(out + i);
    for (; i < n; ++i) out[i] = (x[i] * inv) * w[i];
  } else {
    const Vec vw(w[0]);
    for (; i + Vec::size() <= n; i += Vec::size()) ((Vec::loadu(x + i) * vinv) * vw).store(out + i);
    for (; i < n; ++i) out[i] = (x[i] * inv) * w[0];
  }
}

// LayerNorm of one row: ((x - mean) * rstd) * w + b, no FMA. The mean and the biased variance in float32 over the row
// in cache, by shifted data: a first mean m1, then c = sum(x - m1) and q = sum((x - m1)^2) in one pass, mean = m1 + c / n,
// var = q / n - (c / n)^2. A plain float32 sum of a row whose mean is far from 0 loses the mean's low bits (mean 1000:
// 4x eager's error; eager runs a Welford cascade); the shifted sums keep the fused norm as exact as eager's (tested
// against float64: test_fusion_layer_norm.py).
inline void layer_norm_row(const float* x, const float* w, const float* b, float* out, int64_t n, float eps) {
  constexpr int64_t W = Vec::size();
  Vec s0(0.f), s1(0.f);
  int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    s0 = s0 + Vec::loadu(x + i);
    s1 = s1 + Vec::loadu(x + i + W);
  }
  float sum = sum_lanes(s0 + s1);
  for (; i < n; ++i) sum += x[i];
  const float m1 = sum / static_cast<float>(n);
  const Vec vm1(m1);
  Vec c0(0.f), c1(0.f), q0(0.f), q1(0.f);
  i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    const Vec d0 = Vec::loadu(x + i) - vm1, d1 = Vec::loadu(x + i + W) - vm1;
    c0 = c0 + d0;
    c1 = c1 + d1;
    q0 = q0 + d0 * d0;
    q1 = q1 + d1 * d1;
  }
  float c = sum_lanes(c0 + c1), q = sum_lanes(q0 + q1);
  for (; i < n; ++i) {
    const float d = x[i] - m1;
    c += d;
    q += d * d;
  }
  const float cn = c / static_cast<float>(n);
  const float mean = m1 + cn;
  const float var = std::max(q / static_cast<float>(n) - cn * cn, 0.f);
  // a variance past float32's range (|x| near 1e20 and more) is NaN, as eager's Welford makes it (inf - inf), not a
  // row of zeros times the weight (found by a helper)
  const float rstd = std::isfinite(var) ? 1.f / std::sqrt(var + eps) : NAN;
  const Vec vmean(mean), vs(rstd);
  i = 0;
  for (; i + W <= n; i += W) {
    Vec y = (Vec::loadu(x + i) - vmean) * vs;
    if (w != nullptr) y = y * Vec::loadu(w + i);
    if (b != nullptr) y = y + Vec::loadu(b + i);
    y.store(out + i);
  }
  for (; i < n; ++i) {
    float y = (x[i] - mean) * rstd;
    if (w != nullptr) y = y * w[i];
    if (b != nullptr) y = y + b[i];
    out[i] = y;
  }
}

inline void add_row(const float* a, const float* b, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) (Vec::loadu(a + i) + Vec::loadu(b + i)).store(out + i);
  for (; i < n; ++i) out[i] = a[i] + b[i];
}

// silu(v) = v / (1 + exp(-v)), as ATen's vectorized silu computes it.
inline void silu_mul_row(const float* g, const float* u, float* out, int64_t n) {
  const Vec one(1.f);
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) {
    Vec v = Vec::loadu(g + i);
    ((v / (one + v.neg().exp())) * Vec::loadu(u + i)).store(out + i);
  }
  for (; i < n; ++i) out[i] = (g[i] / (1.f + std::exp(-g[i]))) * u[i];
}

// n = 2h: out[j] = x[j]*c[j] + (-x[j+h])*s[j] (j < h); x[j]*c[j] + x[j-h]*s[j] (j >= h).
// Interleaved pairs (x[2i], x[2i + 1]) rotated by (c0, s0) and (c1, s1): out[2i] = x[2i] * c0 - x[2i + 1] * s0,
// out[2i + 1] = x[2i + 1] * c1 + x[2i] * s1, where the tables hold one entry per element (GPT-J's duplicated cos and
// sin: c0 = c[2i], c1 = c[2i + 1]) or, with `half_tables`, one per pair (c0 = c1 = c[i]); in eager's order with no FMA,
// so float32 is eager's bit for bit (a + (-b) is a - b, and x1 * s + x2 * c is x2 * c + x1 * s).
// Written with explicit vectors (pairs split by deinterleave2, joined by interleave2), tail included (padded into a
// local block): GCC's vectorizer takes the scalar loop for a complex multiplication and emits vfmaddsub, an FMA that
// -ffp-contract=off does not stop (found by the bitwise test on AVX2).
inline void rotary_pairs_block(const float* x, const float* c, const float* s, float* out, bool half_tables) {
  // one block: 2 * Vec::size() elements of x and out, tables of as many (or half as many) entries
  const auto [ev, od] = at::vec::deinterleave2(Vec::loadu(x), Vec::loadu(x + Vec::size()));
  Vec c0, c1, s0, s1;
  if (half_tables) {
    c0 = c1 = Vec::loadu(c);
    s0 = s1 = Vec::loadu(s);
  } else {
    std::tie(c0, c1) = at::vec::deinterleave2(Vec::loadu(c), Vec::loadu(c + Vec::size()));
    std::tie(s0, s1) = at::vec::deinterleave2(Vec::loadu(s), Vec::loadu(s + Vec::size()));
  }
  const Vec even = ev * c0 - od * s0;
  const Vec odd = od * c1 + ev * s1;
  const auto [lo, hi] = at::vec::interleave2(even, odd);
  lo.store(out);
  hi.store(out + Vec::size());
}

inline void rotary_pairs_row(const float* x, const float* c, const float* s, float* out, int64_t n, bool half_tables) {
  constexpr int64_t kBlock = 2 * Vec::size();
  const int64_t table_step = half_tables ? Vec::size() : kBlock;
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock)
    rotary_pairs_block(x + i, c + i / kBlock * table_step, s + i / kBlock * table_step, out + i, half_tables);
  if (i < n) {  // the tail, through the same block on zero-padded copies
    float xb[kBlock] = {}, cb[kBlock] = {}, sb[kBlock] = {}, ob[kBlock];
    const int64_t m = n - i, tm = half_tables ? m / 2 : m, t0 = half_tables ? i / 2 : i;
    std::copy(x + i, x + n, xb);
    std::copy(c + t0, c + t0 + tm, cb);
    std::copy(s + t0, s + t0 + tm, sb);
    rotary_pairs_block(xb, cb, sb, ob, half_tables);
    std::copy(ob, ob + m, out + i);
  }
}

inline void rotary_row(const float* x, const float* c, const float* s, float* out, int64_t n) {
  const int64_t h = n / 2;
  int64_t j = 0;
  for (; j + Vec::size() <= h; j += Vec::size()) {
    Vec x1 = Vec::loadu(x + j), x2 = Vec::loadu(x + h + j);
    (x1 * Vec::loadu(c + j) + x2.neg() * Vec::loadu(s + j)).store(out + j);
    (x2 * Vec::loadu(c + h + j) + x1 * Vec::loadu(s + h + j)).store(out + h + j);
  }
  for (; j < h; ++j) {
    const float x1 = x[j], x2 = x[h + j];
    out[j] = x1 * c[j] + (-x2) * s[j];
    out[h + j] = x2 * c[h + j] + x1 * s[h + j];
  }
}

// max |x[i]|, NaN if any x[i] is NaN (at::vec::maximum propagates it): prefill_attention's edge check (attention.cpp)
inline float max_abs(const float* x, int64_t n) {
  Vec m(0.f);
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) m = at::vec::maximum(m, Vec::loadu(x + i).abs());
  float lanes[Vec::size()];
  m.store(lanes);
  float r = 0.f;
  for (int64_t l = 0; l < Vec::size(); ++l) r = std::isnan(lanes[l]) || std::isnan(r) ? NAN : std::max(r, lanes[l]);
  for (; i < n; ++i) r = std::isnan(x[i]) || std::isnan(r) ? NAN : std::max(r, std::fabs(x[i]));
  return r;
}

inline float dot(const float* a, const float* b, int64_t n) {
  Vec acc(0.f);
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) acc = acc + Vec::loadu(a + i) * Vec::loadu(b + i);
  float sum = sum_lanes(acc);
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// sum(a[i] * b[i]) over a float32 weight row, for matvec: four accumulators, so the loop streams the row instead of
// waiting on one accumulator (a reduction: its order is not eager's anyway; Note [Fused kernels are close, not
// bitwise]). Each product is rounded before it is added, not fused into the sum: Note [matvec rounds every product].
// `dot` above keeps its one accumulator for the kernels that use it.
inline float dot_f32(const float* a, const float* b, int64_t n) {
  Vec acc0(0.f), acc1(0.f), acc2(0.f), acc3(0.f);
  int64_t i = 0;
  constexpr int64_t w = Vec::size();
  for (; i + 4 * w <= n; i += 4 * w) {
    acc0 = acc0 + Vec::loadu(a + i) * Vec::loadu(b + i);
    acc1 = acc1 + Vec::loadu(a + i + w) * Vec::loadu(b + i + w);
    acc2 = acc2 + Vec::loadu(a + i + 2 * w) * Vec::loadu(b + i + 2 * w);
    acc3 = acc3 + Vec::loadu(a + i + 3 * w) * Vec::loadu(b + i + 3 * w);
  }
  for (; i + w <= n; i += w) acc0 = acc0 + Vec::loadu(a + i) * Vec::loadu(b + i);
  float sum = sum_lanes((acc0 + acc1) + (acc2 + acc3));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// sum(a[i] * float(b[i])) for a reduced-precision b: b converted in registers, four float accumulators (a reduction:
// its order is not eager's anyway; Note [Fused kernels are close, not bitwise]), each product rounded before it is
// added (Note [matvec rounds every product]).
template <typename R>
inline float dot_reduced(const float* a, const R* b, int64_t n) {
  using VecR = at::vec::Vectorized<R>;
  Vec acc0(0.f), acc1(0.f), acc2(0.f), acc3(0.f);
  int64_t i = 0;
  if constexpr (VecR::size() == 2 * Vec::size()) {
    for (; i + 2 * VecR::size() <= n; i += 2 * VecR::size()) {
      auto [b0, b1] = at::vec::convert_to_float<R>(VecR::loadu(b + i));
      auto [b2, b3] = at::vec::convert_to_float<R>(VecR::loadu(b + i + VecR::size()));
      acc0 = acc0 + Vec::loadu(a + i) * b0;
      acc1 = acc1 + Vec::loadu(a + i + Vec::size()) * b1;
      acc2 = acc2 + Vec::loadu(a + i + 2 * Vec::size()) * b2;
      acc3 = acc3 + Vec::loadu(a + i + 3 * Vec::size()) * b3;
    }
    for (; i + VecR::size() <= n; i += VecR::size()) {
      auto [b0, b1] = at::vec::convert_to_float<R>(VecR::loadu(b + i));
      acc0 = acc0 + Vec::loadu(a + i) * b0;
      acc1 = acc1 + Vec::loadu(a + i + Vec::size()) * b1;
    }
  }
  float sum = sum_lanes((acc0 + acc1) + (acc2 + acc3));
  for (; i < n; ++i) sum += a[i] * static_cast<float>(b[i]);
  return sum;
}

inline float dot_bf16(const float* a, const c10::BFloat16* b, int64_t n) { return dot_reduced(a, b, n); }
inline float dot_half(const float* a, const c10::Half* b, int64_t n) { return dot_reduced(a, b, n); }

// Note [A weight stored [K, N] is read sixteen rows a pass]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// matvec on a weight stored [K, N] (GPT-2's Conv1D) adds rows of the weight into a float32 accumulator row y:
// y[i] += a[0] * float(w[0][i]) + a[1] * float(w[1][i]) + ... over `rows` weight rows `stride` elements apart, one
// product and one add per row in row order (Note [matvec rounds every product], matvec.cpp), so every output sums
// its products in the order k = 0, 1, ... however the rows are grouped (the grouping is a matter of speed only).
// Each pass holds a block of y in registers over up to kAxpyRows rows: y is read and written once per sixteen weight
// rows instead of once per row or per four. Measured 2026-12-07 with a standalone probe of the loops (GPT-2's 4
// layers of [K, N] weights at hidden 512, 50 MB, streamed from memory, one thread, AMD EPYC; with fused
// multiply-adds, which do not change these rates): four rows a pass read 16.6-18.5 GB/s (with or without software
// prefetches), eight 21.2, sixteen 22.8-23.4, against 21.4 for the [N, K] kernel's dot products; at AVX2's width
// 17.4, 21.0 and 24.9 against 26.9. Software prefetches (the four-row kernel's before) cost a little at eight rows
// (20.4 against 21.2), so there are none.
constexpr int64_t kAxpyRows = 16;

template <typename T>
inline void axpy_rows(const float* a, const T* w, int64_t stride, int64_t rows, float* y, int64_t n) {
  constexpr int64_t v = Vec::size();
  for (int64_t r0 = 0; r0 < rows; r0 += kAxpyRows) {
    const int64_t r1 = std::min(rows, r0 + kAxpyRows);
    int64_t i = 0;
    if constexpr (std::is_same_v<T, float>) {
      for (; i + 2 * v <= n; i += 2 * v) {
        Vec y0 = Vec::loadu(y + i), y1 = Vec::loadu(y + i + v);
        for (int64_t r = r0; r < r1; ++r) {
          const Vec ar(a[r]);
          const float* wr = w + r * stride + i;
          y0 = y0 + ar * Vec::loadu(wr);
          y1 = y1 + ar * Vec::loadu(wr + v);
        }
        y0.store(y + i);
        y1.store(y + i + v);
      }
    } else {
      using VecR = at::vec::Vectorized<T>;
      if constexpr (VecR::size() == 2 * Vec::size()) {
        for (; i + VecR::size() <= n; i += VecR::size()) {
          Vec y0 = Vec::loadu(y + i), y1 = Vec::loadu(y + i + v);
          for (int64_t r = r0; r < r1; ++r) {
            const Vec ar(a[r]);
            auto [p, q] = at::vec::convert_to_float<T>(VecR::loadu(w + r * stride + i));
            y0 = y0 + ar * p;
            y1 = y1 + ar * q;
          }
          y0.store(y + i);
          y1.store(y + i + v);
        }
      }
    }
    for (; i < n; ++i) {
      float acc = y[i];
      for (int64_t r = r0; r < r1; ++r) acc = acc + a[r] * static_cast<float>(w[r * stride + i]);
      y[i] = acc;
    }
  }
}

inline void axpy_rows_f32(const float* a, const float* w, int64_t stride, int64_t rows, float* y, int64_t n) {
  axpy_rows(a, w, stride, rows, y, n);
}
inline void axpy_rows_bf16(const float* a, const c10::BFloat16* w, int64_t stride, int64_t rows, float* y, int64_t n) {
  axpy_rows(a, w, stride, rows, y, n);
}
inline void axpy_rows_half(const float* a, const c10::Half* w, int64_t stride, int64_t rows, float* y, int64_t n) {
  axpy_rows(a, w, stride, rows, y, n);
}

inline void axpy(float a, const float* x, float* y, int64_t n) {
  const Vec va(a);
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) (Vec::loadu(y + i) + va * Vec::loadu(x + i)).store(y + i);
  for (; i < n; ++i) y[i] += a * x[i];
}

#define GRAPHEX_STR2(x) #x
#define GRAPHEX_STR(x) GRAPHEX_STR2(x)

inline RowKernels table() {
  return RowKernels{&rms_norm_row,   &add_row,        &layer_norm_row, &silu_mul_row,  &rotary_row,
                    &rotary_pairs_row, &max_abs,      &dot,            &dot_f32,       &dot_bf16,
                    &dot_half,       &axpy,           &axpy_rows_f32,  &axpy_rows_bf16, &axpy_rows_half,
                    &max_pool_f32,   &max_pool_bf16,  &max_pool_half,  &pointwise_tile, GRAPHEX_STR(CPU_CAPABILITY)};
}

}  // namespace CPU_CAPABILITY
}  // namespace graphex::fused
