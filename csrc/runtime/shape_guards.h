// The shape guards an exported dynamic=True program carries, checked before a run.
// Note [An exported program checks its shape guards] (csrc/schema/program.fbs).
#pragma once

#include "program/program.h"
#include "program_generated.h"

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <string>
#include <vector>

namespace graphex {

struct ShapeGuard {
  struct Op {
    fb::GuardOpKind kind = fb::GuardOpKind::Const;
    SymFn fn = SymFn::Add;
    int operands = 0;
    int32_t input = 0;
    int32_t dim = 0;
    int64_t value = 0;
  };
  std::vector<Op> ops;  // postfix
  std::string text;     // as Python wrote it
};

// The program's guards, verified against `program`: every input they read exists (a tensor input for a size,
// stride or offset), and each is a well-formed postfix expression leaving one value. Throws ProgramError.
std::vector<ShapeGuard> readShapeGuards(const fb::Program& root, const Program& program);

// "" when every guard holds for `inputs` (the program's inputs, as bound), else why the first one fails:
// the guard's text and the input values it read.
std::string brokenShapeGuard(const std::vector<ShapeGuard>& guards, const std::vector<c10::IValue>& inputs,
                             const Program& program);

}  // namespace graphex
