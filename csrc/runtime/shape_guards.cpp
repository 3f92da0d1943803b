#include "runtime/shape_guards.h"

#include "runtime/sym_ops.h"

#include <sstream>
#include <stdexcept>

namespace graphex {

namespace {

std::string describeValue(const c10::IValue& v) {
  std::ostringstream s;
  if (v.isBool()) s << (v.toBool() ? "True" : "False");
  else if (v.isInt()) s << v.toInt();
  else if (v.isDouble()) s << v.toDouble();
  else s << v.tagKind();
  return s.str();
}

}  // namespace

std::vector<ShapeGuard> readShapeGuards(const fb::Program& root, const Program& program) {
  std::vector<ShapeGuard> guards;
  if (!root.guards()) return guards;
  const size_t num_inputs = program.inputs.size();
  for (uint32_t g = 0; g < root.guards()->size(); ++g) {
    const fb::Guard* table = root.guards()->Get(g);
    ShapeGuard guard;
    guard.text = table->text() ? table->text()->str() : "";
    std::string what = "shape guard " + std::to_string(g) + " (" + guard.text + ")";
    int depth = 0;
    if (table->ops()) {
      for (const fb::GuardOp* op : *table->ops()) {
        ShapeGuard::Op o{op->kind(), op->fn(), op->operands(), op->input(), op->dim(), op->value()};
        switch (o.kind) {
          case fb::GuardOpKind::Const: ++depth; break;
          case fb::GuardOpKind::Input:
          case fb::GuardOpKind::Size:
          case fb::GuardOpKind::Stride:
          case fb::GuardOpKind::StorageOffset: {
            if (o.input < 0 || static_cast<size_t>(o.input) >= num_inputs)
              throw ProgramError(what + ": reads program input " + std::to_string(o.input) + " of " +
                                 std::to_string(num_inputs));
            bool tensor = program.inputs[o.input].kind == InputKind::Tensor;
            if ((o.kind == fb::GuardOpKind::Input) == tensor)
              throw ProgramError(what + ": program input " + std::to_string(o.input) +
                                 (tensor ? " is a tensor, read as a number" : " is not a tensor"));
            if (o.kind == fb::GuardOpKind::Size || o.kind == fb::GuardOpKind::Stride) {
              const auto& sig = program.inputs[o.input].signature;
              if (!sig || o.dim < 0 || static_cast<size_t>(o.dim) >= sig->sizes.size())
                throw ProgramError(what + ": dimension " + std::to_string(o.dim) + " of program input " +
                                   std::to_string(o.input));
            }
            ++depth;
            break;
          }
          case fb::GuardOpKind::Apply:
            if (static_cast<int>(o.fn) > static_cast<int>(fb::SymFn::MAX) || o.operands < 1 || o.operands > 3 ||
                o.operands > depth)
              throw ProgramError(what + ": a malformed expression");
            depth -= o.operands - 1;
            break;
          default: throw ProgramError(what + ": unknown operation " + std::to_string(static_cast<int>(o.kind)));
        }
        guard.ops.push_back(o);
      }
    }
    if (depth != 1) throw ProgramError(what + ": a malformed expression");
    guards.push_back(std::move(guard));
  }
  return guards;
}

std::string brokenShapeGuard(const std::vector<ShapeGuard>& guards, const std::vector<c10::IValue>& inputs,
                             const Program& program) {
  std::vector<c10::IValue> stack;
  for (const ShapeGuard& guard : guards) {
    stack.clear();
    std::ostringstream read;  // the input values the guard read, for the message
    for (const ShapeGuard::Op& o : guard.ops) {
      switch (o.kind) {
        case fb::GuardOpKind::Const: stack.emplace_back(o.value); break;
        case fb::GuardOpKind::Apply: {
          c10::IValue r = applySymFn(o.fn, stack.data() + stack.size() - o.operands, o.operands);
          stack.resize(stack.size() - o.operands);
          stack.push_back(std::move(r));
          break;
        }
        default: {
          const c10::IValue& in = inputs[o.input];
          const std::string& name = program.inputs[o.input].name;
          c10::IValue v;
          if (o.kind == fb::GuardOpKind::Input) {
            v = in;
            read << (read.tellp() > 0 ? ", " : "") << describeValue(v);
          } else {
            if (!in.isTensor()) return guard.text + ": program input " + name + " is not a tensor";
            const at::Tensor& t = in.toTensor();
            if (o.kind != fb::GuardOpKind::StorageOffset && o.dim >= t.dim())
              return guard.text + ": " + name + " has " + std::to_string(t.dim()) + " dimensions";
            v = o.kind == fb::GuardOpKind::Size     ? c10::IValue(t.size(o.dim))
                : o.kind == fb::GuardOpKind::Stride ? c10::IValue(t.stride(o.dim))
                                                    : c10::IValue(t.storage_offset());
            read << (read.tellp() > 0 ? ", " : "") << describeValue(v);
          }
          stack.push_back(std::move(v));
        }
      }
    }
    const c10::IValue& r = stack.back();
    bool holds = r.isBool() ? r.toBool() : r.isInt() ? r.toInt() != 0 : false;
    if (!holds) return guard.text + " (the values it read: " + read.str() + ")";
  }
  return "";
}

}  // namespace graphex
