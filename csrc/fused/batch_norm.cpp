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
#include "fused/vec.h"

#include <ATen/Parallel.h>
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


// conv_batch_norm_fold: a convolution's weight or bias with the inference batch norm after it folded in
// (Note [A convolution takes its batch norm and ReLU], graphex/fusion/conv_bn.py), float32 only:
//   which 0: conv_weight[o, ...] * scale[o]                       the weight, [O, I / groups, kH, kW], contiguous
//   which 1: conv_bias[o] * scale[o] + shift[o] (shift[o] alone without a conv bias)                 the bias, [O]
// with scale and shift as batch_norm_scale_shift computes them (eager's two terms per channel).
at::Tensor conv_fold_cpu(const at::Tensor& conv_weight, const std::optional<at::Tensor>& conv_bias,
                         const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                         const at::Tensor& running_mean, const at::Tensor& running_var, double eps, int64_t which) {
  TORCH_CHECK(which == 0 || which == 1, "graphex_fused::conv_batch_norm_fold: which must be 0 (weight) or 1 (bias)");
  TORCH_CHECK(conv_weight.scalar_type() == at::kFloat && conv_weight.dim() >= 2,
              "graphex_fused::conv_batch_norm_fold: conv_weight must be a float32 convolution weight, got ",
              conv_weight.scalar_type(), conv_weight.sizes());
  const int64_t channels = conv_weight.size(0);
  if (conv_bias) {
    TORCH_CHECK(conv_bias->scalar_type() == at::kFloat, "graphex_fused::conv_batch_norm_fold: conv_bias must be float32");
    check_channels("conv_bias", *conv_bias, channels);
  }
  TORCH_CHECK(running_mean.dim() == 1 && running_mean.size(0) == channels,
              "graphex_fused::conv_batch_norm_fold: running_mean must have shape [", channels,
              "] (the convolution's output channels), got ", running_mean.sizes());
  check_channels("running_var", running_var, channels);
  if (weight) check_channels("weight", *weight, channels);
  if (bias) check_channels("bias", *bias, channels);
  // float32 [C] vectors read in place (the pass hands over parameters and buffers as they are): no temporaries, no
  // dispatcher calls, as this runs on every call
  auto floats = [](const at::Tensor& t) {
    return t.scalar_type() == at::kFloat && t.is_contiguous() ? t : t.to(at::kFloat).contiguous();
  };
  const at::Tensor m = floats(running_mean), v = floats(running_var);
  const at::Tensor bw = weight ? floats(*weight) : at::Tensor(), bb = bias ? floats(*bias) : at::Tensor();
  const at::Tensor cb = conv_bias ? floats(*conv_bias) : at::Tensor();
  const float* mp = m.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  const float* bwp = bw.defined() ? bw.data_ptr<float>() : nullptr;
  const float* bbp = bb.defined() ? bb.data_ptr<float>() : nullptr;
  const float* cbp = cb.defined() ? cb.data_ptr<float>() : nullptr;
  const float e = static_cast<float>(eps);
  // batch_norm_scale_shift's two terms, the same expressions
  auto scale_of = [&](int64_t c) { return 1.f / std::sqrt(vp[c] + e) * (bwp ? bwp[c] : 1.f); };
  if (which == 1) {
    at::Tensor out = at::empty({channels}, running_mean.options().dtype(at::kFloat));
    float* o = out.data_ptr<float>();
    for (const auto c : c10::irange(channels)) {
      const float sc = scale_of(c);
      const float shift = (bbp ? bbp[c] : 0.f) - mp[c] * sc;
      o[c] = cbp ? cbp[c] * sc + shift : shift;
    }
    return out;
  }
  const at::Tensor w = conv_weight.is_contiguous() ? conv_weight : conv_weight.contiguous();
  at::Tensor out = at::empty(w.sizes(), w.options());
  const int64_t inner = w.numel() / channels;
  const float* in = w.data_ptr<float>();
  float* o = out.data_ptr<float>();
  const RowKernels& k = row_kernels();
  // a slice of 64K weights a thread (a [64, 64, 3, 3] weight is one); the product is one rounding either way
  at::parallel_for(0, channels, std::max<int64_t>(1, 65536 / std::max<int64_t>(inner, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) k.scale(scale_of(c), in + c * inner, o + c * inner, inner);
  });
  return out;
}

at::Tensor conv_fold_meta(const at::Tensor& conv_weight, const std::optional<at::Tensor>& /*conv_bias*/,
                          const std::optional<at::Tensor>& /*weight*/, const std::optional<at::Tensor>& /*bias*/,
                          const at::Tensor& running_mean, const at::Tensor& /*running_var*/, double /*eps*/,
                          int64_t which) {
  TORCH_CHECK(which == 0 || which == 1, "graphex_fused::conv_batch_norm_fold: which must be 0 (weight) or 1 (bias)");
  if (which == 1) return at::empty({conv_weight.size(0)}, running_mean.options().dtype(at::kFloat));
  return at::empty(conv_weight.sizes(), conv_weight.options());
}

}  // namespace
}  // namespace graphex::fused

TORCH_LIBRARY_IMPL(graphex_fused, CPU, m) {
  m.impl("batch_norm_scale_shift", &graphex::fused::scale_shift_cpu);
  m.impl("conv_batch_norm_fold", &graphex::fused::conv_fold_cpu);
}

TORCH_LIBRARY_IMPL(graphex_fused, Meta, m) {
  m.impl("batch_norm_scale_shift", &graphex::fused::scale_shift_meta);
  m.impl("conv_batch_norm_fold", &graphex::fused::conv_fold_meta);
}
