// The tile loop of graphex_fused::pointwise (Note [A chain of element-wise ops is one program], pointwise.h):
// included by vec_kernels.h, so it is compiled once per CPU capability (Note [One row kernel per CPU
// capability], vec.h). Each op is written as ATen's vectorized float kernel writes it (tanh GELU, sigmoid,
// SiLU, ReLU's clamp_min, maximum's NaN), so only the transcendental functions' tails differ from eager.
#pragma once

#include "fused/pointwise.h"

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace graphex::fused {
namespace CPU_CAPABILITY {

namespace pw {
using V = at::vec::Vectorized<float>;

template <typename F>
inline void unary(PwOperand a, float* d, int64_t n, F f) {
  for (int64_t i = 0; i < n; i += V::size()) f(V::loadu(a.p + i * a.inc)).store(d + i);
}

// Rounds each element to R (bfloat16 or float16, to nearest even, as eager's kernels store it) and back to float:
// two vectors at a time (n is a multiple of twice the vector width).
template <typename R>
inline void round_to(PwOperand a, float* d, int64_t n) {
  for (int64_t i = 0; i < n; i += 2 * V::size()) {
    const auto r = at::vec::convert_from_float<R>(V::loadu(a.p + i * a.inc), V::loadu(a.p + (i + V::size()) * a.inc));
    auto [lo, hi] = at::vec::convert_to_float<R>(r);
    lo.store(d + i);
    hi.store(d + i + V::size());
  }
}

// bfloat16's rounding (to nearest even, as c10::BFloat16 and ATen's vectorized stores round) done on the float's
// bits, so the value stays in a float register: a loop the compiler vectorizes, no packing to 16 bits and back.
// A NaN stays a (quiet) NaN.
inline void round_bf16(PwOperand a, float* d, int64_t n) {
  if (a.inc == 0) {  // a constant: round one element, broadcast it
    float one[1];
    round_bf16(PwOperand{a.p, 1}, one, 1);
    for (int64_t i = 0; i < n; ++i) d[i] = one[0];
    return;
  }
  const float* src = a.p;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, src + i, sizeof(u));
    const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    const uint32_t r = (u & 0x7FFFFFFFu) > 0x7F800000u ? ((u | 0x00400000u) & 0xFFFF0000u) : rounded;
    std::memcpy(d + i, &r, sizeof(r));
  }
}

// Note [An erf GELU's special inputs are eager's own] (pointwise.h): f over the tile, each element whose input is not
// ordinary (|x| < kGeluOrdinaryLimit, false for a NaN) replaced by eager's own result for it. Each vector's inputs are
// read before its results are stored: the destination may be the input's own slot (the chain reuses a dead slot), and
// reading the input after the store read the GELU's result instead (gelu(2e38) = inf, then eager's gelu(inf): NaN on a
// CPU whose oneDNN gives NaN at +inf, where eager gives inf; found on an AMD EPYC with AVX-512).
template <typename F>
inline void unary_with_specials(PwOperand a, float* d, int64_t n, GeluSpecial special, int32_t opcode, F f) {
  const V limit(kGeluOrdinaryLimit);
  for (int64_t i = 0; i < n; i += V::size()) {
    const V x = V::loadu(a.p + i * a.inc);
    V y = f(x);
    if (at::vec::Vectorized<float>(x.abs() < limit).zero_mask() != 0) {  // a lane not ordinary (a true lane is all ones)
      float xs[V::size()], ys[V::size()];
      x.store(xs);
      y.store(ys);
      for (int64_t l = 0; l < V::size(); ++l)
        if (!(std::fabs(xs[l]) < kGeluOrdinaryLimit)) ys[l] = special(xs[l], opcode);
      y = V::loadu(ys);
    }
    y.store(d + i);
  }
}

template <typename F>
inline void binary(PwOperand a, PwOperand b, float* d, int64_t n, F f) {
  for (int64_t i = 0; i < n; i += V::size()) f(V::loadu(a.p + i * a.inc), V::loadu(b.p + i * b.inc)).store(d + i);
}
}  // namespace pw

