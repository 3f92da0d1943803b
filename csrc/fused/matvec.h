// x @ weight^T (+ bias) for one row of x in bfloat16 / float16 (matvec.cpp), for the other fused kernels too.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace graphex::fused {

// True when matvec_cpu runs its own kernel: one row of x, x and weight one reduced dtype on the CPU, weight
// [N, K] row-major or the transpose of a row-major [K, N].
bool matvec_applies(const at::Tensor& x, const at::Tensor& weight);

// x @ weight^T (+ bias); eager's matmul where matvec_applies is false.
at::Tensor matvec_cpu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias);

}  // namespace graphex::fused
