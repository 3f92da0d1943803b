// RMSNorm and add + RMSNorm: y = x * rsqrt(mean(x^2, -1, keepdim) + eps) * weight, in one pass
// over each row (eager: pow, mean, add, rsqrt, mul, mul, each over the whole tensor). With a
// weight_offset c, the factor is (c + weight) (Gemma's `1.0 + self.weight`), each element of it
// computed in float32 as eager's add computes a float32 weight plus a number; it is computed once per
// call, not per row.
// Tolerance: Note [Fused kernels are close, not bitwise] (library.cpp); in float32 only the sum of
// squares adds in another order than eager's. bfloat16 and float16 rows are float32 inside (Note
// [Reduced precision runs the float32 rows], rows.h).
#include "fused/rows.h"
#include "fused/vec.h"

#include <ATen/ops/add.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/rsqrt.h>
#include <torch/library.h>

#include <cmath>
#include <tuple>
#include <vector>

namespace graphex::fused {
namespace {

at::DimVector norm_shape(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(x.dim() >= 1, "graphex_fused::rms_norm: x must have at least one dimension, got a 0-d tensor");
  return at::infer_size_dimvector(x.sizes(), weight.sizes());
}

at::Tensor rms_norm_eager(const at::Tensor& x, const at::Tensor& weight, double eps, double weight_offset) {
  const at::Tensor factor = weight_offset == 0.0 ? weight : at::add(weight, weight_offset);
  return at::mul(at::mul(x, at::rsqrt(at::add(x.pow(2).mean(-1, /*keepdim=*/true), eps))), factor);
}

// out (contiguous, `shape`) = rms_norm(x) * weight, x already expanded to `shape`; x, weight and out of one
// dtype T (Note [Reduced precision runs the float32 rows]).
template <typename T>
void rms_norm_rows(const at::Tensor& x, const at::Tensor& weight, double eps, double weight_offset, at::Tensor& out) {
  const auto shape = out.sizes();
  const int64_t n = shape.back();
  if (out.numel() == 0) return;
  std::array<at::Tensor, 2> ops{rows_view(x, shape), rows_view(weight, shape)};
  const T* xp = ops[0].const_data_ptr<T>();
  const T* wp = ops[1].const_data_ptr<T>();
  const bool w_broadcast = ops[1].stride(-1) == 0 && n > 1;
  // (c + weight) once per call, in float32 (the caller admits an offset only for a weight of one row)
  std::vector<float> offset_weight;
  if (weight_offset != 0.0) {
    offset_weight.resize(static_cast<size_t>(n));
    const float c = static_cast<float>(weight_offset);
    for (int64_t i = 0; i < n; ++i) offset_weight[i] = c + static_cast<float>(wp[w_broadcast ? 0 : i]);
  }
  T* op = out.mutable_data_ptr<T>();
  const RowKernels& K = row_kernels();
  for_each_row(shape, ops, 3 * n, [&](int64_t row, const std::array<int64_t, 2>& off) {
    FloatRows<T>& f = float_rows<T>(n);
    float* o = f.out(2, op + row * n, n);
    const float* w = offset_weight.empty() ? f.in(1, wp + off[1], n, w_broadcast) : offset_weight.data();
    K.rms_norm(f.in(0, xp + off[0], n), w, w_broadcast && offset_weight.empty(), o, n, static_cast<float>(eps));
    f.store(o, op + row * n, n);
  });
}

void rms_norm_into(const at::Tensor& x, const at::Tensor& weight, double eps, double weight_offset, at::Tensor& out) {
  dispatch_float(out.scalar_type(), [&](auto t) { rms_norm_rows<decltype(t)>(x, weight, eps, weight_offset, out); });
}

at::Tensor rms_norm_cpu(const at::Tensor& x, const at::Tensor& weight, double eps, double weight_offset) {
  if (!all_cpu_one_float_dtype(x, weight) || x.dim() < 1) return rms_norm_eager(x, weight, eps, weight_offset);
  const auto shape = norm_shape(x, weight);
  if (shape.back() != x.size(-1)) return rms_norm_eager(x, weight, eps, weight_offset);  // x broadcast along the row
  // an offset weight is computed once, so it must be one row: a weight that varies across rows runs eager's ops
  if (weight_offset != 0.0 && weight.dim() > 1 && weight.numel() != weight.size(-1))
    return rms_norm_eager(x, weight, eps, weight_offset);
  at::Tensor out = at::empty(shape, x.options());
  rms_norm_into(x, weight, eps, weight_offset, out);
  return out;
}

at::Tensor rms_norm_meta(const at::Tensor& x, const at::Tensor& weight, double eps, double /*weight_offset*/) {
  return at::empty(norm_shape(x, weight), x.options().dtype(at::result_type(x, weight)));
}

// (x + residual, rms_norm(x + residual) * weight): the residual stream and the next layer's input.
std::tuple<at::Tensor, at::Tensor> add_rms_norm_cpu(const at::Tensor& x, const at::Tensor& residual,
                                                    const at::Tensor& weight, double eps, double weight_offset) {
  if (!all_cpu_one_float_dtype(x, residual, weight) || x.dim() < 1) {
    at::Tensor sum = at::add(x, residual);
    return {sum, rms_norm_eager(sum, weight, eps, weight_offset)};
  }
  // Same shapes (the residual stream): one pass; otherwise eager's broadcasting add. The sum is rounded to
  // x's dtype, as eager's add rounds it: it is an output, and the norm reads it as eager's does.
  at::Tensor sum;
  if (x.sizes() == residual.sizes() && x.numel() > 0) {
    const auto shape = x.sizes();
    const int64_t n = shape.back();
    sum = at::empty(shape, x.options());
    std::array<at::Tensor, 2> ops{rows_view(x, shape), rows_view(residual, shape)};
    dispatch_float(x.scalar_type(), [&](auto t) {
      using T = decltype(t);
      const T* a = ops[0].const_data_ptr<T>();
      const T* b = ops[1].const_data_ptr<T>();
      T* s = sum.mutable_data_ptr<T>();
      const RowKernels& K = row_kernels();
      for_each_row(shape, ops, n, [&](int64_t row, const std::array<int64_t, 2>& off) {
        FloatRows<T>& f = float_rows<T>(n);
        float* o = f.out(2, s + row * n, n);
        K.add(f.in(0, a + off[0], n), f.in(1, b + off[1], n), o, n);
        f.store(o, s + row * n, n);
      });
    });
  } else {
    sum = at::add(x, residual).contiguous();
  }
  return {sum, rms_norm_cpu(sum, weight, eps, weight_offset)};
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm_meta(const at::Tensor& x, const at::Tensor& residual,
                                                     const at::Tensor& weight, double eps, double weight_offset) {
  at::Tensor sum = at::empty(at::infer_size_dimvector(x.sizes(), residual.sizes()),
                             x.options().dtype(at::result_type(x, residual)));
  return {sum, rms_norm_meta(sum, weight, eps, weight_offset)};
}

}  // namespace
}  // namespace graphex::fused

TORCH_LIBRARY_IMPL(graphex_fused, CPU, m) {
  m.impl("rms_norm", &graphex::fused::rms_norm_cpu);
  m.impl("add_rms_norm", &graphex::fused::add_rms_norm_cpu);
}

TORCH_LIBRARY_IMPL(graphex_fused, Meta, m) {
  m.impl("rms_norm", &graphex::fused::rms_norm_meta);
  m.impl("add_rms_norm", &graphex::fused::add_rms_norm_meta);
}
