// max_pool2d without indices: eager's max_pool2d_with_indices, whose indices a model in inference never reads
// (nn.MaxPool2d returns the values only), computes and stores an int64 index per output besides the value.
//   x [N, C, H, W] or [C, H, W], contiguous, float32 / bfloat16 / float16; kernel, stride, padding, dilation, ceil_mode
//   as aten::max_pool2d. Other layouts (channels_last), dtypes and devices run eager's at::max_pool2d.
//
// Note [Max pooling picks eager's element]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Each output is eager's: the same window (ATen's pooling_output_shape and window bounds), scanned in eager's order
// (rows, then columns), keeping a value when `v > max || isnan(v)` from max = -inf, as ATen's CPU kernel
// (cpu_max_pool) does. The result is one of the window's elements, the same one eager picks, so it is bit for bit
// eager's, signed zeros and NaNs included (tests/python/test_max_pool.py, under every ATEN_CPU_CAPABILITY).
#include "fused/rows.h"
#include "fused/vec.h"

#include <ATen/native/Pool.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/max_pool2d.h>
#include <torch/library.h>


namespace graphex::fused {
namespace {

MaxPool pool_args(at::IntArrayRef kernel, at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation) {
  TORCH_CHECK(kernel.size() == 1 || kernel.size() == 2, "graphex_fused::max_pool2d: kernel_size must be 1 or 2 ints");
  const int64_t kH = kernel[0], kW = kernel.size() == 1 ? kH : kernel[1];
  const int64_t sH = stride.empty() ? kH : stride[0], sW = stride.empty() ? kW : stride.size() == 1 ? sH : stride[1];
  const int64_t pH = padding[0], pW = padding.size() == 1 ? pH : padding[1];
  const int64_t dH = dilation[0], dW = dilation.size() == 1 ? dH : dilation[1];
  return {kH, kW, sH, sW, pH, pW, dH, dW};
}

at::DimVector out_shape(const at::Tensor& x, const MaxPool& p, bool ceil_mode) {
  TORCH_CHECK(x.dim() == 3 || x.dim() == 4, "graphex_fused::max_pool2d: want [N, C, H, W] or [C, H, W], got ",
              x.sizes());
  const int64_t H = x.size(-2), W = x.size(-1);
  const int64_t OH = at::native::pooling_output_shape<int64_t>(H, p.kH, p.pH, p.sH, p.dH, ceil_mode);
  const int64_t OW = at::native::pooling_output_shape<int64_t>(W, p.kW, p.pW, p.sW, p.dW, ceil_mode);
  at::DimVector shape(x.sizes().begin(), x.sizes().end());
  shape[shape.size() - 2] = OH;
  shape[shape.size() - 1] = OW;
  return shape;
}

template <typename T>
void pool_planes(const at::Tensor& x, at::Tensor& out, const MaxPool& p) {
  const int64_t H = x.size(-2), W = x.size(-1), OH = out.size(-2), OW = out.size(-1);
  const int64_t planes = x.numel() / std::max<int64_t>(1, H * W);
  const T* xp = x.const_data_ptr<T>();
  T* op = out.mutable_data_ptr<T>();
  const RowKernels& K = row_kernels();
  at::parallel_for(0, planes, std::max<int64_t>(1, 32768 / std::max<int64_t>(1, H * W)), [&](int64_t b, int64_t e) {
    for (int64_t plane = b; plane < e; ++plane) {
      const T* in = xp + plane * H * W;
      T* o = op + plane * OH * OW;
      if constexpr (std::is_same_v<T, float>) K.max_pool_f32(in, o, p, H, W, OH, OW);
      else if constexpr (std::is_same_v<T, c10::BFloat16>) K.max_pool_bf16(in, o, p, H, W, OH, OW);
      else K.max_pool_half(in, o, p, H, W, OH, OW);
    }
  });
}

at::Tensor max_pool2d_cpu(const at::Tensor& x, at::IntArrayRef kernel, at::IntArrayRef stride, at::IntArrayRef padding,
                          at::IntArrayRef dilation, bool ceil_mode) {
  const at::ScalarType d = x.scalar_type();
  const bool ours = (d == at::kFloat || d == at::kBFloat16 || d == at::kHalf) && x.device().is_cpu() &&
                    (x.dim() == 3 || x.dim() == 4) && x.is_contiguous();
  if (!ours) return at::max_pool2d(x, kernel, stride, padding, dilation, ceil_mode);
  const MaxPool p = pool_args(kernel, stride, padding, dilation);
  const auto shape = out_shape(x, p, ceil_mode);
  // eager's argument checks (kernel, stride, padding <= kernel / 2, dilation, a non-empty output), as eager words them
  at::native::pool2d_shape_check(x, p.kH, p.kW, p.sH, p.sW, p.pH, p.pW, p.dH, p.dW, x.size(-3), x.size(-2),
                                 x.size(-1), shape[shape.size() - 2], shape.back(), x.suggest_memory_format());
  at::Tensor out = at::empty(shape, x.options());
  if (out.numel() == 0) return out;
  dispatch_float(d, [&](auto t) {
    using T = decltype(t);
    pool_planes<T>(x, out, p);
  });
  return out;
}

at::Tensor max_pool2d_meta(const at::Tensor& x, at::IntArrayRef kernel, at::IntArrayRef stride,
                           at::IntArrayRef padding, at::IntArrayRef dilation, bool ceil_mode) {
  return at::empty(out_shape(x, pool_args(kernel, stride, padding, dilation), ceil_mode), x.options());
}

}  // namespace
}  // namespace graphex::fused

TORCH_LIBRARY_IMPL(graphex_fused, CPU, m) { m.impl("max_pool2d", &graphex::fused::max_pool2d_cpu); }

TORCH_LIBRARY_IMPL(graphex_fused, Meta, m) { m.impl("max_pool2d", &graphex::fused::max_pool2d_meta); }
