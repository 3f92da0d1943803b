// graphex::Module: an exported program plus its weights, run from C++ with libtorch alone.
//
//   auto m = graphex::Module::load("model.graphex");   // program.gxp + weights.safetensors
//   std::vector<c10::IValue> out = m.run({x});         // the flattened result
//
// Note [An artifact binds its inputs by kind]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Each program input has a typed binding (schema: Binding): the caller's argument i, a
// parameter or buffer by fully qualified name (taken from the safetensors file, dtype and
// shape checked against the program when loading, not when running), or a size / stride /
// storage offset of argument i (dynamic shapes). The result is a list of leaves: program
// outputs, arguments passed through, constants. A dynamic=True program's shape guards are
// checked before each run (Note [An exported program checks its shape guards]): inputs that
// break one are a SignatureError naming the guard. No Python, no pybind11 here.
#pragma once

#include "program/program.h"
#include "runtime/executor.h"
#include "runtime/binder.h"

#include <ATen/core/ivalue.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace graphex {

class Module {
 public:
  // `path`: a directory written by graphex.export, or its program.gxp. Throws
  // format::FormatError (bad program file), deploy::WeightsError (missing or mismatched
  // weights) or ProgramError (an operator this process lacks, ...), each naming what is wrong.
  static Module load(const std::string& path);

  // Run on the caller's flattened arguments; returns the flattened result.
  [[nodiscard]] std::vector<c10::IValue> run(const std::vector<c10::IValue>& args) const;

  const Program& program() const { return executor_->program(); }
  size_t numArguments() const { return binder_.numArguments(); }
  const std::string& tree() const { return tree_; }  // the result's structure (pytree JSON)

 private:
  std::shared_ptr<const Executor> executor_;
  Binder binder_;                   // Note [One binder]
  std::vector<c10::IValue> held_;   // the weights, one per held binding
  std::string tree_;
  std::map<std::string, at::Tensor> weights_;  // views of the mapped file, kept alive here
};

}  // namespace graphex
