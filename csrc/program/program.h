// Program: a captured ATen graph, fully resolved and ready to run.
//
// Everything that can be decided once is decided when the Program is built:
// operators are looked up in the c10 dispatcher (an OperatorHandle per node),
// constant arguments are converted to IValues of the exact type the schema asks
// for, and every runtime value lives in a numbered slot. Running a Program is
// then a loop over Instructions that copies slot values onto a stack and calls
// through a pointer (runtime/executor.cpp): no lookups, no strings, no Python.
#pragma once

#include "program/signature.h"
#include "program_generated.h"

namespace graphex::fb {
struct Program;
}

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace graphex {

// A program that cannot run (unknown operator, argument
// that does not fit its schema, ...). The message names the node at fault.
class ProgramError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One element of a list argument built at run time: a slot or a constant.
struct ListItem {
  int32_t slot = -1;  // >= 0: read this slot
  c10::IValue constant;
  bool move = false;  // set by the planner: this is the slot's last read
};

// Where an argument's value comes from when the instruction runs.
struct ArgSource {
  enum class Kind : uint8_t {
    Constant,            // `constant`, fixed at build time
    Slot,                // the value in `slot`
    SlotAsDouble,        // the value in `slot`, converted int -> double (schema asks float)
    TensorList,          // c10::List<at::Tensor> assembled from `items`
    OptionalTensorList,  // c10::List<std::optional<at::Tensor>> from `items`
    IntList,             // c10::List<int64_t> from `items` (sizes with SymInt slots)
    DoubleList,
    BoolList,
  };
  Kind kind = Kind::Constant;
  c10::IValue constant;
  int32_t slot = -1;
  bool move = false;  // Slot kinds: set by the planner when this is the last read
  std::vector<ListItem> items;
};

enum class InstrKind : uint8_t {
  Op,       // call an operator through the dispatcher
  GetItem,  // outs[0] = args[0][args[1]] (element of a list or tuple output)
  Sym,      // integer / float arithmetic on sizes (dynamic shapes)
};

// Arithmetic used by symbolic shapes, Python semantics (floor division and modulo round toward
// negative infinity): the schema's enum itself (csrc/schema/program.fbs lists the functions, once).
using SymFn = fb::SymFn;

struct Instruction {
  InstrKind kind = InstrKind::Op;
  std::optional<c10::OperatorHandle> op;  // InstrKind::Op
  // An ATen operator that eager, under no_grad, runs below ADInplaceOrView: its autograd kernel
  // redispatches there because it neither views nor writes an argument
  // (Note [Under no_grad an operator's inner calls track no views]).
  bool below_inplace_or_view = false;
  SymFn sym = SymFn::Add;                 // InstrKind::Sym
  std::vector<ArgSource> args;
  // One entry per value the instruction produces: the slot to store it in, or -1
  // to drop it at once.
  std::vector<int32_t> outs;
  // Slots whose last reader is this instruction and that were not moved out:
  // released right after it runs (Note [Free each value after its last use]).
  std::vector<int32_t> frees;
  uint32_t debug = 0;  // index into Program::nodes
  // What the operator's fake/Meta function promised for each output (custom ops
  // only; empty otherwise). Checked on a validating run (option validate_fake).
  std::vector<std::optional<TensorSignature>> expect;
};

// What a node was in the user's graph; only read when reporting an error or dumping.
struct NodeInfo {
  std::string name;    // FX node name, e.g. "addmm_3"
  std::string target;  // "aten::addmm" or "sym.Mul"
  std::string source;  // user source line, "model.py:42 in forward: y = self.fc(x)"
};

struct Program {
  std::string name;
  uint32_t num_slots = 0;
  std::vector<InputSpec> inputs;        // input i is bound to slot input_slots[i]
  std::vector<int32_t> input_slots;     // -1: input never read
  std::vector<Instruction> instructions;
  std::vector<ArgSource> outputs;       // Slot or Constant
  std::vector<NodeInfo> nodes;
  std::vector<at::Tensor> constants;
  bool check_signature = true;

  // Build from program bytes (Note [One typed format], format.h): verified first, so a
  // malformed file is a FormatError before anything else is read. `constants` are the
  // tensors the program refers to as Const(k); when empty, the ones stored inline are used.
  // Throws ProgramError naming the node at fault.
  static Program load(std::string_view bytes, std::vector<at::Tensor> constants = {});
  // The same from an already verified table.
  static Program fromTable(const fb::Program& root, std::vector<at::Tensor> constants = {});

  // Number of dispatcher calls per run (Op instructions).
  size_t numOps() const;
};

// By the schema's names ("Add", "FloorDiv", "IfThenElse"), for messages and the C++ tests' program builder.
std::optional<SymFn> symFnFromName(std::string_view name);
const char* symFnName(SymFn fn);

}  // namespace graphex
