#include "plan/describe.h"

#include <sstream>

namespace graphex {

namespace {

void printIValue(std::ostream& os, const c10::IValue& v) {
  if (v.isTensor()) {
    os << "tensor" << v.toTensor().sizes();
  } else if (v.isList()) {
    os << '[';
    auto items = v.toListRef();
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) os << ", ";
      printIValue(os, items[i]);
    }
    os << ']';
  } else {
    os << v;
  }
}

void printSlot(std::ostream& os, int32_t slot, bool move) {
  os << '%' << slot;
  if (move) os << '!';
}

void printArg(std::ostream& os, const ArgSource& a) {
  using Kind = ArgSource::Kind;
  switch (a.kind) {
    case Kind::Constant: printIValue(os, a.constant); return;
    case Kind::Slot:
    case Kind::SlotAsDouble: printSlot(os, a.slot, a.move); return;
    default: {
      os << '[';
      for (size_t i = 0; i < a.items.size(); ++i) {
        if (i) os << ", ";
        if (a.items[i].slot >= 0) printSlot(os, a.items[i].slot, a.items[i].move);
        else printIValue(os, a.items[i].constant);
      }
      os << ']';
    }
  }
}

}  // namespace

std::string describeProgram(const Program& p) {
  std::ostringstream os;
  os << "program " << p.name << ": " << p.inputs.size() << " inputs, " << p.instructions.size()
     << " instructions (" << p.numOps() << " operator calls), " << p.num_slots << " slots\n";
  os << "  (%N! = last read, moved onto the operator's stack; 'free' = released after the instruction; 'unseen view' = "
        "a view only read, made without autograd metadata under no_grad)\n";
  for (size_t i = 0; i < p.inputs.size(); ++i) {
    os << "  in  " << i << ' ' << p.inputs[i].name << " -> ";
    if (p.input_slots[i] >= 0) os << '%' << p.input_slots[i];
    else os << "(unused)";
    if (p.inputs[i].signature) os << "  " << p.inputs[i].signature->toString();
    os << '\n';
  }
  for (const Instruction& instr : p.instructions) {
    const NodeInfo& info = p.nodes[instr.debug];
    os << "  ";
    bool any = false;
    for (size_t r = 0; r < instr.outs.size(); ++r) {
      if (instr.outs[r] < 0) continue;
      if (any) os << ", ";
      os << '%' << instr.outs[r];
      any = true;
    }
    os << (any ? " = " : "_ = ") << info.target << '(';
    for (size_t a = 0; a < instr.args.size(); ++a) {
      if (a) os << ", ";
      printArg(os, instr.args[a]);
    }
    os << ')';
    // Note [A view nobody can see runs below ADInplaceOrView] (program.cpp): the views that skip it under no_grad.
    if (instr.below_inplace_or_view && instr.op && instr.op->hasKernelForDispatchKey(c10::DispatchKey::ADInplaceOrView))
      os << "  unseen view";
    if (!instr.frees.empty()) {
      os << "  free";
      for (int32_t s : instr.frees) os << " %" << s;
    }
    os << "    # " << info.name;
    if (!info.source.empty()) os << "  " << info.source;
    os << '\n';
  }
  os << "  return (";
  for (size_t i = 0; i < p.outputs.size(); ++i) {
    if (i) os << ", ";
    printArg(os, p.outputs[i]);
  }
  os << ")\n";
  return os.str();
}

}  // namespace graphex
