// add + LayerNorm: (x + residual, layer_norm(x + residual) * weight + bias) in one pass over each row (eager: add, then
// native_layer_norm, each over the whole tensor). The residual stream of GPT-2, GPT-NeoX, Falcon, Bloom and BERT:
// the sum is an output (the next residual), rounded to x's dtype as eager's add rounds it, and the norm reads it so.
// weight and bias are optional (nn.LayerNorm(bias=False), elementwise_affine=False), over the last dimension only.
// Tolerance: Note [Fused kernels are close, not bitwise] (library.cpp): the mean and the variance add in another order
// than ATen's Welford cascade. bfloat16 and float16 rows are float32 inside and rounded once, as eager's mixed-type
// kernel rounds its output once (Note [Reduced precision runs the float32 rows], rows.h).
#include "fused/rows.h"
#include "fused/vec.h"

#include <ATen/ops/add.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/layer_norm.h>
#include <torch/library.h>

#include <atomic>
#include <cmath>
#include <optional>
#include <tuple>

namespace graphex::fused {
namespace {

bool row_param(const std::optional<at::Tensor>& p, const at::Tensor& x) {
  return !p.has_value() || (p->dim() == 1 && p->size(0) == x.size(-1) && p->scalar_type() == x.scalar_type() &&
                            p->device().is_cpu());
}

std::tuple<at::Tensor, at::Tensor> add_layer_norm_eager(const at::Tensor& x, const at::Tensor& residual,
                                                        const std::optional<at::Tensor>& weight,
                                                        const std::optional<at::Tensor>& bias, double eps) {
  at::Tensor sum = at::add(x, residual);
  return {sum, at::layer_norm(sum, {sum.size(-1)}, weight, bias, eps)};
}

// Note [A norm that is not finite is eager's]
// The kernel's variance (the mean first, then the squared deviations) and eager's Welford overflow on different
// rows: values near 1e19 gave a row of NaN fused where eager's was finite (a helper's find). A row whose first output
// is not finite (a variance past float32's range makes the whole row NaN; so does a NaN or inf in the row, where
// eager's row is not finite either) makes the whole call eager's add and layer_norm, as a product that is not finite
// is eager's linear (matvec.cpp): one compare per row. What remains: a row finite here whose squares overflow in eager's order (values past about
// 2e19), NaN in eager (docs/fused-mode.md, How close to eager).
template <typename T>
bool add_layer_norm_rows(const at::Tensor& x, const at::Tensor& residual, const std::optional<at::Tensor>& weight,
                         const std::optional<at::Tensor>& bias, double eps, at::Tensor& sum, at::Tensor& out) {
  const auto shape = x.sizes();
  const int64_t n = shape.back();
  std::array<at::Tensor, 2> ops{rows_view(x, shape), rows_view(residual, shape)};
  const T* a = ops[0].const_data_ptr<T>();
  const T* r = ops[1].const_data_ptr<T>();
  // the weight and bias as float32 once per call (a reduced dtype's are converted, exactly)
  const at::Tensor w32 = weight.has_value() ? weight->to(at::kFloat).contiguous() : at::Tensor();
  const at::Tensor b32 = bias.has_value() ? bias->to(at::kFloat).contiguous() : at::Tensor();
  const float* w = w32.defined() ? w32.const_data_ptr<float>() : nullptr;
  const float* b = b32.defined() ? b32.const_data_ptr<float>() : nullptr;
  T* s = sum.mutable_data_ptr<T>();
  T* o = out.mutable_data_ptr<T>();
  const RowKernels& K = row_kernels();
  std::atomic<bool> finite{true};
  for_each_row(shape, ops, 4 * n, [&](int64_t row, const std::array<int64_t, 2>& off) {
    FloatRows<T>& f = float_rows<T>(n);
    float* h = f.out(2, s + row * n, n);
    K.add(f.in(0, a + off[0], n), f.in(1, r + off[1], n), h, n);
    f.store(h, s + row * n, n);
    // the norm reads the sum as eager's does: rounded to T (a no-op for float32)
    const float* hr = f.in(3, s + row * n, n);
    float* y = f.out(4, o + row * n, n);
    K.layer_norm(hr, w, b, y, n, static_cast<float>(eps));
    if (!std::isfinite(y[0])) finite.store(false, std::memory_order_relaxed);  // Note [A norm that is not finite ...]
    f.store(y, o + row * n, n);
  });
  return finite.load();
}

std::tuple<at::Tensor, at::Tensor> add_layer_norm_cpu(const at::Tensor& x, const at::Tensor& residual,
                                                      const std::optional<at::Tensor>& weight,
                                                      const std::optional<at::Tensor>& bias, double eps) {
  TORCH_CHECK(x.dim() >= 1, "graphex_fused::add_layer_norm: x must have at least one dimension");
  if (!all_cpu_one_float_dtype(x, residual) || x.sizes() != residual.sizes() || x.numel() == 0 ||
      !row_param(weight, x) || !row_param(bias, x))
    return add_layer_norm_eager(x, residual, weight, bias, eps);
  at::Tensor sum = at::empty(x.sizes(), x.options());
  at::Tensor out = at::empty(x.sizes(), x.options());
  bool finite = true;
  dispatch_float(x.scalar_type(), [&](auto t) {
    finite = add_layer_norm_rows<decltype(t)>(x, residual, weight, bias, eps, sum, out);
  });
  if (!finite) return add_layer_norm_eager(x, residual, weight, bias, eps);
  return {sum, out};
}

std::tuple<at::Tensor, at::Tensor> add_layer_norm_meta(const at::Tensor& x, const at::Tensor& residual,
                                                       const std::optional<at::Tensor>& /*weight*/,
                                                       const std::optional<at::Tensor>& /*bias*/, double /*eps*/) {
  TORCH_CHECK(x.dim() >= 1, "graphex_fused::add_layer_norm: x must have at least one dimension");
  at::Tensor sum = at::empty(at::infer_size_dimvector(x.sizes(), residual.sizes()),
                             x.options().dtype(at::result_type(x, residual)));
  return {sum, at::empty(sum.sizes(), sum.options())};
}

}  // namespace
}  // namespace graphex::fused

TORCH_LIBRARY_IMPL(graphex_fused, CPU, m) {
  m.impl("add_layer_norm", &graphex::fused::add_layer_norm_cpu);
}

TORCH_LIBRARY_IMPL(graphex_fused, Meta, m) {
  m.impl("add_layer_norm", &graphex::fused::add_layer_norm_meta);
}
