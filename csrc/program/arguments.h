// Turning a program's argument (an fb::Arg table, read in place) into an ArgSource of the
// type an operator's schema asks for. Nothing here copies the argument into another tree:
// the FlatBuffer is the one typed form (Note [One typed format]).
#pragma once

#include "program/program.h"
#include "program_generated.h"

#include <ATen/core/jit_type.h>

#include <string>
#include <vector>

namespace graphex {

// Convert `arg` (null: None) for a schema argument of type `type` (the boxed type,
// Argument::type()). Constants are converted now, once; slot references are left for the
// executor. Throws ProgramError with `what` ("argument 'dim' of aten::sum.dim_IntList").
ArgSource makeArgSource(const fb::Arg* arg, const c10::TypePtr& type, const std::vector<at::Tensor>& constants,
                        const std::string& what);

// An untyped conversion, for builtin instructions and program outputs: slots, constant
// tensors, plain scalars and constant lists of them.
ArgSource makeUntypedArgSource(const fb::Arg* arg, const std::vector<at::Tensor>& constants, const std::string& what);

// An argument as compact, readable text (error messages and dumps): `[%3, 2, const0]`.
std::string argText(const fb::Arg* arg, size_t max_chars = 200);

}  // namespace graphex
