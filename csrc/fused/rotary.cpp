// Rotary position embedding: x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1) of the
// two halves of the last dimension, in one pass (eager: mul, split or two slices, neg, cat, mul, add).
// Each element sees eager's operations in eager's order ((x * c) + ((-x2) * s)), with FMA
// contraction off, so on float32 the result is bitwise eager's (tested against the stated
// tolerance all the same: Note [Fused kernels are close, not bitwise], library.cpp).
#include "fused/rows.h"
#include "fused/vec.h"

#include <ATen/ops/add.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/neg.h>
#include <torch/library.h>

namespace graphex::fused {
namespace {

at::DimVector rotary_shape(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) % 2 == 0, "graphex_fused::rotary: x's last dimension must be even, got x ",
              x.sizes());
  return at::infer_size_dimvector(at::infer_size_dimvector(x.sizes(), cos.sizes()), sin.sizes());
}

at::Tensor rotary_eager(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  auto halves = x.chunk(2, -1);
  return at::add(at::mul(x, cos), at::mul(at::cat({at::neg(halves[1]), halves[0]}, -1), sin));
}

// The output has x's memory layout when it has x's shape (as eager's mul/add give it, which later views
// of the graph were traced with; e.g. q seen as [B, H, T, D] over [B, T, H, D] memory), else contiguous.
at::Tensor rotary_output(const at::Tensor& x, at::IntArrayRef shape, at::ScalarType dtype = at::kFloat) {
  if (x.sizes() == shape && x.is_non_overlapping_and_dense() && (x.stride(-1) == 1 || x.size(-1) <= 1))
    return at::empty_strided(x.sizes(), x.strides(), x.options().dtype(dtype));
  return at::empty(shape, x.options().dtype(dtype));
}

at::Tensor rotary_cpu(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const auto shape = rotary_shape(x, cos, sin);
  const int64_t n = shape.back();
  // The fast path: one float dtype, x not broadcast along its rows, cos and sin full rows (or one value).
  if (!all_cpu_one_float_dtype(x, cos, sin) || x.size(-1) != n || cos.size(-1) != n || sin.size(-1) != n)
    return rotary_eager(x, cos, sin);
  at::Tensor out = rotary_output(x, shape, x.scalar_type());
  if (out.numel() == 0) return out;
  std::array<at::Tensor, 4> ops{rows_view(x, shape), rows_view(cos, shape), rows_view(sin, shape), out};
  dispatch_float(x.scalar_type(), [&](auto t) {
    using T = decltype(t);
    const T* xp = ops[0].const_data_ptr<T>();
    const T* cp = ops[1].const_data_ptr<T>();
    const T* sp = ops[2].const_data_ptr<T>();
    T* op = out.mutable_data_ptr<T>();
    const RowKernels& K = row_kernels();
    for_each_row(at::IntArrayRef(shape), ops, 4 * n, [&](int64_t row, const std::array<int64_t, 4>& off) {
      FloatRows<T>& f = float_rows<T>(n);
      float* o = f.out(3, op + off[3], n);
      K.rotary(f.in(0, xp + off[0], n), f.in(1, cp + off[1], n), f.in(2, sp + off[2], n), o, n);
      f.store(o, op + off[3], n);
    });
  });
  return out;
}

at::Tensor rotary_meta(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return rotary_output(x, rotary_shape(x, cos, sin), c10::promoteTypes(at::result_type(x, cos), sin.scalar_type()));
}

}  // namespace
}  // namespace graphex::fused

TORCH_LIBRARY_IMPL(graphex_fused, CPU, m) { m.impl("rotary", &graphex::fused::rotary_cpu); }

TORCH_LIBRARY_IMPL(graphex_fused, Meta, m) { m.impl("rotary", &graphex::fused::rotary_meta); }
