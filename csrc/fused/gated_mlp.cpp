// The gated MLP of Llama-style decoders: down(act(gate(x)) * up(x)), act SiLU (Llama) or a GELU (Gemma's tanh GELU,
// the erf GELU).
//   silu_mul(gate, up) = silu(gate) * up in one pass (eager: silu, then mul).
//   gated_mlp(x, w_gate, w_up, w_down, activation): the whole block as one op: the three matmuls are eager's
//   own at::mm on the same operands as the linear layers' decomposition (so bitwise equal), with
//   act * up done in place between them; one op where the graph has about 13 (t, view, mm, ...).
//   activation "silu": silu * up in one pass of ours; "gelu" / "gelu_tanh": eager's own gelu kernel (oneDNN's or
//   ATen's, as eager picks it) and mul, in place, so a float32 GELU-gated MLP of several rows is eager's bit for bit
//   and its edge cases are eager's (Note [An erf GELU's special inputs are eager's own], pointwise.h, for why no
//   formula of ours). One row (a decode step) runs matvec (matvec.cpp) for the three products, in every dtype.
//   gated_mlp_packed(x, w_gate_up, w_down, activation): the same block with one projection for gate and up
//   (Phi3's gate_up_proj, `gate, up = linear(x, w_gate_up).chunk(2, -1)`): one product, as eager computes it, whose
//   first half is the gate and second half the up; then as gated_mlp.
// Tolerance: Note [Fused kernels are close, not bitwise] (library.cpp); only exp differs from eager's.
#include "fused/matvec.h"
#include "fused/rows.h"
#include "fused/vec.h"

#include <ATen/ops/_unsafe_view.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/narrow.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/silu.h>
#include <c10/util/accumulate.h>
#include <torch/library.h>

#include <algorithm>
#include <type_traits>

