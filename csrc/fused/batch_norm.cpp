// batch_norm_scale_shift: the per-channel factor or offset of an inference batch norm, for the element-wise chain that
// applies it (Note [An inference batch norm is a multiply and an add], graphex/fusion/batch_norm.py).
//   weight, bias: [C] or None (affine=False: 1 and 0); running_mean, running_var: [C]; any float dtype (read as
//   float32, eager's opmath for float32, bfloat16 and float16); eps as eager's batch norm takes it.
//   dims: the batch norm's input rank (>= 2): the result is float32 [C, 1, ...] with dims - 2 ones, so that it
//   broadcasts against [N, C, ...] as the channel's value.
//   which: 0 the factor  scale = weight / sqrt(running_var + eps)
//          1 the offset  shift = bias - running_mean * scale
// The input is then normed as x * scale + shift, in float32 (eager's kernel: the same two terms per channel, then
// one multiply-add per element). Eager contracts its multiply-add to an FMA where its build allows (measured: AVX2),
// and the chain does not, so the result is within fused mode's tolerance (Note [Fused kernels are close, not
// bitwise], library.cpp), a rounding or two, not bit for bit.
#include <ATen/ops/empty.h>
#include <c10/util/irange.h>
#include <torch/library.h>

#include <cmath>
#include <optional>

namespace graphex::fused {
namespace {

void check_channels(const char* name, const at::Tensor& t, int64_t channels) {
  TORCH_CHECK(t.dim() == 1 && t.size(0) == channels, "graphex_fused::batch_norm_scale_shift: ", name,
              " must have shape [", channels, "] (running_mean's), got ", t.sizes());
  TORCH_CHECK(at::isFloatingType(t.scalar_type()) && t.scalar_type() != at::kDouble,
              "graphex_fused::batch_norm_scale_shift: ", name, " must be float32, bfloat16 or float16, got ",
              t.scalar_type());
}

std::vector<int64_t> out_shape(int64_t channels, int64_t dims) {
  TORCH_CHECK(dims >= 2, "graphex_fused::batch_norm_scale_shift: the input's rank must be at least 2, got ", dims);
  std::vector<int64_t> shape(static_cast<size_t>(dims - 1), 1);
  shape[0] = channels;
  return shape;
}

at::Tensor scale_shift_cpu(const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                           const at::Tensor& running_mean, const at::Tensor& running_var, double eps, int64_t dims,
                           int64_t which) {
  TORCH_CHECK(which == 0 || which == 1, "graphex_fused::batch_norm_scale_shift: which must be 0 (scale) or 1 (shift)");
  const int64_t channels = running_mean.size(0);
  check_channels("running_mean", running_mean, channels);
  check_channels("running_var", running_var, channels);
  if (weight) check_channels("weight", *weight, channels);
  if (bias) check_channels("bias", *bias, channels);
  // float32 copies: reads any float dtype and stride as eager's opmath
  const at::Tensor mean = running_mean.to(at::kFloat).contiguous(), var = running_var.to(at::kFloat).contiguous();
  const at::Tensor w = weight ? weight->to(at::kFloat).contiguous() : at::Tensor();
  const at::Tensor b = bias ? bias->to(at::kFloat).contiguous() : at::Tensor();
  at::Tensor out = at::empty(out_shape(channels, dims), running_mean.options().dtype(at::kFloat));
  float* o = out.data_ptr<float>();
  const float* m = mean.data_ptr<float>();
  const float* v = var.data_ptr<float>();
  const float e = static_cast<float>(eps);
  for (const auto c : c10::irange(channels)) {
    const float invstd = 1.f / std::sqrt(v[c] + e);
    const float scale = invstd * (w.defined() ? w.data_ptr<float>()[c] : 1.f);
    o[c] = which == 0 ? scale : (b.defined() ? b.data_ptr<float>()[c] : 0.f) - m[c] * scale;
  }
  return out;
}

at::Tensor scale_shift_meta(const std::optional<at::Tensor>& /*weight*/, const std::optional<at::Tensor>& /*bias*/,
                            const at::Tensor& running_mean, const at::Tensor& /*running_var*/, double /*eps*/,
                            int64_t dims, int64_t /*which*/) {
  return at::empty(out_shape(running_mean.size(0), dims), running_mean.options().dtype(at::kFloat));
}

}  // namespace
}  // namespace graphex::fused

TORCH_LIBRARY_IMPL(graphex_fused, CPU, m) { m.impl("batch_norm_scale_shift", &graphex::fused::scale_shift_cpu); }

TORCH_LIBRARY_IMPL(graphex_fused, Meta, m) { m.impl("batch_norm_scale_shift", &graphex::fused::scale_shift_meta); }
