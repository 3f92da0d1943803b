// Rotary position embedding: x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1) of the
// two halves of the last dimension, in one pass (eager: mul, split or two slices, neg, cat, mul, add).
// Each element sees eager's operations in eager's order ((x * c) + ((-x2) * s)), with FMA
// contraction off, so on float32 the result is bitwise eager's; bfloat16 and float16 round as eager rounds
// (Note [Rotary rounds as eager rounds]), so they are eager's bit for bit too.
// interleaved: the pairs (x[2i], x[2i + 1]) are rotated instead (GPT-J's rotate_every_two, or the pairs written out
// with a stack): out[2i] = x[2i] c - x[2i + 1] s, out[2i + 1] = x[2i + 1] c' + x[2i] s', with cos and sin of x's
// last dimension (one entry per element, GPT-J's duplicated tables) or of half of it (one entry per pair).
#include "fused/rows.h"
#include "fused/vec.h"

#include <ATen/ops/add.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/neg.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/sub.h>
#include <torch/library.h>

#include <cstring>
#include <type_traits>

namespace graphex::fused {
namespace {

// The tables' last dimension for interleaved pairs: x's (one entry per element) or half of it (one per pair).
bool half_tables(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t n = x.size(-1);
  TORCH_CHECK(cos.dim() >= 1 && sin.dim() >= 1 && cos.size(-1) == sin.size(-1) &&
                  (cos.size(-1) == n || 2 * cos.size(-1) == n),
              "graphex_fused::rotary(interleaved=True): cos and sin must have x's last dimension (", n,
              ", one entry per element) or half of it (one per pair), got ", cos.sizes(), " and ", sin.sizes());
  return 2 * cos.size(-1) == n;
}

at::DimVector rotary_shape(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool interleaved) {
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) % 2 == 0, "graphex_fused::rotary: x's last dimension must be even, got x ",
              x.sizes());
  if (!interleaved) return at::infer_size_dimvector(at::infer_size_dimvector(x.sizes(), cos.sizes()), sin.sizes());
  half_tables(x, cos, sin);
  auto lead = [](const at::Tensor& t) { return t.sizes().slice(0, t.dim() - 1); };
  at::DimVector shape = at::infer_size_dimvector(at::infer_size_dimvector(lead(x), lead(cos)), lead(sin));
  shape.push_back(x.size(-1));
  return shape;
}

at::Tensor rotary_eager(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool interleaved) {
  if (!interleaved) {
    auto halves = x.chunk(2, -1);
    return at::add(at::mul(x, cos), at::mul(at::cat({at::neg(halves[1]), halves[0]}, -1), sin));
  }
  const at::Tensor x0 = x.slice(-1, 0, x.size(-1), 2), x1 = x.slice(-1, 1, x.size(-1), 2);
  const bool half = half_tables(x, cos, sin);
  auto table = [&](const at::Tensor& t, int64_t start) { return half ? t : t.slice(-1, start, t.size(-1), 2); };
  const at::Tensor even = at::sub(at::mul(x0, table(cos, 0)), at::mul(x1, table(sin, 0)));
  const at::Tensor odd = at::add(at::mul(x1, table(cos, 1)), at::mul(x0, table(sin, 1)));
  return at::stack({even, odd}, -1).flatten(-2);
}

// The output has x's memory layout when it has x's shape (as eager's mul/add give it, which later views
// of the graph were traced with; e.g. q seen as [B, H, T, D] over [B, T, H, D] memory), else contiguous.
at::Tensor rotary_output(const at::Tensor& x, at::IntArrayRef shape, at::ScalarType dtype = at::kFloat) {
  if (x.sizes() == shape && x.is_non_overlapping_and_dense() && (x.stride(-1) == 1 || x.size(-1) <= 1))
    return at::empty_strided(x.sizes(), x.strides(), x.options().dtype(dtype));
  return at::empty(shape, x.options().dtype(dtype));
}

