// A linear layer on a few rows, in float32, bfloat16 or float16: x @ weight^T (+ bias), reading each weight row
// once per row of x at the weight's own width (a decode step's matrix products are matrix-vector products bound by
// reading the weights; ATen's reduced-precision mm runs no faster than its float32 one here, reading half the
// bytes: bench/fused_step.py). Each output is a float32 dot product of the row of x (read as float32) and a
// weight row (converted in registers), plus the bias, rounded once to the dtype (Note [Reduced precision runs
// the float32 rows], rows.h), as eager's mm accumulates in float32 and rounds once.
//   x [..., K], weight [N, K] (row-major, stride 1 along K; or the transpose of a row-major [K, N], as GPT-2's
//   Conv1D stores it: matvec_columns), bias [N] or none; one dtype, float32, bfloat16 or float16 (float32: Note
//   [A float32 row runs matvec too], graphex/fusion/patterns.py).
// Meant for one row of x (a decode step): a second row costs almost a second pass (measured), so the
// pattern admits one row only; more rows, other dtypes, layouts or devices run eager's linear (at::linear).
// Tolerance: Note [Fused kernels are close, not bitwise] (library.cpp): the dot products add in another order.
#include "fused/matvec.h"

#include "fused/rows.h"
#include "fused/vec.h"

#include <ATen/ops/add.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <atomic>
#include <cmath>
#include <optional>
#include <vector>

namespace graphex::fused {
namespace {

at::DimVector matvec_shape(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() >= 1 && weight.dim() == 2 && x.size(-1) == weight.size(1),
              "graphex_fused::matvec: want x [..., K] and weight [N, K], got x ", x.sizes(), ", weight ",
              weight.sizes());
  TORCH_CHECK(!bias.has_value() || (bias->dim() == 1 && bias->size(0) == weight.size(0)),
              "graphex_fused::matvec: want bias [N] with N = ", weight.size(0), ", got ", bias->sizes());
  at::DimVector shape(x.sizes().begin(), x.sizes().end());
  shape.back() = weight.size(0);
  return shape;
}

// eager's F.linear itself (addmm for one row with a bias, as the graph's addmm / linear decomposition ran it)
at::Tensor matvec_eager(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  return at::linear(x, weight, bias);
}

template <typename T>
float dot_as_float(const RowKernels& K, const float* a, const T* b, int64_t n) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) return K.dot_bf16(a, b, n);
  else if constexpr (std::is_same_v<T, float>) return K.dot_f32(a, b, n);
  else return K.dot_half(a, b, n);
}

// Whether an output is finite, read back at the dtype it was stored in (a float16 sum past 65504 is inf there).
template <typename T>
bool stored_finite(T v) {
  return std::isfinite(static_cast<float>(v));
}

// Note [A product that is not finite is eager's]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// matvec adds the products in another order than eager's mm, which keeps it within the tolerance while the partial
// sums stay finite. Where they do not (products past float32's range, an inf or a NaN in x or the weight), which
// of inf, -inf and NaN an output becomes depends on that order: x = [2e19, 2e19, -1e19] against the column
// [2e19, -2e19, 1] is NaN in eager's mm (inf - inf) and inf in matvec's (found by a helper, 2026-12-06). So the
// kernels below note whether every output they stored is finite, one compare per output, and a call with one that
// is not runs eager's linear instead (matvec_cpu): its infinities and NaNs are eager's own.
//
// Note [matvec rounds every product]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The kernels (dot_f32, dot_reduced, axpy_rows in vec_kernels.h) round each product before adding it, with no fused
// multiply-add, so a product past float32's range is inf in the sum, whatever came before it, and the call runs
// eager's linear. With fused multiply-adds, x = [1, 2] against the column [-1e38, 2e38] gave 3e38 where eager's
// linear gives inf (the product 4e38 was never rounded: a helper's find, 2026-12-07). Rounding costs nothing
// measurable here: the kernels wait on memory (GPT-2's [K, N] weights at 21.4-22.4 GB/s either way, one thread, a
// standalone probe of the loops, 2026-12-07). What this leaves: sums that overflow in eager's order and not in ours
// (a partial sum past float32's largest value that a later product would bring back), and the other way round,
// which then runs eager's.
template <typename T>
bool matvec_rows(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                 at::Tensor& out) {
  const int64_t N = weight.size(0), Kd = weight.size(1), M = x.numel() / std::max<int64_t>(Kd, 1);
  const at::Tensor xc = x.contiguous();
  const T* xp = xc.const_data_ptr<T>();
  const T* wp = weight.const_data_ptr<T>();
  const T* bp = bias.has_value() ? bias->const_data_ptr<T>() : nullptr;
  const int64_t bs = bias.has_value() ? bias->stride(0) : 0;
  T* op = out.mutable_data_ptr<T>();
  const RowKernels& K = row_kernels();
  // Split the weight rows over threads; each weight row is read once per row of x (one row where matvec_applies:
  // the loop over m serves the eager-equivalent path's general shape only).
  std::vector<float> xf(static_cast<size_t>(M * Kd));
  for (int64_t i = 0; i < M * Kd; ++i) xf[i] = static_cast<float>(xp[i]);
  std::atomic<bool> finite{true};
  at::parallel_for(0, N, std::max<int64_t>(1, 32768 / std::max<int64_t>(1, Kd)), [&](int64_t begin, int64_t end) {
    bool ok = true;
    for (int64_t n = begin; n < end; ++n) {
      const T* wr = wp + n * Kd;
      const float b = bp != nullptr ? static_cast<float>(bp[n * bs]) : 0.f;
      for (int64_t m = 0; m < M; ++m) {
        float acc = dot_as_float(K, xf.data() + m * Kd, wr, Kd);
        if (bp != nullptr) acc += b;
        const T v = static_cast<T>(acc);
        op[m * N + n] = v;
        ok = ok && stored_finite(v);
      }
    }
    if (!ok) finite.store(false, std::memory_order_relaxed);
  });
  return finite.load();
}

