// The one binder: a program's input bindings, shape guards and result leaves, resolved once at load
// and applied on every call by everything that runs a program from its bytes (graphex::Module and
// graphex-run, cache_compile's entries).
//
// Note [One binder]
// ~~~~~~~~~~~~~~~~~
// Each program input has a typed Binding (schema: Binding, Note [An artifact binds its inputs by
// kind]). The binder turns the caller's flattened arguments into the program's inputs: an argument
// by index; a size, stride or storage offset of an argument (dynamic shapes); a token (None); and
// the tensors the caller holds for the program (parameters and buffers, and the tensors an argument
// holds), handed over as `held`, one per such binding in binding order. Where they come from is the
// only thing that differs between the runners: graphex::Module takes them from the weights file by
// name, once, at load (checked against the program then); cache_compile reads them through the
// sources Dynamo read them from, on every call, in the one generated function that also checks
// Dynamo's guards (Note [One function checks the guards and binds the inputs], a Python object path
// that only Python can follow). Then the binder checks the program's shape guards (Note [An exported
// program checks its shape guards]) and, after the run, builds the result leaves: program outputs,
// arguments passed through, constants. The torch.compile runner needs none of it: Dynamo hands it
// the program's inputs in order.
#pragma once

#include "program/program.h"
#include "program_generated.h"
#include "runtime/shape_guards.h"

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <string>
#include <vector>

namespace graphex {

class Binder {
 public:
  // From the program's tables; `what` names the program in errors. Throws format::FormatError for a
  // binding or leaf that refers to nothing, ProgramError for a malformed shape guard.
  static Binder fromTable(const fb::Program& root, const Program& program, const std::string& what);

  bool hasBindings() const { return has_bindings_; }
  // Whether binding needs argument i (an Argument, Size, Stride or StorageOffset binding reads it): a caller
  // with arguments that are not values (Python objects) converts only these.
  bool readsArgument(size_t i) const { return i < reads_arg_.size() && reads_arg_[i]; }
  size_t numArguments() const { return num_args_; }
  // The bindings the caller resolves (Parameter, Buffer, ArgumentPath), in binding order.
  const std::vector<int32_t>& heldBindings() const { return held_; }
  fb::BindingKind kind(size_t binding) const { return static_cast<fb::BindingKind>(binds_[binding].kind); }

  // The program's inputs for `args` and `held` (one per heldBindings() entry, moved into the inputs). Throws
  // SignatureError naming the argument when one read as a tensor is not one, or when the counts are wrong.
  std::vector<c10::IValue> bind(const std::vector<c10::IValue>& args, std::vector<c10::IValue> held) const;

  // "" when every shape guard holds for the bound `inputs`, else the first broken guard with the values it read.
  std::string brokenGuard(const std::vector<c10::IValue>& inputs, const Program& program) const {
    return guards_.empty() ? std::string() : brokenShapeGuard(guards_, inputs, program);
  }
  bool hasGuards() const { return !guards_.empty(); }

  // The flattened result: program outputs, arguments passed through and constants, as the leaves say
  // (no leaves: the program's outputs as they are).
  std::vector<c10::IValue> results(std::vector<c10::IValue> outputs, const std::vector<c10::IValue>& args) const;

 struct Leaf {
    int kind = 0;  // fb::LeafKind
    int32_t index = 0;
    c10::IValue value;
  };
  const std::vector<Leaf>& leaves() const { return leaves_; }

 private:
  struct Bind {
    int kind = 0;  // fb::BindingKind
    int32_t index = 0;
    int32_t dim = 0;
  };
  std::vector<Bind> binds_;
  std::vector<bool> reads_arg_;
  std::vector<int32_t> held_;
  std::vector<Leaf> leaves_;
  std::vector<ShapeGuard> guards_;
  size_t num_args_ = 0;
  bool has_bindings_ = false;
};

}  // namespace graphex