// Runs `code` over one tile of n elements (n a multiple of twice the vector width; slots hold kPointwiseTile
// floats). `consts` holds each constant 16 times over, so a constant loads as a vector like a slot.
inline void pointwise_tile(const PwInstr* code, int64_t n_code, float* const* slots, const float* consts,
                           int64_t n, GeluSpecial special) {
  using pw::V;
  const V one(1.f), half(0.5f), zero(0.f);
  auto operand = [&](int32_t r) -> PwOperand {
    return r >= 0 ? PwOperand{slots[r], 1} : PwOperand{consts + 16 * static_cast<int64_t>(-1 - r), 0};
  };
  for (int64_t k = 0; k < n_code; ++k) {
    const PwInstr& ins = code[k];
    float* d = slots[ins.dst];
    const PwOperand a = operand(ins.a), b = operand(ins.b);
    switch (static_cast<PwOp>(ins.op)) {
      case PwOp::add: pw::binary(a, b, d, n, [](V x, V y) { return x + y; }); break;
      case PwOp::sub: pw::binary(a, b, d, n, [](V x, V y) { return x - y; }); break;
      case PwOp::mul: pw::binary(a, b, d, n, [](V x, V y) { return x * y; }); break;
      case PwOp::div: pw::binary(a, b, d, n, [](V x, V y) { return x / y; }); break;
      case PwOp::maximum: pw::binary(a, b, d, n, [](V x, V y) { return at::vec::maximum(x, y); }); break;
      case PwOp::minimum: pw::binary(a, b, d, n, [](V x, V y) { return at::vec::minimum(x, y); }); break;
      case PwOp::pow: pw::binary(a, b, d, n, [](V x, V y) { return x.pow(y); }); break;
      case PwOp::neg: pw::unary(a, d, n, [](V x) { return x.neg(); }); break;
      case PwOp::abs: pw::unary(a, d, n, [](V x) { return x.abs(); }); break;
      case PwOp::exp: pw::unary(a, d, n, [](V x) { return x.exp(); }); break;
      case PwOp::log: pw::unary(a, d, n, [](V x) { return x.log(); }); break;
      case PwOp::tanh: pw::unary(a, d, n, [](V x) { return x.tanh(); }); break;
      case PwOp::sigmoid: pw::unary(a, d, n, [&](V x) { return (one + x.neg().exp()).reciprocal(); }); break;
      case PwOp::silu: pw::unary(a, d, n, [&](V x) { return x / (one + x.neg().exp()); }); break;
      case PwOp::relu: pw::unary(a, d, n, [&](V x) { return at::vec::clamp_min(x, zero); }); break;
      case PwOp::gelu_tanh: {
        const V beta(static_cast<float>(M_SQRT2 * M_2_SQRTPI * 0.5)), kappa(0.044715f);
        pw::unary(a, d, n, [&](V x) {
          const V inner = beta * (x + kappa * (x * x * x));
          return half * x * (one + inner.tanh());
        });
        break;
      }
      case PwOp::erf: pw::unary(a, d, n, [](V x) { return x.erf(); }); break;
      case PwOp::gelu_erf:  // oneDNN's erf GELU (float32, bfloat16, float16 input): chosen per call, pointwise.cpp
      case PwOp::gelu_erf_bf16:
      case PwOp::gelu_erf_f16: {
        // Note [The erf GELU as eager's kernels give it]: eager's CPU gelu is oneDNN's where ATen's use_mkldnn says so
        // (oneDNN enabled, a contiguous input of more than one element, a dtype oneDNN takes on this CPU), else ATen's
        // own kernel, gelu_erf_aten. chains.py picks gelu_erf_aten where the input is not contiguous or has one
        // element, else gelu_erf, gelu_erf_bf16 or gelu_erf_f16 by the input's dtype; pointwise.cpp turns those into
        // gelu_erf_aten per call where this process's oneDNN does not take them now (switched off, or the dtype not
        // supported on this CPU: a program exported on one machine follows eager on the one it runs on). Ordinary
        // values: x * (1 + erf(x / sqrt 2)) halved, as oneDNN orders it, within the tolerance of every kernel's; the
        // rest are eager's own (Note [An erf GELU's special inputs are eager's own], pointwise.h).
        const V r(static_cast<float>(M_SQRT1_2));
        pw::unary_with_specials(a, d, n, special, ins.op, [&](V x) { return (x * (one + (x * r).erf())) * half; });
        break;
      }
      case PwOp::gelu_erf_aten: {
        const V r(static_cast<float>(M_SQRT1_2));
        pw::unary_with_specials(a, d, n, special, ins.op, [&](V x) { return x * half * (one + (x * r).erf()); });
        break;
      }
      case PwOp::sqrt: pw::unary(a, d, n, [](V x) { return x.sqrt(); }); break;
      case PwOp::rsqrt: pw::unary(a, d, n, [](V x) { return x.rsqrt(); }); break;
      case PwOp::reciprocal: pw::unary(a, d, n, [](V x) { return x.reciprocal(); }); break;
      case PwOp::sin: pw::unary(a, d, n, [](V x) { return x.sin(); }); break;
      case PwOp::cos: pw::unary(a, d, n, [](V x) { return x.cos(); }); break;
      case PwOp::square: pw::unary(a, d, n, [](V x) { return x * x; }); break;
      case PwOp::cube: pw::unary(a, d, n, [](V x) { return x * x * x; }); break;
      case PwOp::where: {
        const PwOperand c = operand(ins.c);
        for (int64_t i = 0; i < n; ++i) d[i] = a.p[i * a.inc] != 0.f ? b.p[i * b.inc] : c.p[i * c.inc];
        break;
      }
      case PwOp::round_bf16: pw::round_bf16(a, d, n); break;
      case PwOp::round_f16: pw::round_to<c10::Half>(a, d, n); break;
      case PwOp::kCount: break;
    }
  }
}

}  // namespace CPU_CAPABILITY
}  // namespace graphex::fused