template <typename T>
void axpy_rows(const RowKernels& K, const float* a, const T* w, int64_t stride, int64_t rows, float* y, int64_t n) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) K.axpy_rows_bf16(a, w, stride, rows, y, n);
  else if constexpr (std::is_same_v<T, float>) K.axpy_rows_f32(a, w, stride, rows, y, n);
  else K.axpy_rows_half(a, w, stride, rows, y, n);
}

// The weight stored the other way round: weight [N, K] is the transpose of a row-major [K, N] (GPT-2's Conv1D,
// `x @ W` with W [K, N]). Each thread takes a slice of the N outputs and streams its slice of every weight row, sixteen
// rows a pass (Note [A weight stored [K, N] is read sixteen rows a pass], vec_kernels.h), into a float32 accumulator:
// y = b + sum_k x[k] * W[k, :], the products added in the order k = 0, 1, ..., rounded once.
template <typename T>
bool matvec_columns(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                    at::Tensor& out) {
  const int64_t N = weight.size(0), Kd = weight.size(1);
  const at::Tensor xc = x.contiguous();
  const T* xp = xc.const_data_ptr<T>();
  const T* wp = weight.const_data_ptr<T>();  // W[k, n] at wp[k * N + n]
  const T* bp = bias.has_value() ? bias->const_data_ptr<T>() : nullptr;
  const int64_t bs = bias.has_value() ? bias->stride(0) : 0;
  T* op = out.mutable_data_ptr<T>();
  const RowKernels& K = row_kernels();
  std::vector<float> xf(static_cast<size_t>(Kd));
  for (int64_t k = 0; k < Kd; ++k) xf[k] = static_cast<float>(xp[k]);
  std::atomic<bool> finite{true};  // Note [A product that is not finite is eager's]
  // slices of 64 outputs at least (whole vectors; a thread streams Kd short rows per slice), and at least 128K
  // weights a thread (GPT-2's 512 x 512 projection splits in two: Note [The fused kernels run on ATen's OpenMP
  // threads], CMakeLists.txt)
  at::parallel_for(0, (N + 63) / 64, std::max<int64_t>(1, 2048 / std::max<int64_t>(1, Kd)), [&](int64_t b0, int64_t b1) {
    const int64_t n0 = b0 * 64, n1 = std::min(N, b1 * 64), len = n1 - n0;
    std::vector<float> acc(static_cast<size_t>(len), 0.f);
    axpy_rows(K, xf.data(), wp + n0, N, Kd, acc.data(), len);
    bool ok = true;
    for (int64_t i = 0; i < len; ++i) {
      float v = acc[i];
      if (bp != nullptr) v += static_cast<float>(bp[(n0 + i) * bs]);
      const T stored = static_cast<T>(v);
      op[n0 + i] = stored;
      ok = ok && stored_finite(stored);
    }
    if (!ok) finite.store(false, std::memory_order_relaxed);
  });
  return finite.load();
}

bool rows_layout(const at::Tensor& w) { return w.stride(1) == 1 && w.stride(0) == w.size(1); }
bool columns_layout(const at::Tensor& w) { return w.stride(0) == 1 && w.stride(1) == w.size(0); }

}  // namespace

bool matvec_applies(const at::Tensor& x, const at::Tensor& weight) {
  const at::ScalarType d = x.scalar_type();
  return (d == at::kBFloat16 || d == at::kHalf || d == at::kFloat) && all_cpu_one_float_dtype(x, weight) &&
         weight.dim() == 2 && x.dim() >= 1 && x.size(-1) == weight.size(1) &&
         (rows_layout(weight) || columns_layout(weight)) && x.numel() == x.size(-1);
}

at::Tensor matvec_cpu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  const auto shape = matvec_shape(x, weight, bias);
  const at::ScalarType d = x.scalar_type();
  if (!matvec_applies(x, weight) || (bias.has_value() && !all_cpu_one_float_dtype(x, *bias)))
    return matvec_eager(x, weight, bias);
  at::Tensor out = at::empty(shape, x.options());
  if (out.numel() == 0) return out;
  if (weight.size(1) == 0) return out.zero_().add_(bias.has_value() ? *bias : at::zeros({}, out.options()));
  const bool rows = rows_layout(weight);  // else columns_layout (matvec_applies)
  bool finite;
  if (d == at::kFloat)
    finite = rows ? matvec_rows<float>(x, weight, bias, out) : matvec_columns<float>(x, weight, bias, out);
  else if (d == at::kBFloat16)
    finite = rows ? matvec_rows<c10::BFloat16>(x, weight, bias, out)
                  : matvec_columns<c10::BFloat16>(x, weight, bias, out);
  else finite = rows ? matvec_rows<c10::Half>(x, weight, bias, out) : matvec_columns<c10::Half>(x, weight, bias, out);
  return finite ? out : matvec_eager(x, weight, bias);  // Note [A product that is not finite is eager's]
}

namespace {

at::Tensor matvec_meta(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  return at::empty(matvec_shape(x, weight, bias), x.options());
}

}  // namespace
}  // namespace graphex::fused

TORCH_LIBRARY_IMPL(graphex_fused, CPU, m) { m.impl("matvec", &graphex::fused::matvec_cpu); }

TORCH_LIBRARY_IMPL(graphex_fused, Meta, m) { m.impl("matvec", &graphex::fused::matvec_meta); }
