// Executor: runs a Program on concrete inputs on the CPU.
//
// Note [Inputs are bound by slot, never copied]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// run() places each input IValue (a reference-counted tensor handle) in its slot;
// no tensor data is copied on the way in. Parameters and buffers are inputs like
// any other (or constants of the Program when frozen), so an in-place operator in
// the graph writes straight into the caller's tensor: the KV cache a model
// updates with index_copy_ keeps its data_ptr and needs no copy-back.
//
// Note [Outputs are never overwritten by a later call]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The CPU executor owns no output memory: every output is a tensor the kernels
// allocated during this call (or a view of an input, as in eager). A later call
// allocates afresh, so a tensor handed to the user is never written again by us.
// Slots are local to each run(), which also makes concurrent runs of one Program safe.
#pragma once

#include "program/program.h"

#include <ATen/core/ivalue.h>

#include <atomic>
#include <optional>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace graphex {

// An input that does not match the signature the program was built for.
class SignatureError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Note [A frozen parameter is checked by identity]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With frozen_parameter, a parameter or buffer is a constant of the program: the tensor it
// was on the first call is baked in, and the argument at its input position is not read.
// Replacing the parameter object afterwards (`model.fc.weight = nn.Parameter(...)`) makes
// Dynamo pass the new tensor there, which the program would silently ignore. So every run
// compares each frozen position's argument with the baked tensor by TensorImpl identity (a
// pointer compare per frozen input) and throws FrozenInputReplaced on a mismatch; the Python
// side re-lowers with the new tensors (graphex/runtime/compiled_graph.py). In-place updates and `.data =`
// keep the TensorImpl, and the program reads the constant through it, so they are seen.
//
// Values folded from a frozen input (graphex/lowering/fold.py, Note [Folding frozen parameters]) need
// more, by how they were made (Watch):
// - Data: a folded view (`t(weight)`) reads the parameter's memory, so every write into that
//   memory is seen; only new memory (`.data = other`, `set_`) or another dtype, shape, stride or
//   dispatch key set (a conj view, say) makes it stale: those are compared.
// - Contents: a computed fold (`1.0 + weight`) is a copy, stale after any write into the
//   parameter's bytes. The version counter does not see every write: `param.data` is a new
//   TensorImpl with its own counter, so `param.data.copy_(...)` bumps nothing the parameter has,
//   and storage has no counter. So bindFrozen keeps a copy of the bytes the parameter spans and
//   every run compares them (memcmp), besides what Data compares: exact for every write, through
//   the parameter, `.data`, a view or load_state_dict. fold.py folds a computed value only when
//   the frozen inputs it reads by contents span at most 64 KiB together (fold.FOLD_CONTENTS_LIMIT),
//   which bounds this check to a few microseconds per such input (an RMSNorm weight qualifies;
//   a weight matrix does not, and what it feeds is computed per run from the live parameter).
class FrozenInputReplaced : public SignatureError {
 public:
  FrozenInputReplaced(const std::string& msg, size_t input) : SignatureError(msg), input(input) {}
  size_t input;  // the program input whose tensor was replaced (or, for a folded one, changed)
};

// What kind of error an operator raised, so that the Python binding can raise what
// eager PyTorch raises (the c10 classes map like torch/csrc/Exceptions.h).
// Foreign: not a c10::Error (e.g. a Python kernel's exception): see ExecutionError::cause.
enum class KernelErrorKind {
  Runtime, Index, Value, Type, NotImplemented, Buffer, LinAlg, OutOfMemory, Syntax, Accelerator,
  Dist, DistBackend, DistStore, DistNetwork, DistQueueEmpty, Foreign
};

// The kind of `e`, and its message as eager PyTorch would show it (no C++ backtrace).
KernelErrorKind classifyKernelError(const std::exception& e);
std::string kernelMessage(const std::exception& e);

// Note [A replay error keeps its cause]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// An operator failed while the program ran. The error carries the node, its operator
// and the user's source line (graphex's part) and, untouched, the operator's own error:
// its message, its kind and the exception itself (`cause`). The Python binding raises a
// graphex.ReplayError that is also what eager would have raised (an IndexError stays an
// IndexError; a Python kernel's exception is re-raised with its own type and as __cause__).
// what() renders it all for C++ callers.
class ExecutionError : public std::runtime_error {
 public:
  ExecutionError(const std::string& msg, uint32_t node_index, std::string graph, std::string node, std::string op,
                 std::string source, std::string kernel_message, KernelErrorKind kind, std::exception_ptr cause)
      : std::runtime_error(msg), node_index(node_index), graph(std::move(graph)), node(std::move(node)),
        op(std::move(op)), source(std::move(source)), kernel_message(std::move(kernel_message)), kind(kind),
        cause(std::move(cause)) {}
  uint32_t nodeIndex() const { return node_index; }

  uint32_t node_index;         // into Program::nodes
  std::string graph;           // the program's name, e.g. "graph_0"
  std::string node;            // the FX node's name
  std::string op;              // "aten::addmm.default"
  std::string source;          // the user's source line, or ""
  std::string kernel_message;  // the operator's own message, as eager shows it
  KernelErrorKind kind;
  std::exception_ptr cause;    // the operator's exception
};

