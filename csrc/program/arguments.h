// Turning a spec value into an ArgSource of the type an operator's schema asks for.
#pragma once

#include "program/program.h"

#include <ATen/core/jit_type.h>

namespace graphex {

// Convert `value` for a schema argument of type `type` (the boxed type,
// Argument::type()). Constants are converted now, once; slot references are
// left for the executor. Throws ProgramError with `what` ("argument 'dim' of
// aten::sum.dim_IntList") in the message.
ArgSource makeArgSource(const spec::Value& value, const c10::TypePtr& type,
                        const std::vector<at::Tensor>& constants, const std::string& what);

// A Python number passed where a schema wants a Tensor, as the Python arg parser makes it.
at::Tensor wrappedNumber(const spec::Value& number);

// An untyped conversion, for builtin instructions and program outputs: slots,
// constant tensors and plain scalars.
ArgSource makeUntypedArgSource(const spec::Value& value, const std::vector<at::Tensor>& constants,
                               const std::string& what);

}  // namespace graphex
