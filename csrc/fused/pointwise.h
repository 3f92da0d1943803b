// The program of graphex_fused::pointwise (pointwise.cpp): a chain of element-wise ops run per tile.
//
// Note [A chain of element-wise ops is one program]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// graphex/fusion/chains.py replaces a connected group of element-wise ATen ops of one shape (add, mul,
// tanh, a cast, ...) with one call of graphex_fused::pointwise. Its program is a list of instructions over
// float32 slots, five ints each: {opcode, dst, a, b, c}. Slots 0..k-1 hold the k inputs (each read as
// float32: exact for float32, bfloat16 and float16; a bool as 0 or 1); an operand >= 0 names a slot, an
// operand < 0 names the constant -1 - operand. An instruction writes a fresh slot (dst >= k: the inputs are
// never written). The outputs are {slot, dtype} pairs, written at the end of each tile in their dtype.
// Each op computes in float32, as ATen's float kernels do and its bfloat16/float16 kernels do per op
// (opmath); where eager rounds a result to bfloat16/float16, the program has a round_bf16/round_f16
// instruction there, so each element sees eager's roundings too. The tolerance is fused mode's
// (Note [Fused kernels are close, not bitwise], library.cpp): exp, tanh and erf come from ATen's
// vectorized math, and eager computes the tail of each loop with the scalar std:: functions.
//
// GRAPHEX_POINTWISE_OPS is the one table of opcodes (name, number of operands) and GRAPHEX_POINTWISE_DTYPES
// the one table of output dtypes. Python reads both through graphex_fused::pointwise_table() (the order
// gives the numbers), so the two sides never disagree. Append only: a program's opcodes are numbers stored in
// cache entries and exported artifacts, so an op inserted before another would make an old program run the wrong op.
#pragma once

#include <cstdint>

#define GRAPHEX_POINTWISE_OPS(_)                                                                              \
  _(add, 2) _(sub, 2) _(mul, 2) _(div, 2) _(maximum, 2) _(minimum, 2) _(pow, 2) _(neg, 1) _(abs, 1)          \
  _(exp, 1) _(log, 1) _(tanh, 1) _(sigmoid, 1) _(silu, 1) _(relu, 1) _(gelu_tanh, 1) _(erf, 1)         \
  _(sqrt, 1) _(rsqrt, 1) _(reciprocal, 1) _(sin, 1) _(cos, 1) _(square, 1) _(cube, 1) _(where, 3)             \
  _(round_bf16, 1) _(round_f16, 1) _(gelu_erf, 1) _(gelu_erf_aten, 1) \
  _(gelu_erf_bf16, 1) _(gelu_erf_f16, 1)

#define GRAPHEX_POINTWISE_DTYPES(_) _(float32, at::kFloat) _(bfloat16, at::kBFloat16) _(float16, at::kHalf)

namespace graphex::fused {

enum class PwOp : int32_t {
#define GRAPHEX_PW_ENUM(name, arity) name,
  GRAPHEX_POINTWISE_OPS(GRAPHEX_PW_ENUM)
#undef GRAPHEX_PW_ENUM
  kCount
};

struct PwInstr {
  int32_t op, dst, a, b, c;
};

// An operand as the tile loop reads it: `p` advanced by `inc` floats per element (1: a slot; 0: a constant).
struct PwOperand {
  const float* p;
  int64_t inc;
};

// Elements per tile: each slot is a buffer of this many floats (a multiple of every vector width).
constexpr int64_t kPointwiseTile = 512;

// Note [An erf GELU's special inputs are eager's own]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// At +-inf, NaN and near float32's overflow the erf GELU's kernels disagree with each other: oneDNN's JIT gives NaN
// at +inf on one CPU (avx512_core) and +inf on another (avx2, as on AMD EPYC), forms x * (1 + erf) before or after
// the halving (2e38 overflows, or not), and ATen's own kernel differs again. No formula of ours can follow every one,
// so the tile kernel computes ordinary inputs (|x| < 2^32: no intermediate of any formula overflows there, and the
// formulas agree within fused mode's tolerance) and hands every other input (an infinity, a NaN, |x| >= 2^32) to
// GeluSpecial: eager's own gelu on that one value, in the kernel eager would pick for the chain's input (oneDNN's on a
// contiguous tensor of two elements, in the input's dtype; ATen's on a tensor of one), so those results are eager's
// by construction, on whatever CPU and oneDNN the program runs (found on an AMD EPYC, where the first version's NaN at
// +inf was Intel's oneDNN's). Inputs of a real model never get there; a tile that has one pays an eager call per
// distinct value.
constexpr float kGeluOrdinaryLimit = 4294967296.f;  // 2^32
using GeluSpecial = float (*)(float x, int32_t opcode);

}  // namespace graphex::fused
