#include "program/program.h"

#include "plan/liveness.h"
#include "program/arguments.h"
#include "program/format.h"

#include <c10/core/Device.h>

#include <array>
#include <map>
#include <utility>

namespace graphex {

namespace {

std::string str(const flatbuffers::String* s) { return s ? s->str() : std::string(); }

std::vector<std::optional<int64_t>> dims(const flatbuffers::Vector<int64_t>* v) {
  std::vector<std::optional<int64_t>> out;
  if (v)
    for (int64_t d : *v) out.push_back(d < 0 ? std::nullopt : std::optional<int64_t>(d));  // -1: symbolic
  return out;
}

TensorSignature parseSignature(const fb::TensorMeta* m, const std::string& what) {
  if (m == nullptr) throw ProgramError(what + ": tensor description missing");
  TensorSignature sig;
  sig.dtype = format::toScalarType(m->dtype());
  sig.device = format::toDevice(m->device());
  sig.sizes = dims(m->sizes());
  if (m->strides()) sig.strides = dims(m->strides());
  else sig.strides.assign(sig.sizes.size(), std::nullopt);
  if (sig.sizes.size() != sig.strides.size()) throw ProgramError(what + ": sizes and strides differ in rank");
  return sig;
}

InputSpec parseInput(const fb::Input& v, size_t index) {
  InputSpec in;
  in.name = str(v.name());
  std::string what = "input " + std::to_string(index) + " ('" + in.name + "')";
  switch (v.kind()) {
    case fb::InputKind::Tensor: in.kind = InputKind::Tensor; break;
    case fb::InputKind::Int: in.kind = InputKind::Int; break;
    case fb::InputKind::Float: in.kind = InputKind::Float; break;
    case fb::InputKind::Bool: in.kind = InputKind::Bool; break;
    case fb::InputKind::Other: in.kind = InputKind::Other; break;
    default: throw ProgramError(what + ": unknown input kind " + std::to_string(static_cast<int>(v.kind())));
  }
  if (in.kind == InputKind::Tensor) in.signature = parseSignature(v.tensor(), what);
  return in;
}

std::string nodeWhat(const NodeInfo& info) {
  std::string s = "node '" + info.name + "' (" + info.target + ")";
  if (!info.source.empty()) s += " from " + info.source;
  return s;
}

std::vector<int32_t> parseOuts(const flatbuffers::Vector<int32_t>* v, uint32_t num_slots, const std::string& what) {
  std::vector<int32_t> outs;
  if (v)
    for (int32_t s : *v) {
      if (s >= static_cast<int64_t>(num_slots) || s < -1)
        throw ProgramError(what + ": output slot " + std::to_string(s) + " out of range");
      outs.push_back(s);
    }
  return outs;
}

c10::OperatorHandle resolveOperator(const std::string& name, const std::string& overload, const std::string& what) {
  // FX spells the unnamed overload "default"; the dispatcher spells it "".
  auto handle = c10::Dispatcher::singleton().findSchema({name, overload == "default" ? "" : overload});
  if (!handle) {
    std::string qualified = name + (overload.empty() ? "" : "." + overload);
    throw ProgramError(what + ": operator " + qualified +
                       " is not registered in this process. If it is a custom operator, load the library "
                       "that defines it (torch.ops.load_library(...) or import the Python module that "
                       "registers it) before running the program.");
  }
  return *handle;
}

// Note [Under no_grad an operator's inner calls track no views]
// In eager, under no_grad, a call to an ATen operator enters its autograd kernel (VariableType), which
// redispatches past the autograd keys. An operator that neither returns a view nor writes an argument
// (no kernel of its own at ADInplaceOrView) is redispatched past ADInplaceOrView too, under
// AutoDispatchBelowADInplaceOrView, so the calls its kernel makes track no views: slice_scatter builds its
// result as an as_strided of a flat clone, and eager's result has no _base. A view or in-place operator goes
// through its ADInplaceOrView kernel, which does the same for its own inner calls. The executor skips the
// autograd kernels under no_grad (they would only forward); for the first kind it excludes ADInplaceOrView
// around the call as well, so every kernel runs with the key set eager gives it. Operators outside `aten`
// (custom ops, graphex_fused) and those without an autograd kernel (CompositeImplicitAutograd ones, whose
// inner calls go through the whole dispatcher in eager too) are called as they are.
bool runsBelowInplaceOrView(const c10::OperatorHandle& op) {
  const c10::OperatorName& name = op.operator_name();
  return name.name.rfind("aten::", 0) == 0 && op.hasKernelForDispatchKey(c10::DispatchKey::Autograd) &&
         !op.hasKernelForDispatchKey(c10::DispatchKey::ADInplaceOrView);
}

// Note [A view nobody can see runs below ADInplaceOrView]
// Under no_grad, eager runs a view operator through its ADInplaceOrView kernel: the CPU kernel makes the alias,
// then `as_view` gives it autograd metadata (its `_base`, the version counter it shares with its base). That
// metadata costs about half a view's time in the engine (~0.85 us a view in a decode step, which runs 70-110 of
// them) and is read by nobody when the view is an intermediate that only feeds kernels reading it: a weight's
// `t` into `addmm`, a `view` into `mm`. Such a view runs below ADInplaceOrView as well; its sizes, strides,
// offset and storage are the CPU kernel's, so every value computed from it is eager's. A view keeps its
// metadata where anything could see it: returned from the program, written in place or aliased by a reader
// (its schema annotates the argument), read by an operator outside `aten` and `graphex_fused` (a custom op may
// ask for `_base`), by one that could return its argument itself (no autograd kernel of its own), or by a
// view that keeps its own (the `_base` of a view of a view is the first view's base). Views of views are
// decided from the last instruction back, so a chain of them that ends in readers runs below as a whole.
// Only under no_grad: with grad enabled the executor calls every operator as eager does.
bool isViewOp(const c10::OperatorHandle& op) {
  const c10::FunctionSchema& schema = op.schema();
  if (schema.name().rfind("aten::", 0) != 0 || !op.hasKernelForDispatchKey(c10::DispatchKey::ADInplaceOrView))
    return false;
  if (schema.returns().size() != 1 || schema.returns()[0].type()->kind() != c10::TypeKind::TensorType) return false;
  const c10::AliasInfo* ret = schema.returns()[0].alias_info();
  if (ret == nullptr || ret->isWrite()) return false;
  for (const c10::Argument& a : schema.arguments())
    if (a.alias_info() != nullptr && a.alias_info()->isWrite()) return false;
  return true;
}

// Whether an operator reading a tensor through `formal` can neither show nor keep the tensor's view metadata: the
// argument is neither written nor aliased by a result (its schema would say so), and the kernel is ATen's own
// (one with an autograd kernel: a composite one might hand its argument back) or one of graphex's fused kernels.
// An in-place operator's other arguments count: `index_copy_`'s source is only read.
bool readsOnly(const c10::OperatorHandle& op, const c10::Argument& formal) {
  if (formal.alias_info() != nullptr) return false;
  const std::string& name = op.schema().name();
  if (name.rfind("graphex_fused::", 0) == 0) return true;
  return name.rfind("aten::", 0) == 0 && op.hasKernelForDispatchKey(c10::DispatchKey::Autograd);
}

void markUnseenViews(Program& p) {
  // Who reads each slot: (instruction, formal argument), or -1 for a builtin or a program output.
  std::vector<std::vector<std::pair<int64_t, size_t>>> readers(p.num_slots);
  for (size_t i = 0; i < p.instructions.size(); ++i) {
    const Instruction& instr = p.instructions[i];
    for (size_t k = 0; k < instr.args.size(); ++k) {
      const int64_t who = instr.kind == InstrKind::Op ? static_cast<int64_t>(i) : -1;
      if (instr.args[k].slot >= 0) readers[instr.args[k].slot].emplace_back(who, k);
      for (const ListItem& li : instr.args[k].items)
        if (li.slot >= 0) readers[li.slot].emplace_back(who, k);
    }
  }
  for (const ArgSource& out : p.outputs) {
    if (out.slot >= 0) readers[out.slot].emplace_back(-1, 0);
    for (const ListItem& li : out.items)
      if (li.slot >= 0) readers[li.slot].emplace_back(-1, 0);
  }
  // Backwards, so that a view's readers are decided before it (SSA: a reader comes after what it reads).
  std::vector<bool> unseen(p.instructions.size(), false);
  for (size_t i = p.instructions.size(); i-- > 0;) {
    Instruction& instr = p.instructions[i];
    if (instr.kind != InstrKind::Op || instr.outs.size() != 1 || instr.outs[0] < 0 || !isViewOp(*instr.op)) continue;
    bool ok = true;
    for (const auto& [r, k] : readers[instr.outs[0]]) {
      if (r < 0) {
        ok = false;
        break;
      }
      const Instruction& reader = p.instructions[r];
      const c10::Argument& formal = reader.op->schema().arguments()[k];
      if (readsOnly(*reader.op, formal)) continue;
      // A view of this view that keeps no metadata either, reading it as the argument it aliases.
      if (unseen[r] && formal.alias_info() != nullptr && !formal.alias_info()->isWrite()) continue;
      ok = false;
      break;
    }
    if (ok) unseen[i] = instr.below_inplace_or_view = true;
  }
}

Instruction buildOp(const fb::Node& node, const NodeInfo& info, const std::vector<at::Tensor>& constants,
                    uint32_t num_slots) {
  std::string what = nodeWhat(info);
  Instruction instr;
  instr.kind = InstrKind::Op;
  instr.op = resolveOperator(str(node.op()), str(node.overload()), what);
  const c10::FunctionSchema& schema = instr.op->schema();
  instr.below_inplace_or_view = runsBelowInplaceOrView(*instr.op);

  const auto* args = node.args();
  const size_t num_args = args ? args->size() : 0;
  std::map<std::string, const fb::Arg*, std::less<>> kwargs;
  if (node.kwargs())
    for (const fb::Kwarg* kw : *node.kwargs()) kwargs.emplace(str(kw->name()), kw->value());
  const auto& formals = schema.arguments();
  if (num_args > formals.size())
    throw ProgramError(what + ": " + std::to_string(num_args) + " positional arguments for schema " +
                       c10::toString(schema));
  size_t used_kwargs = 0;
  for (size_t i = 0; i < formals.size(); ++i) {
    const c10::Argument& formal = formals[i];
    std::string arg_what = "argument '" + formal.name() + "' of " + what;
    if (i < num_args) {
      instr.args.push_back(makeArgSource(args->Get(static_cast<uint32_t>(i)), formal.type(), constants, arg_what));
    } else if (auto it = kwargs.find(formal.name()); it != kwargs.end()) {
      instr.args.push_back(makeArgSource(it->second, formal.type(), constants, arg_what));
      ++used_kwargs;
    } else if (formal.default_value()) {
      ArgSource a;
      a.constant = *formal.default_value();
      instr.args.push_back(std::move(a));
    } else {
      throw ProgramError(arg_what + " is missing and has no default (schema " + c10::toString(schema) + ")");
    }
  }
  if (used_kwargs != kwargs.size()) {
    for (const auto& [k, _] : kwargs) {
      bool known = false;
      for (const auto& f : formals) known |= f.name() == k;
      if (!known) throw ProgramError(what + ": unknown keyword argument '" + k + "' for " + c10::toString(schema));
    }
  }
  for (const auto& a : instr.args) {
    if (a.slot >= static_cast<int32_t>(num_slots))
      throw ProgramError(what + ": reads slot " + std::to_string(a.slot) + " out of range");
    for (const auto& li : a.items)
      if (li.slot >= static_cast<int32_t>(num_slots))
        throw ProgramError(what + ": reads slot " + std::to_string(li.slot) + " out of range");
  }
  instr.outs = parseOuts(node.outs(), num_slots, what);
  if (const auto* expect = node.expect()) {
    for (const fb::Expect* e : *expect)
      instr.expect.push_back(e->tensor() == nullptr ? std::nullopt
                                                    : std::optional<TensorSignature>(parseSignature(e->tensor(), what)));
    if (instr.expect.size() != instr.outs.size())
      throw ProgramError(what + ": 'expect' describes " + std::to_string(instr.expect.size()) + " outputs, the op has " +
                         std::to_string(instr.outs.size()));
  }
  if (instr.outs.size() != schema.returns().size())
    throw ProgramError(what + ": " + std::to_string(instr.outs.size()) + " output slots for " +
                       std::to_string(schema.returns().size()) + " returns of " + c10::toString(schema));
  return instr;
}

Instruction buildBuiltin(const fb::Node& node, InstrKind kind, const NodeInfo& info,
                         const std::vector<at::Tensor>& constants, uint32_t num_slots) {
  std::string what = nodeWhat(info);
  Instruction instr;
  instr.kind = kind;
  if (kind == InstrKind::Sym) {
    auto code = static_cast<int>(node.sym());
    if (code < 0 || code > static_cast<int>(fb::SymFn::MAX))
      throw ProgramError(what + ": unknown arithmetic function " + std::to_string(code));
    instr.sym = static_cast<SymFn>(code);
  }
  const auto* args = node.args();
  for (uint32_t i = 0; args && i < args->size(); ++i) {
    ArgSource a = makeUntypedArgSource(args->Get(i), constants, "argument " + std::to_string(i) + " of " + what);
    if (a.slot >= static_cast<int32_t>(num_slots))
      throw ProgramError(what + ": reads slot " + std::to_string(a.slot) + " out of range");
    instr.args.push_back(std::move(a));
  }
  if (kind == InstrKind::GetItem &&
      (instr.args.size() != 2 || instr.args[0].kind != ArgSource::Kind::Slot || !instr.args[1].constant.isInt()))
    throw ProgramError(what + ": getitem takes a slot and a constant index");
  instr.outs = parseOuts(node.outs(), num_slots, what);
  if (instr.outs.size() != 1) throw ProgramError(what + ": a builtin produces exactly one value");
  return instr;
}

}  // namespace

std::optional<SymFn> symFnFromName(std::string_view name) {
  for (int code = 0; code <= static_cast<int>(fb::SymFn::MAX); ++code)
    if (name == fb::EnumNamesSymFn()[code]) return static_cast<SymFn>(code);
  return std::nullopt;
}

const char* symFnName(SymFn fn) {
  const char* name = fb::EnumNameSymFn(fn);
  return name != nullptr && *name != '\0' ? name : "?";
}

size_t Program::numOps() const {
  size_t n = 0;
  for (const auto& i : instructions) n += i.kind == InstrKind::Op;
  return n;
}

Program Program::load(std::string_view bytes, std::vector<at::Tensor> constants) {
  return fromTable(format::verify(bytes), std::move(constants));
}

Program Program::fromTable(const fb::Program& root, std::vector<at::Tensor> constants) {
  Program p;
  try {
    p.name = str(root.name());
    if (root.num_slots() > (1u << 24)) throw ProgramError("num_slots out of range");
    p.num_slots = root.num_slots();

    if (constants.empty() && root.constants()) {
      for (uint32_t k = 0; k < root.constants()->size(); ++k)
        constants.push_back(format::toTensor(*root.constants()->Get(k), "constant " + std::to_string(k)));
    }
    if (root.num_constants() != constants.size())
      throw ProgramError("the program refers to " + std::to_string(root.num_constants()) + " constant tensors but " +
                         std::to_string(constants.size()) + " were given");
    p.constants = std::move(constants);
    p.check_signature = root.check_signature();

    if (root.inputs()) {
      for (uint32_t i = 0; i < root.inputs()->size(); ++i) {
        const fb::Input& in = *root.inputs()->Get(i);
        p.inputs.push_back(parseInput(in, i));
        if (in.slot() < 0 || in.slot() >= static_cast<int32_t>(p.num_slots)) throw ProgramError("input slot out of range");
        p.input_slots.push_back(in.slot());
      }
    }

    if (root.nodes()) {
      for (const fb::Node* node : *root.nodes()) {
        NodeInfo info{str(node->name()), str(node->target()), str(node->source())};
        Instruction instr;
        switch (node->kind()) {
          case fb::NodeKind::Op: instr = buildOp(*node, info, p.constants, p.num_slots); break;
          case fb::NodeKind::GetItem:
            instr = buildBuiltin(*node, InstrKind::GetItem, info, p.constants, p.num_slots);
            break;
          case fb::NodeKind::Sym: instr = buildBuiltin(*node, InstrKind::Sym, info, p.constants, p.num_slots); break;
          default:
            throw ProgramError(nodeWhat(info) + ": unknown node kind " + std::to_string(static_cast<int>(node->kind())));
        }
        instr.debug = static_cast<uint32_t>(p.nodes.size());
        p.nodes.push_back(std::move(info));
        p.instructions.push_back(std::move(instr));
      }
    }

    if (root.outputs())
      for (const fb::Arg* out : *root.outputs()) {
        ArgSource a = makeUntypedArgSource(out, p.constants, "program output");
        if (a.slot >= static_cast<int32_t>(p.num_slots)) throw ProgramError("output slot out of range");
        p.outputs.push_back(std::move(a));
      }
  } catch (const format::FormatError& e) {
    throw ProgramError(e.what());
  }
  markUnseenViews(p);  // Note [A view nobody can see runs below ADInplaceOrView]
  planLiveness(p);
  return p;
}

}  // namespace graphex