// Note [Rotary rounds as eager rounds]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// In bfloat16 / float16 eager rounds each product (x * cos, rotate_half(x) * sin) to the dtype before it adds them,
// and rounds the sum. Rounding once instead (Note [Reduced precision runs the float32 rows], rows.h) is closer to the
// exact value but not to eager's where the two products cancel (q * cos - q' * sin with q, q' close: eager 0, rounded
// once 0.35; found by a helper), outside the reduced tolerance. So each product and each sum is computed in float32
// (exact for a product of two bfloat16 or float16 values) and rounded to T where eager rounds it: the result is
// eager's bit for bit in every dtype.
template <typename T>
void rotary_row_rounded(const T* x, const T* c, const T* s, T* out, int64_t n, bool interleaved, bool half) {
  auto prod = [](T a, T b) { return static_cast<float>(static_cast<T>(static_cast<float>(a) * static_cast<float>(b))); };
  auto neg = [](T a) { return static_cast<T>(-static_cast<float>(a)); };  // exact
  if (!interleaved) {  // x * cos + cat(-x2, x1) * sin
    const int64_t h = n / 2;
    for (int64_t j = 0; j < h; ++j) {
      out[j] = static_cast<T>(prod(x[j], c[j]) + prod(neg(x[h + j]), s[j]));
      out[h + j] = static_cast<T>(prod(x[h + j], c[h + j]) + prod(x[j], s[h + j]));
    }
    return;
  }
  for (int64_t i = 0; i + 1 < n; i += 2) {  // pairs: out[2i] = x0 c0 - x1 s0, out[2i + 1] = x1 c1 + x0 s1
    const int64_t j0 = half ? i / 2 : i, j1 = half ? i / 2 : i + 1;
    out[i] = static_cast<T>(prod(x[i], c[j0]) - prod(x[i + 1], s[j0]));
    out[i + 1] = static_cast<T>(prod(x[i + 1], c[j1]) + prod(x[i], s[j1]));
  }
}

// Rotates the first `rotated` elements of each row of `out` from x's rows (n wide) and copies the rest: the one row
// loop of rotary (rotated = n) and partial_rotary (Note [A partial rotary writes its tail in the same pass]).
void rotate_rows(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& out,
                 at::IntArrayRef shape, int64_t rotated, int64_t table_n, bool interleaved, bool half) {
  const int64_t n = shape.back();
  at::DimVector table_shape(shape.begin(), shape.end());
  table_shape.back() = table_n;
  std::array<at::Tensor, 4> ops{rows_view(x, shape), rows_view(cos, table_shape), rows_view(sin, table_shape), out};
  dispatch_float(x.scalar_type(), [&](auto t) {
    using T = decltype(t);
    const T* xp = ops[0].const_data_ptr<T>();
    const T* cp = ops[1].const_data_ptr<T>();
    const T* sp = ops[2].const_data_ptr<T>();
    T* op = out.mutable_data_ptr<T>();
    const RowKernels& K = row_kernels();
    for_each_row(shape, ops, 4 * n, [&](int64_t row, const std::array<int64_t, 4>& off) {
      const T* xr = xp + off[0];
      T* orow = op + off[3];
      if constexpr (!std::is_same_v<T, float>) {  // Note [Rotary rounds as eager rounds]
        rotary_row_rounded(xr, cp + off[1], sp + off[2], orow, rotated, interleaved, half);
      } else {
        if (interleaved) K.rotary_pairs(xr, cp + off[1], sp + off[2], orow, rotated, half);
        else K.rotary(xr, cp + off[1], sp + off[2], orow, rotated);
      }
      if (rotated < n) std::memcpy(orow + rotated, xr + rotated, static_cast<size_t>(n - rotated) * sizeof(T));
    });
  });
}

