// The row kernels of the fused ops, compiled once per CPU capability and picked at run time.
//
// Note [One row kernel per CPU capability]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// at::vec::Vectorized<float> is as wide as the flags its file is compiled with. As ATen does for its
// own kernels, vec_kernels.h is compiled twice: vec_default.cpp (the baseline instruction set) and
// vec_avx2.cpp (-mavx2 -mfma, CPU_CAPABILITY=AVX2, so its symbols live in another namespace);
// row_kernels() picks the table ATen itself would (at::get_cpu_capability(), which honours
// ATEN_CPU_CAPABILITY=default). Both keep eager's per-element order of operations, with FMA
// contraction off (Note [Fused kernels are close, not bitwise], library.cpp).
#pragma once

#include "fused/pointwise.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

namespace graphex::fused {

struct MaxPool {  // max_pool2d's window: kernel, stride, padding, dilation per dimension (max_pool.cpp)
  int64_t kH, kW, sH, sW, pH, pW, dH, dW;
};

struct RowKernels {
  // out[i] = (x[i] * inv) * w[i] (w[0] when w_broadcast), inv = 1 / sqrt(sum(x^2) / n + eps)
  void (*rms_norm)(const float* x, const float* w, bool w_broadcast, float* out, int64_t n, float eps);
  void (*add)(const float* a, const float* b, float* out, int64_t n);                  // out = a + b
  // out[i] = ((x[i] - mean) * rstd) * w[i] + b[i] (w, b null: left out), rstd = 1 / sqrt(var + eps) with the biased
  // variance of the row (layer_norm.cpp)
  void (*layer_norm)(const float* x, const float* w, const float* b, float* out, int64_t n, float eps);
  void (*silu_mul)(const float* g, const float* u, float* out, int64_t n);             // silu(g) * u
  void (*rotary)(const float* x, const float* c, const float* s, float* out, int64_t n);
  // interleaved pairs (rotary.cpp): tables per element, or per pair with half_tables
  void (*rotary_pairs)(const float* x, const float* c, const float* s, float* out, int64_t n, bool half_tables);
  float (*max_abs)(const float* x, int64_t n);  // max |x[i]|, NaN where any x[i] is NaN
  float (*dot)(const float* a, const float* b, int64_t n);
  float (*dot_f32)(const float* a, const float* b, int64_t n);  // the same sum, four accumulators (matvec's rows)
  // sum(a[i] * float(b[i])), b read as bfloat16 / float16 (matvec: a weight row streamed at its own width)
  float (*dot_bf16)(const float* a, const c10::BFloat16* b, int64_t n);
  float (*dot_half)(const float* a, const c10::Half* b, int64_t n);
  void (*axpy)(float a, const float* x, float* y, int64_t n);                          // y += a * x
  // y[i] += a[0] * w[i] + a[1] * w[stride + i] + ... over `rows` rows of a weight stored [K, N], float32, bfloat16 or
  // float16, in row order (matvec: Note [A weight stored [K, N] is read sixteen rows a pass], vec_kernels.h)
  void (*axpy_rows_f32)(const float* a, const float* w, int64_t stride, int64_t rows, float* y, int64_t n);
  void (*axpy_rows_bf16)(const float* a, const c10::BFloat16* w, int64_t stride, int64_t rows, float* y, int64_t n);
  void (*axpy_rows_half)(const float* a, const c10::Half* w, int64_t stride, int64_t rows, float* y, int64_t n);
  // one [H, W] plane of max_pool2d into [OH, OW] (max_pool_kernels.h)
  void (*max_pool_f32)(const float* in, float* o, const MaxPool& p, int64_t H, int64_t W, int64_t OH, int64_t OW);
  void (*max_pool_bf16)(const c10::BFloat16* in, c10::BFloat16* o, const MaxPool& p, int64_t H, int64_t W,
                        int64_t OH, int64_t OW);
  void (*max_pool_half)(const c10::Half* in, c10::Half* o, const MaxPool& p, int64_t H, int64_t W, int64_t OH,
                        int64_t OW);
  // one tile of a graphex_fused::pointwise program (pointwise_kernels.h)
  // (special: Note [An erf GELU's special inputs are eager's own], pointwise.h)
  void (*pointwise_tile)(const PwInstr* code, int64_t n_code, float* const* slots, const float* consts, int64_t n,
                         GeluSpecial special);
  const char* capability;
};

const RowKernels& row_kernels();

}  // namespace graphex::fused
