#include "runtime/binder.h"

#include "program/arguments.h"
#include "program/format.h"
#include "runtime/executor.h"

#include <ATen/ops/alias.h>

#include <algorithm>

namespace graphex {

Binder Binder::fromTable(const fb::Program& root, const Program& program, const std::string& what) {
  Binder b;
  const size_t num_inputs = root.inputs() ? root.inputs()->size() : 0;
  if (root.bindings()) {
    if (root.bindings()->size() != num_inputs)
      throw format::FormatError(what + " has " + std::to_string(root.bindings()->size()) + " input bindings for " +
                                std::to_string(num_inputs) + " inputs");
    b.has_bindings_ = true;
    for (uint32_t i = 0; i < root.bindings()->size(); ++i) {
      const fb::Binding& fb_bind = *root.bindings()->Get(i);
      const fb::BindingKind kind = fb_bind.kind();
      b.binds_.push_back(Bind{static_cast<int>(kind), fb_bind.index(), fb_bind.dim()});
      switch (kind) {
        case fb::BindingKind::Parameter:
        case fb::BindingKind::Buffer:
        case fb::BindingKind::ArgumentPath:
          b.held_.push_back(static_cast<int32_t>(i));
          break;
        case fb::BindingKind::Token:
          break;
        default:
          if (fb_bind.index() < 0)
            throw format::FormatError(what + ": binding " + std::to_string(i) + " has a negative argument index");
          b.num_args_ = std::max(b.num_args_, static_cast<size_t>(fb_bind.index()) + 1);
          if (b.reads_arg_.size() <= static_cast<size_t>(fb_bind.index())) b.reads_arg_.resize(fb_bind.index() + 1);
          b.reads_arg_[fb_bind.index()] = true;
      }
    }
  }
  if (root.leaves()) {
    for (const fb::Leaf* l : *root.leaves()) {
      Leaf leaf{static_cast<int>(l->kind()), l->index(), {}};
      if (l->kind() == fb::LeafKind::Constant)
        leaf.value = makeUntypedArgSource(l->value(), {}, "result constant").constant;
      else if (l->kind() == fb::LeafKind::Argument)
        b.num_args_ = std::max(b.num_args_, static_cast<size_t>(std::max(l->index(), 0)) + 1);
      else if (l->index() < 0 || static_cast<size_t>(l->index()) >= program.outputs.size())
        throw format::FormatError(what + ": a result leaf refers to program output " + std::to_string(l->index()));
      b.leaves_.push_back(std::move(leaf));
    }
  }
  b.guards_ = readShapeGuards(root, program);
  return b;
}

std::vector<c10::IValue> Binder::bind(const std::vector<c10::IValue>& args, std::vector<c10::IValue> held) const {
  if (args.size() < num_args_)
    throw SignatureError(std::to_string(args.size()) + " arguments given, the program takes " + std::to_string(num_args_));
  if (held.size() != held_.size())
    throw SignatureError(std::to_string(held.size()) + " held tensors given, the program binds " +
                         std::to_string(held_.size()));
  auto tensorArg = [&](int32_t i) -> const at::Tensor& {
    if (!args[i].isTensor()) throw SignatureError("argument " + std::to_string(i) + " must be a tensor");
    return args[i].toTensor();
  };
  std::vector<c10::IValue> inputs;
  inputs.reserve(binds_.size());
  size_t next_held = 0;
  for (const Bind& b : binds_) {
    switch (static_cast<fb::BindingKind>(b.kind)) {
      case fb::BindingKind::Argument: inputs.push_back(args[b.index]); break;
      case fb::BindingKind::Parameter:
      case fb::BindingKind::Buffer:
      case fb::BindingKind::ArgumentPath: inputs.push_back(std::move(held[next_held++])); break;
      case fb::BindingKind::Size: inputs.push_back(tensorArg(b.index).size(b.dim)); break;
      case fb::BindingKind::Stride: inputs.push_back(tensorArg(b.index).stride(b.dim)); break;
      case fb::BindingKind::StorageOffset: inputs.push_back(tensorArg(b.index).storage_offset()); break;
      default: inputs.push_back(c10::IValue()); break;  // Token
    }
  }
  return inputs;
}

std::vector<c10::IValue> Binder::results(std::vector<c10::IValue> outputs, const std::vector<c10::IValue>& args) const {
  if (leaves_.empty()) return outputs;
  std::vector<c10::IValue> result;
  result.reserve(leaves_.size());
  for (const Leaf& l : leaves_) {
    switch (static_cast<fb::LeafKind>(l.kind)) {
      case fb::LeafKind::Output: result.push_back(outputs[l.index]); break;
      case fb::LeafKind::OutputView: result.push_back(at::alias(outputs[l.index].toTensor())); break;
      case fb::LeafKind::Argument: result.push_back(args[l.index]); break;
      default: result.push_back(l.value); break;
    }
  }
  return result;
}

}  // namespace graphex