namespace graphex::fused {
namespace {

// out (contiguous, `shape`) = silu(gate) * up; gate and up have `shape` (no broadcasting); one dtype T
// (Note [Reduced precision runs the float32 rows], rows.h). out may be gate: each row is read before it is written.
// Note [A reduced-precision silu is rounded before its product]
// Eager computes silu(gate) * up in two ops: silu rounds its result to the dtype, then the product rounds again.
// In bfloat16/float16 the kernel does the same (silu in float32, rounded to T and back, then the product), so its
// result is eager's up to silu's exp in the last float32 bit. Rounded once, the product differed from eager's by an
// ulp of T in many elements; a down projection that cancels turned that into more than the stated tolerance (a
// helper's Phi3 MLP in bfloat16 with activations ~8: 27 of 1344 outputs). float32 needs no step: its silu is float32.
template <typename T>
void silu_mul_rows(const at::Tensor& gate, const at::Tensor& up, at::Tensor& out) {
  const auto shape = out.sizes();
  if (out.numel() == 0) return;
  const int64_t n = shape.back();
  std::array<at::Tensor, 2> ops{rows_view(gate, shape), rows_view(up, shape)};
  const T* g = ops[0].const_data_ptr<T>();
  const T* u = ops[1].const_data_ptr<T>();
  T* o = out.mutable_data_ptr<T>();
  const RowKernels& K = row_kernels();
  for_each_row(shape, ops, 8 * n, [&](int64_t row, const std::array<int64_t, 2>& off) {
    FloatRows<T>& f = float_rows<T>(n);
    const float* gf = f.in(0, g + off[0], n);
    const float* uf = f.in(1, u + off[1], n);
    float* of = f.out(2, o + row * n, n);
    if constexpr (std::is_same_v<T, float>) {
      K.silu_mul(gf, uf, of, n);
    } else {
      float* ones = f.out(3, nullptr, n);
      std::fill(ones, ones + n, 1.f);
      K.silu_mul(gf, ones, of, n);  // silu(g) * 1: silu(g) exactly
      for (int64_t i = 0; i < n; ++i) of[i] = static_cast<float>(static_cast<T>(of[i])) * uf[i];
    }
    f.store(of, o + row * n, n);
  });
}

void silu_mul_into(const at::Tensor& gate, const at::Tensor& up, at::Tensor& out) {
  dispatch_float(out.scalar_type(), [&](auto t) { silu_mul_rows<decltype(t)>(gate, up, out); });
}

at::Tensor silu_mul_cpu(const at::Tensor& gate, const at::Tensor& up) {
  if (!all_cpu_one_float_dtype(gate, up) || gate.dim() < 1 || gate.sizes() != up.sizes())
    return at::mul(at::silu(gate), up);
  at::Tensor out = at::empty(gate.sizes(), gate.options());
  silu_mul_into(gate, up, out);
  return out;
}

at::Tensor silu_mul_meta(const at::Tensor& gate, const at::Tensor& up) {
  return at::empty(at::infer_size_dimvector(gate.sizes(), up.sizes()),
                   gate.options().dtype(at::result_type(gate, up)));
}

void check_mlp(const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up, const at::Tensor& w_down) {
  TORCH_CHECK(x.dim() >= 1 && w_gate.dim() == 2 && w_up.dim() == 2 && w_down.dim() == 2,
              "graphex_fused::gated_mlp: x must be at least 1-d and the weights 2-d, got x ", x.sizes(), ", w_gate ",
              w_gate.sizes(), ", w_up ", w_up.sizes(), ", w_down ", w_down.sizes());
  TORCH_CHECK(w_gate.sizes() == w_up.sizes() && w_gate.size(1) == x.size(-1) && w_down.size(1) == w_gate.size(0),
              "graphex_fused::gated_mlp: shapes do not chain: x ", x.sizes(), ", w_gate ", w_gate.sizes(), ", w_up ",
              w_up.sizes(), ", w_down ", w_down.sizes(), " (want w_gate = w_up = [I, H], w_down = [O, I])");
}

// x as rows of its last dimension: the product of the others (reshape's -1 is ambiguous when the last one is 0).
int64_t rows_of(const at::Tensor& x) { return c10::multiply_integers(x.sizes().begin(), x.sizes().end() - 1); }

// Whether the block's products run matvec: one row (a decode step) reads each weight once, at its own width
// (matvec.cpp), in float32 too (Note [A float32 row runs matvec too], graphex/fusion/patterns.py: ATen's one-row mm
// took 1.6-3x its time here). Several rows keep eager's mm, so that their products are eager's bit for bit (a
// GELU-gated block of several rows is eager's whole).
bool products_run_matvec(const at::Tensor& x2, const at::Tensor& w) { return matvec_applies(x2, w); }

at::DimVector mlp_shape(const at::Tensor& x, const at::Tensor& w_down) {
  at::DimVector shape(x.sizes().begin(), x.sizes().end());
  shape.back() = w_down.size(0);
  return shape;
}

void check_activation(c10::string_view activation) {
  TORCH_CHECK(activation == "silu" || activation == "gelu" || activation == "gelu_tanh",
              "graphex_fused::gated_mlp: activation must be 'silu', 'gelu' or 'gelu_tanh', got '", activation, "'");
}

at::Tensor gated_mlp_cpu(const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up,
                         const at::Tensor& w_down, c10::string_view activation) {
  check_mlp(x, w_gate, w_up, w_down);
  check_activation(activation);
  at::Tensor x2 = x.reshape({rows_of(x), x.size(-1)});
  // otherwise eager's mm on the operands the linear layers' decomposition has
  const bool vec = products_run_matvec(x2, w_gate) && products_run_matvec(x2, w_up);
  auto linear = [&](const at::Tensor& a, const at::Tensor& w) {
    return vec ? matvec_cpu(a, w, std::nullopt) : at::mm(a, w.t());
  };
  at::Tensor gate = linear(x2, w_gate);
  at::Tensor up = linear(x2, w_up);
  if (activation != "silu") {  // eager's kernels, in place on the fresh product (the same values as eager's out of place)
    at::gelu_(gate, activation == "gelu" ? "none" : "tanh").mul_(up);
  } else if (all_cpu_one_float_dtype(gate, up) && gate.is_contiguous() && up.is_contiguous()) {
    silu_mul_into(gate, up, gate);  // row by row, each element read before it is written
  } else {
    gate = at::mul(at::silu(gate), up);
  }
  // The schema returns a new tensor: the product reshaped without becoming a view of it (`_unsafe_view`, as
  // at::matmul does), so the result has no `_base`, as eager's linear's has none (found by a helper).
  return at::_unsafe_view(linear(gate, w_down), mlp_shape(x, w_down));
}

void check_packed(const at::Tensor& x, const at::Tensor& w_gate_up, const at::Tensor& w_down) {
  TORCH_CHECK(x.dim() >= 1 && w_gate_up.dim() == 2 && w_down.dim() == 2 && w_gate_up.size(0) % 2 == 0 &&
                  w_gate_up.size(1) == x.size(-1) && w_down.size(1) * 2 == w_gate_up.size(0),
              "graphex_fused::gated_mlp_packed: shapes do not chain: x ", x.sizes(), ", w_gate_up ", w_gate_up.sizes(),
              ", w_down ", w_down.sizes(), " (want w_gate_up = [2I, H], its gate rows first, and w_down = [O, I])");
}

at::Tensor gated_mlp_packed_cpu(const at::Tensor& x, const at::Tensor& w_gate_up, const at::Tensor& w_down,
                                c10::string_view activation) {
  check_packed(x, w_gate_up, w_down);
  check_activation(activation);
  at::Tensor x2 = x.reshape({rows_of(x), x.size(-1)});
  const bool vec = products_run_matvec(x2, w_gate_up);
  at::Tensor both = vec ? matvec_cpu(x2, w_gate_up, std::nullopt) : at::mm(x2, w_gate_up.t());
  const int64_t inner = w_down.size(1);
  at::Tensor gate = both.narrow(1, 0, inner), up = both.narrow(1, inner, inner);
  at::Tensor act;
  if (activation != "silu") {  // eager's kernels: the activation out of place on the gate half, then the product
    act = at::gelu(gate, activation == "gelu" ? "none" : "tanh").mul_(up);
  } else if (all_cpu_one_float_dtype(gate, up)) {
    act = at::empty({x2.size(0), inner}, both.options());
    silu_mul_into(gate, up, act);  // rows of the halves at the product's row stride (rows_view)
  } else {
    act = at::mul(at::silu(gate), up);
  }
  at::Tensor down = vec ? matvec_cpu(act, w_down, std::nullopt) : at::mm(act, w_down.t());
  return at::_unsafe_view(down, mlp_shape(x, w_down));  // a new tensor, no `_base` (as gated_mlp's)
}

at::Tensor gated_mlp_packed_meta(const at::Tensor& x, const at::Tensor& w_gate_up, const at::Tensor& w_down,
                                 c10::string_view activation) {
  check_packed(x, w_gate_up, w_down);
  check_activation(activation);
  return at::empty(mlp_shape(x, w_down), x.options().dtype(at::result_type(x, w_down)));
}

at::Tensor gated_mlp_meta(const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up,
                          const at::Tensor& w_down, c10::string_view activation) {
  check_mlp(x, w_gate, w_up, w_down);
  check_activation(activation);
  return at::empty(mlp_shape(x, w_down), x.options().dtype(at::result_type(x, w_down)));
}

}  // namespace
}  // namespace graphex::fused

TORCH_LIBRARY_IMPL(graphex_fused, CPU, m) {
  m.impl("silu_mul", &graphex::fused::silu_mul_cpu);
  m.impl("gated_mlp", &graphex::fused::gated_mlp_cpu);
  m.impl("gated_mlp_packed", &graphex::fused::gated_mlp_packed_cpu);
}

TORCH_LIBRARY_IMPL(graphex_fused, Meta, m) {
  m.impl("silu_mul", &graphex::fused::silu_mul_meta);
  m.impl("gated_mlp", &graphex::fused::gated_mlp_meta);
  m.impl("gated_mlp_packed", &graphex::fused::gated_mlp_packed_meta);
}
