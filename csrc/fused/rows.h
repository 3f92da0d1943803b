// Rows of a broadcast: the float32 fused kernels work one last-dimension row at a time.
#pragma once

#include <ATen/ExpandUtils.h>
#include <ATen/Parallel.h>
#include <ATen/ops/result_type.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <array>
#include <cstdint>

namespace graphex::fused {

// True when every tensor is float32 on the CPU: the fast paths' condition.
template <typename... T>
bool all_cpu_float(const T&... ts) {
  return ((ts.scalar_type() == at::kFloat && ts.device().is_cpu()) && ...);
}

// `t` expanded to `shape`, with a last dimension of stride 1 unless it is broadcast (size 1 there).
inline at::Tensor rows_view(const at::Tensor& t, at::IntArrayRef shape) {
  at::Tensor r = (t.dim() > 0 && t.size(-1) > 1 && t.stride(-1) != 1) ? t.contiguous() : t;
  return r.expand(shape);
}

// Calls fn(row, offsets) for every row of `shape` (all dimensions but the last), where offsets[k]
// is where that row starts in operand k (in elements, from its data pointer). Rows are split over
// ATen's intra-op threads when there are enough of them.
template <size_t N, typename F>
void for_each_row(at::IntArrayRef shape, const std::array<at::Tensor, N>& ops, int64_t row_cost, F fn) {
  const int64_t nd = static_cast<int64_t>(shape.size());
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < nd; ++d) rows *= shape[d];
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, row_cost));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      std::array<int64_t, N> off{};
      int64_t rest = row;
      for (int64_t d = nd - 2; d >= 0; --d) {
        const int64_t i = rest % shape[d];
        rest /= shape[d];
        for (size_t k = 0; k < N; ++k) off[k] += i * ops[k].stride(d);
      }
      fn(row, off);
    }
  });
}

}  // namespace graphex::fused
