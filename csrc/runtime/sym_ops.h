// Size arithmetic for dynamic shapes, with Python's semantics.
#pragma once

#include "program/program.h"

#include <ATen/core/ivalue.h>

namespace graphex {

// Apply `fn` to ints, floats or bools. Division and modulo round toward negative
// infinity, as in Python. Throws std::runtime_error on bad operands or division by zero.
c10::IValue applySymFn(SymFn fn, const c10::IValue* args, size_t nargs);

}  // namespace graphex
