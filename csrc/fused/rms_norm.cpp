// RMSNorm and add + RMSNorm: y = x * rsqrt(mean(x^2, -1, keepdim) + eps) * weight, in one pass
// over each row (eager: pow, mean, add, rsqrt, mul, mul, each over the whole tensor).
// Tolerance: Note [Fused kernels are close, not bitwise] (library.cpp); only the sum of squares
// adds in another order than eager's.
#include "fused/rows.h"
#include "fused/vec.h"

#include <ATen/ops/add.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/rsqrt.h>
#include <torch/library.h>

#include <cmath>
#include <tuple>

namespace graphex::fused {
namespace {

at::DimVector norm_shape(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(x.dim() >= 1, "graphex_fused::rms_norm: x must have at least one dimension, got a 0-d tensor");
  return at::infer_size_dimvector(x.sizes(), weight.sizes());
}

at::Tensor rms_norm_eager(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return at::mul(at::mul(x, at::rsqrt(at::add(x.pow(2).mean(-1, /*keepdim=*/true), eps))), weight);
}

// out (contiguous, `shape`) = rms_norm(x) * weight, x already expanded to `shape`.
void rms_norm_into(const at::Tensor& x, const at::Tensor& weight, double eps, at::Tensor& out) {
  const auto shape = out.sizes();
  const int64_t n = shape.back();
  if (out.numel() == 0) return;
  std::array<at::Tensor, 2> ops{rows_view(x, shape), rows_view(weight, shape)};
  const float* xp = ops[0].const_data_ptr<float>();
  const float* wp = ops[1].const_data_ptr<float>();
  const bool w_broadcast = ops[1].stride(-1) == 0 && n > 1;
  float* op = out.mutable_data_ptr<float>();
  const RowKernels& K = row_kernels();
  for_each_row(shape, ops, 3 * n, [&](int64_t row, const std::array<int64_t, 2>& off) {
    K.rms_norm(xp + off[0], wp + off[1], w_broadcast, op + row * n, n, static_cast<float>(eps));
  });
}

at::Tensor rms_norm_cpu(const at::Tensor& x, const at::Tensor& weight, double eps) {
  if (!all_cpu_float(x, weight) || x.dim() < 1) return rms_norm_eager(x, weight, eps);
  const auto shape = norm_shape(x, weight);
  if (shape.back() != x.size(-1)) return rms_norm_eager(x, weight, eps);  // x broadcast along the row
  at::Tensor out = at::empty(shape, x.options());
  rms_norm_into(x, weight, eps, out);
  return out;
}

at::Tensor rms_norm_meta(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return at::empty(norm_shape(x, weight), x.options().dtype(at::result_type(x, weight)));
}

// (x + residual, rms_norm(x + residual) * weight): the residual stream and the next layer's input.
std::tuple<at::Tensor, at::Tensor> add_rms_norm_cpu(const at::Tensor& x, const at::Tensor& residual,
                                                    const at::Tensor& weight, double eps) {
  if (!all_cpu_float(x, residual, weight) || x.dim() < 1) {
    at::Tensor sum = at::add(x, residual);
    return {sum, rms_norm_eager(sum, weight, eps)};
  }
  // Same shapes (the residual stream): one pass; otherwise eager's broadcasting add.
  at::Tensor sum;
  if (x.sizes() == residual.sizes() && x.numel() > 0) {
    const auto shape = x.sizes();
    const int64_t n = shape.back();
    sum = at::empty(shape, x.options());
    std::array<at::Tensor, 2> ops{rows_view(x, shape), rows_view(residual, shape)};
    const float* a = ops[0].const_data_ptr<float>();
    const float* b = ops[1].const_data_ptr<float>();
    float* s = sum.mutable_data_ptr<float>();
    const RowKernels& K = row_kernels();
    for_each_row(shape, ops, n, [&](int64_t row, const std::array<int64_t, 2>& off) {
      K.add(a + off[0], b + off[1], s + row * n, n);
    });
  } else {
    sum = at::add(x, residual).contiguous();
  }
  return {sum, rms_norm_cpu(sum, weight, eps)};
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm_meta(const at::Tensor& x, const at::Tensor& residual,
                                                     const at::Tensor& weight, double eps) {
  at::Tensor sum = at::empty(at::infer_size_dimvector(x.sizes(), residual.sizes()),
                             x.options().dtype(at::result_type(x, residual)));
  return {sum, rms_norm_meta(sum, weight, eps)};
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
