// Rows of a broadcast: the float32 fused kernels work one last-dimension row at a time.
#pragma once

#include <ATen/ExpandUtils.h>
#include <ATen/Parallel.h>
#include <ATen/ops/result_type.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <array>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace graphex::fused {

// True when every tensor is on the CPU with one dtype, float32, bfloat16 or float16: the fast paths'
// condition (Note [Reduced precision runs the float32 rows]).
template <typename T0, typename... T>
bool all_cpu_one_float_dtype(const T0& t0, const T&... ts) {
  const at::ScalarType d = t0.scalar_type();
  return (d == at::kFloat || d == at::kBFloat16 || d == at::kHalf) && t0.device().is_cpu() &&
         ((ts.scalar_type() == d && ts.device().is_cpu()) && ...);
}

// Note [Reduced precision runs the float32 rows]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A bfloat16 or float16 kernel converts each row it reads to float32 (exactly: every bf16/fp16 value is
// a float), runs the float32 row kernel, and rounds the row it writes once, to nearest even. Eager
// rounds after every op (x * r, then * w, ...), so the fused result is about as close to the exact value
// (tested: at most eager's error plus one rounding step), and differs from eager's by a few units in the last
// place of the reduced type: the tolerance
// per dtype is in library.cpp (Note [Fused kernels are close, not bitwise]). Rows are converted into
// per-thread scratch (float_rows<T>(n), at the start of each row), so a kernel allocates nothing per row.
template <typename T>
struct FloatRows {
  static constexpr int kSlots = 6;

  // Room for kSlots rows of n floats; pointers from in()/out() stay valid until the next reserve().
  void reserve(int64_t n) {
    if constexpr (!std::is_same_v<T, float>) {
      if (stride_ < n) {
        stride_ = n;
        buf_.assign(static_cast<size_t>(kSlots * n), 0.f);
      }
    }
  }
  // n elements of `p` as float: `p` itself for float32, else a copy in slot k (stride 1, or the one
  // element of a broadcast row when `broadcast`).
  const float* in(int k, const T* p, int64_t n, bool broadcast = false) {
    if constexpr (std::is_same_v<T, float>) {
      return p;
    } else {
      float* dst = buf_.data() + k * stride_;
      const int64_t m = broadcast ? 1 : n;
      for (int64_t i = 0; i < m; ++i) dst[i] = static_cast<float>(p[i]);
      return dst;
    }
  }
  // Where a row of n floats is computed before store(): `p` itself for float32, else slot k.
  float* out(int k, T* p, int64_t /*n*/) {
    if constexpr (std::is_same_v<T, float>) return p;
    else return buf_.data() + k * stride_;
  }
  // Rounds the row computed at `src` (from out()) into `p`, to nearest even: nothing to do for float32.
  void store(const float* src, T* p, int64_t n) {
    if constexpr (!std::is_same_v<T, float>) {
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(src[i]);
    }
  }

 private:
  std::vector<float> buf_;
  int64_t stride_ = 0;
};

// This thread's scratch for rows of up to n elements of T.
template <typename T>
FloatRows<T>& float_rows(int64_t n) {
  static thread_local FloatRows<T> rows;
  rows.reserve(n);
  return rows;
}

// Calls fn.template operator()<T>() with T = float, c10::BFloat16 or c10::Half for `dtype`.
template <typename F>
auto dispatch_float(at::ScalarType dtype, F&& fn) {
  switch (dtype) {
    case at::kBFloat16: return fn(c10::BFloat16{});
    case at::kHalf: return fn(c10::Half{});
    default: return fn(float{});
  }
}

// `t` expanded to `shape`, with a last dimension of stride 1 unless it is broadcast (size 1 there).
inline at::Tensor rows_view(const at::Tensor& t, at::IntArrayRef shape) {
  at::Tensor r = (t.dim() > 0 && t.size(-1) > 1 && t.stride(-1) != 1) ? t.contiguous() : t;
  return r.expand(shape);
}

// Calls fn(row, offsets) for every row of `shape` (all dimensions but the last), where offsets[k]
// is where that row starts in operand k (in elements, from its data pointer). Rows are split over
// ATen's intra-op threads when there are enough of them.
template <size_t N, typename F>
void for_each_row(at::IntArrayRef shape, const std::array<at::Tensor, N>& ops, int64_t row_cost, F fn) {
  const int64_t nd = static_cast<int64_t>(shape.size());
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < nd; ++d) rows *= shape[d];
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, row_cost));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      std::array<int64_t, N> off{};
      int64_t rest = row;
      for (int64_t d = nd - 2; d >= 0; --d) {
        const int64_t i = rest % shape[d];
        rest /= shape[d];
        for (size_t k = 0; k < N; ++k) off[k] += i * ops[k].stride(d);
      }
      fn(row, off);
    }
  });
}

}  // namespace graphex::fused