// A custom operator's real output differs from what its fake/Meta function promised
// (found by runValidated). Carries the facts; the Python side writes the fix.
class FakeMismatchError : public std::runtime_error {
 public:
  FakeMismatchError(const std::string& msg, uint32_t node_index, size_t output, std::string expected, std::string actual)
      : std::runtime_error(msg), node_index(node_index), output(output), expected(std::move(expected)),
        actual(std::move(actual)) {}
  uint32_t node_index;
  size_t output;
  std::string expected;
  std::string actual;
};

// Note [A dumped run hands out clones]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// runDumped records, per operator instruction, the values it returned, exactly as the
// engine computed them (the `optimized` stage of data dumps and `graphex triage`'s per-op
// step). Tensors are detached clones taken right after the op: a later in-place op would
// otherwise overwrite them, and a freed slot could be reused. Only this run mode pays for it.
struct DumpedOp {
  uint32_t node_index;              // into Program::nodes
  std::vector<c10::IValue> values;  // one per returned value; tensors (and tensor lists) cloned
};

class Executor {
 public:
  explicit Executor(Program program);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Run on one IValue per program input; returns one IValue per program output.
  // Throws SignatureError before running anything if an input does not fit,
  // ExecutionError if an operator fails.
  [[nodiscard]] std::vector<c10::IValue> run(std::vector<c10::IValue> inputs) const;

  // Whether `inputs` fit the signature this program was captured for (what run() would
  // otherwise throw SignatureError for). Never throws: a cache with several entries for one
  // call asks each in turn (Note [Entries are found by signature, not by exceptions]).
  [[nodiscard]] bool fits(const std::vector<c10::IValue>& inputs) const;

  // Why `inputs` do not fit: the first input whose dtype, sizes, strides or device differ from the captured
  // signature, named ("input 3 ('p_conv_weight'): expected ..., got ..."); "" when they fit, or when only a
  // frozen input changed (which fits() also refuses). Never throws: for a cache miss's message.
  [[nodiscard]] std::string mismatch(const std::vector<c10::IValue>& inputs) const;

  // run() if the inputs fit, std::nullopt (nothing run) if they do not.
  [[nodiscard]] std::optional<std::vector<c10::IValue>> tryRun(std::vector<c10::IValue> inputs) const;

  // run() for inputs fits() has just accepted: the same run without checking them a second time.
  [[nodiscard]] std::vector<c10::IValue> runFitting(std::vector<c10::IValue> inputs) const;

  // run(), also recording the wall time of each instruction in `ns` (one entry per
  // instruction, accumulated). For `graphex profile`-style breakdowns; costs two clock reads per op.
  [[nodiscard]] std::vector<c10::IValue> runTimed(std::vector<c10::IValue> inputs, std::vector<int64_t>& ns) const;

  // run(), also checking each custom op's outputs against the fake/Meta promise
  // recorded in the program (Instruction::expect). Throws FakeMismatchError.
  [[nodiscard]] std::vector<c10::IValue> runValidated(std::vector<c10::IValue> inputs) const;

  // run(), also handing out every operator instruction's outputs, cloned
  // (Note [A dumped run hands out clones]). Appends one DumpedOp per Op instruction run.
  [[nodiscard]] std::vector<c10::IValue> runDumped(std::vector<c10::IValue> inputs, std::vector<DumpedOp>& dumped) const;

  const Program& program() const { return program_; }

  // Note [A frozen parameter is checked by identity]: from now on every run (and fits())
  // requires input `index` to be `tensor` itself. Folded values (graphex/lowering/fold.py, Note [Folding
  // frozen parameters]) also need its memory, dtype, sizes, strides and key set unchanged
  // (Watch::Data) and, for computed ones, also its bytes (Watch::Contents). Call before the first run.
  // Contents needs a dense CPU tensor (throws ProgramError otherwise).
  enum class Watch : int { Identity = 0, Data = 1, Contents = 2 };
  struct FrozenInput {
    size_t index;
    at::Tensor tensor;
    Watch watch = Watch::Identity;
    // Recorded by bindFrozen (Watch::Data and Contents):
    const void* data = nullptr;
    c10::ScalarType dtype = c10::ScalarType::Undefined;
    std::vector<int64_t> sizes, strides;
    c10::DispatchKeySet key_set;
    std::vector<unsigned char> bytes;  // Watch::Contents: the bytes the tensor spans from `data`
  };
  void bindFrozen(std::vector<FrozenInput> frozen);

  // How many times a run has been entered (tests use it to prove the engine ran).
  // Note [Run counters stay out of the hot loop]: one relaxed increment of this executor's
  // own counter per run; the process-wide total is summed only when asked.
  uint64_t runCount() const { return runs_.load(std::memory_order_relaxed); }
  // The same, summed over every Executor of the process, including destroyed ones
  // (live executors are summed at the call; a destroyed one adds its count on destruction).
  static uint64_t totalRunCount();

 private:
  void checkInputs(const std::vector<c10::IValue>& inputs) const;
  // Runs without checking the inputs: every caller has checked them (checkInputs or fits).
  template <bool kTimed, bool kValidate, bool kDump = false>
  std::vector<c10::IValue> runImpl(std::vector<c10::IValue> inputs, int64_t* ns,
                                   std::vector<DumpedOp>* dumped = nullptr) const;
  void checkFrozen(const std::vector<c10::IValue>& inputs) const;
  Program program_;
  std::vector<FrozenInput> frozen_;
  mutable std::atomic<uint64_t> runs_{0};
};

}  // namespace graphex
