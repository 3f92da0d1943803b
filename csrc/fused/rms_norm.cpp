// RMSNorm and add + RMSNorm: y = x * rsqrt(mean(x^2, -1, keepdim) + eps) * weight, in one pass
// over each row (eager: pow, mean, add, rsqrt, mul, mul, each over the whole tensor).
// Tolerance: Note [Fused kernels are close, not bitwise] (library.cpp); only the sum of squares
// adds in another order than eager's.
#include "fused/rows.h"

#include <ATen/cpu/vec/vec.h>
#include <ATen/ops/add.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/rsqrt.h>
#include <torch/library.h>

#include <cmath>
#include <tuple>

namespace graphex::fused {
namespace {

using Vec = at::vec::Vectorized<float>;

at::DimVector norm_shape(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(x.dim() >= 1, "graphex_fused::rms_norm: x must have at least one dimension, got a 0-d tensor");
  return at::infer_size_dimvector(x.sizes(), weight.sizes());
}

// One row: out[i] = (x[i] * inv) * w[i], with inv = 1 / sqrt(sum(x^2) / n + eps), as eager rounds it.
void norm_row(const float* x, const float* w, bool w_broadcast, float* out, int64_t n, float eps) {
  Vec acc0(0.f), acc1(0.f);
  int64_t i = 0;
  for (; i + 2 * Vec::size() <= n; i += 2 * Vec::size()) {
    Vec a = Vec::loadu(x + i), b = Vec::loadu(x + i + Vec::size());
    acc0 = acc0 + a * a;
    acc1 = acc1 + b * b;
  }
  float lanes[Vec::size()];
  (acc0 + acc1).store(lanes);
  float sum = 0.f;
  for (int64_t l = 0; l < Vec::size(); ++l) sum += lanes[l];
  for (; i < n; ++i) sum += x[i] * x[i];
  const float mean = sum / static_cast<float>(n);
  const float inv = 1.f / std::sqrt(mean + eps);
  const Vec vinv(inv);
  i = 0;
  if (!w_broadcast) {
    for (; i + Vec::size() <= n; i += Vec::size())
      ((Vec::loadu(x + i) * vinv) * Vec::loadu(w + i)).store(out + i);
    for (; i < n; ++i) out[i] = (x[i] * inv) * w[i];
  } else {
    const Vec vw(w[0]);
    for (; i + Vec::size() <= n; i += Vec::size()) ((Vec::loadu(x + i) * vinv) * vw).store(out + i);
    for (; i < n; ++i) out[i] = (x[i] * inv) * w[0];
  }
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
  for_each_row(shape, ops, 3 * n, [&](int64_t row, const std::array<int64_t, 2>& off) {
    norm_row(xp + off[0], wp + off[1], w_broadcast, op + row * n, n, static_cast<float>(eps));
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
    for_each_row(shape, ops, n, [&](int64_t row, const std::array<int64_t, 2>& off) {
      const float* ar = a + off[0];
      const float* br = b + off[1];
      float* sr = s + row * n;
      int64_t i = 0;
      for (; i + Vec::size() <= n; i += Vec::size()) (Vec::loadu(ar + i) + Vec::loadu(br + i)).store(sr + i);
      for (; i < n; ++i) sr[i] = ar[i] + br[i];
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