at::Tensor rotary_cpu(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool interleaved) {
  const auto shape = rotary_shape(x, cos, sin, interleaved);
  const int64_t n = shape.back();
  const bool half = interleaved && half_tables(x, cos, sin);
  const int64_t table_n = half ? n / 2 : n;
  // The fast path: one float dtype, x not broadcast along its rows, cos and sin full rows (or one value).
  if (!all_cpu_one_float_dtype(x, cos, sin) || x.size(-1) != n || cos.size(-1) != table_n || sin.size(-1) != table_n)
    return rotary_eager(x, cos, sin, interleaved);
  at::Tensor out = rotary_output(x, shape, x.scalar_type());
  if (out.numel() == 0) return out;
  rotate_rows(x, cos, sin, out, shape, n, table_n, interleaved, half);
  return out;
}

// Note [A partial rotary writes its tail in the same pass]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// GPT-NeoX (rotary_pct < 1), Phi and others rotate only the first r elements of each head and pass the rest through:
// cat([rotary(x[..., :r], cos, sin), x[..., r:]], -1). Fused mode ran that as two slices, the rotary kernel and a cat
// (4-5 us per call on a one-token step, twice per layer). partial_rotary writes the whole row at once: the first r
// elements as rotary's row kernel computes them (so each is the rotary op's value, eager's bit for bit), the other
// n - r copied. Its output is contiguous, as cat's is; graphex/fusion/partial_rotary.py rewrites only where the cat's
// result was contiguous, of x's shape and dtype.
at::DimVector partial_rotary_shape(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.dim() >= 1 && cos.dim() >= 1 && sin.dim() >= 1 && cos.size(-1) == sin.size(-1) &&
                  cos.size(-1) % 2 == 0 && cos.size(-1) <= x.size(-1),
              "graphex_fused::partial_rotary: cos and sin must have one even last dimension r <= x's, got x ", x.sizes(),
              ", cos ", cos.sizes(), ", sin ", sin.sizes());
  auto lead = [](const at::Tensor& t) { return t.sizes().slice(0, t.dim() - 1); };
  at::DimVector shape = at::infer_size_dimvector(at::infer_size_dimvector(lead(x), lead(cos)), lead(sin));
  TORCH_CHECK(at::IntArrayRef(shape) == lead(x), "graphex_fused::partial_rotary: cos and sin must broadcast to x's ",
              "rows, got x ", x.sizes(), ", cos ", cos.sizes(), ", sin ", sin.sizes());
  shape.push_back(x.size(-1));
  return shape;
}

at::Tensor partial_rotary_cpu(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const auto shape = partial_rotary_shape(x, cos, sin);
  const int64_t n = shape.back(), r = cos.size(-1);
  if (!all_cpu_one_float_dtype(x, cos, sin))
    return at::cat({rotary_cpu(x.slice(-1, 0, r), cos, sin, false), x.slice(-1, r, n)}, -1).contiguous();
  at::Tensor out = at::empty(shape, x.options());
  if (out.numel() == 0) return out;
  rotate_rows(x, cos, sin, out, shape, r, r, false, false);
  return out;
}

at::Tensor partial_rotary_meta(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.scalar_type() == cos.scalar_type() && x.scalar_type() == sin.scalar_type(),
              "graphex_fused::partial_rotary: x, cos and sin must have one dtype, got ", x.scalar_type(), ", ",
              cos.scalar_type(), ", ", sin.scalar_type());
  return at::empty(partial_rotary_shape(x, cos, sin), x.options());
}

at::Tensor rotary_meta(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool interleaved) {
  return rotary_output(x, rotary_shape(x, cos, sin, interleaved),
                       c10::promoteTypes(at::result_type(x, cos), sin.scalar_type()));
}

}  // namespace
}  // namespace graphex::fused

TORCH_LIBRARY_IMPL(graphex_fused, CPU, m) {
  m.impl("rotary", &graphex::fused::rotary_cpu);
  m.impl("partial_rotary", &graphex::fused::partial_rotary_cpu);
}

TORCH_LIBRARY_IMPL(graphex_fused, Meta, m) {
  m.impl("rotary", &graphex::fused::rotary_meta);
  m.impl("partial_rotary", &graphex::fused::partial_rotary_meta);
}
