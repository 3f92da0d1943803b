#include "program/program.h"

#include "plan/liveness.h"
#include "program/arguments.h"

#include <c10/core/Device.h>

#include <array>
#include <utility>

namespace graphex {

namespace {

using spec::Value;

constexpr std::array<std::pair<std::string_view, SymFn>, 25> kSymFns = {{
    {"add", SymFn::Add},         {"sub", SymFn::Sub},     {"mul", SymFn::Mul},
    {"floordiv", SymFn::FloorDiv}, {"truediv", SymFn::TrueDiv}, {"mod", SymFn::Mod},
    {"pow", SymFn::Pow},         {"neg", SymFn::Neg},     {"abs", SymFn::Abs},
    {"eq", SymFn::Eq},           {"ne", SymFn::Ne},       {"lt", SymFn::Lt},
    {"le", SymFn::Le},           {"gt", SymFn::Gt},       {"ge", SymFn::Ge},
    {"and", SymFn::And},         {"or", SymFn::Or},       {"not", SymFn::Not},
    {"max", SymFn::Max},         {"min", SymFn::Min},     {"float", SymFn::ToFloat},
    {"int", SymFn::ToInt},       {"ceil", SymFn::Ceil},   {"floor", SymFn::Floor},
    {"scalar_tensor", SymFn::ScalarTensor},
}};

InputKind inputKindFromName(const std::string& s, const std::string& what) {
  if (s == "tensor") return InputKind::Tensor;
  if (s == "int") return InputKind::Int;
  if (s == "float") return InputKind::Float;
  if (s == "bool") return InputKind::Bool;
  if (s == "other") return InputKind::Other;
  throw ProgramError(what + ": unknown input kind '" + s + "'");
}

std::vector<std::optional<int64_t>> dims(const Value& v) {
  std::vector<std::optional<int64_t>> out;
  for (const Value& d : v.toList()) out.push_back(d.isNone() ? std::nullopt : std::optional<int64_t>(d.toInt()));
  return out;
}

TensorSignature parseSignature(const Value& v, const std::string& what) {
  TensorSignature sig;
  int64_t code = v.at("dtype").toInt();
  if (code < 0 || code >= static_cast<int64_t>(c10::ScalarType::NumOptions))
    throw ProgramError(what + ": dtype code " + std::to_string(code) + " out of range");
  sig.dtype = static_cast<c10::ScalarType>(code);
  sig.device = c10::Device(v.at("device").toStr());
  sig.sizes = dims(v.at("sizes"));
  if (const Value* st = v.find("strides")) sig.strides = dims(*st);
  else sig.strides.assign(sig.sizes.size(), std::nullopt);
  if (sig.sizes.size() != sig.strides.size()) throw ProgramError(what + ": sizes and strides differ in rank");
  return sig;
}

InputSpec parseInput(const Value& v, size_t index) {
  InputSpec in;
  in.name = v.at("name").toStr();
  std::string what = "input " + std::to_string(index) + " ('" + in.name + "')";
  in.kind = inputKindFromName(v.at("kind").toStr(), what);
  if (in.kind == InputKind::Tensor) in.signature = parseSignature(v, what);
  return in;
}

std::string nodeWhat(const NodeInfo& info) {
  std::string s = "node '" + info.name + "' (" + info.target + ")";
  if (!info.source.empty()) s += " from " + info.source;
  return s;
}

std::vector<int32_t> parseOuts(const Value& v, uint32_t num_slots, const std::string& what) {
  std::vector<int32_t> outs;
  for (const Value& o : v.toList()) {
    int64_t s = o.toInt();
    if (s >= static_cast<int64_t>(num_slots) || s < -1)
      throw ProgramError(what + ": output slot " + std::to_string(s) + " out of range");
    outs.push_back(static_cast<int32_t>(s));
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

Instruction buildOp(const Value& node, const NodeInfo& info, const std::vector<at::Tensor>& constants,
                    uint32_t num_slots) {
  std::string what = nodeWhat(info);
  Instruction instr;
  instr.kind = InstrKind::Op;
  instr.op = resolveOperator(node.at("op").toStr(), node.at("overload").toStr(), what);
  const c10::FunctionSchema& schema = instr.op->schema();

  const spec::List& args = node.at("args").toList();
  const Value* kwargs_v = node.find("kwargs");
  const spec::Dict empty;
  const spec::Dict& kwargs = kwargs_v ? kwargs_v->toDict() : empty;
  const auto& formals = schema.arguments();
  if (args.size() > formals.size())
    throw ProgramError(what + ": " + std::to_string(args.size()) + " positional arguments for schema " +
                       c10::toString(schema));
  size_t used_kwargs = 0;
  for (size_t i = 0; i < formals.size(); ++i) {
    const c10::Argument& formal = formals[i];
    std::string arg_what = "argument '" + formal.name() + "' of " + what;
    if (i < args.size()) {
      instr.args.push_back(makeArgSource(args[i], formal.type(), constants, arg_what));
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
  instr.outs = parseOuts(node.at("outs"), num_slots, what);
  if (const Value* expect = node.find("expect")) {
    for (const Value& e : expect->toList())
      instr.expect.push_back(e.isNone() ? std::nullopt : std::optional<TensorSignature>(parseSignature(e, what)));
    if (instr.expect.size() != instr.outs.size())
      throw ProgramError(what + ": 'expect' describes " + std::to_string(instr.expect.size()) + " outputs, the op has " +
                         std::to_string(instr.outs.size()));
  }
  if (instr.outs.size() != schema.returns().size())
    throw ProgramError(what + ": " + std::to_string(instr.outs.size()) + " output slots for " +
                       std::to_string(schema.returns().size()) + " returns of " + c10::toString(schema));
  return instr;
}

Instruction buildBuiltin(const Value& node, InstrKind kind, const NodeInfo& info,
                         const std::vector<at::Tensor>& constants, uint32_t num_slots) {
  std::string what = nodeWhat(info);
  Instruction instr;
  instr.kind = kind;
  if (kind == InstrKind::Sym) {
    auto fn = symFnFromName(node.at("fn").toStr());
    if (!fn) throw ProgramError(what + ": unknown arithmetic function '" + node.at("fn").toStr() + "'");
    instr.sym = *fn;
  }
  const spec::List& args = node.at("args").toList();
  for (size_t i = 0; i < args.size(); ++i) {
    ArgSource a = makeUntypedArgSource(args[i], constants, "argument " + std::to_string(i) + " of " + what);
    if (a.slot >= static_cast<int32_t>(num_slots))
      throw ProgramError(what + ": reads slot " + std::to_string(a.slot) + " out of range");
    instr.args.push_back(std::move(a));
  }
  if (kind == InstrKind::GetItem &&
      (instr.args.size() != 2 || instr.args[0].kind != ArgSource::Kind::Slot || !instr.args[1].constant.isInt()))
    throw ProgramError(what + ": getitem takes a slot and a constant index");
  instr.outs = parseOuts(node.at("outs"), num_slots, what);
  if (instr.outs.size() != 1) throw ProgramError(what + ": a builtin produces exactly one value");
  return instr;
}

}  // namespace

std::optional<SymFn> symFnFromName(std::string_view name) {
  for (const auto& [n, fn] : kSymFns)
    if (n == name) return fn;
  return std::nullopt;
}

const char* symFnName(SymFn fn) {
  for (const auto& [n, f] : kSymFns)
    if (f == fn) return n.data();
  return "?";
}

size_t Program::numOps() const {
  size_t n = 0;
  for (const auto& i : instructions) n += i.kind == InstrKind::Op;
  return n;
}

Program Program::fromSpec(const Value& root, std::vector<at::Tensor> constants) {
  Program p;
  try {
    p.name = root.at("name").toStr();
    int64_t num_slots = root.at("num_slots").toInt();
    if (num_slots < 0 || num_slots > (1 << 24)) throw ProgramError("num_slots out of range");
    p.num_slots = static_cast<uint32_t>(num_slots);

    if (constants.empty()) {
      if (const Value* c = root.find("constants"))
        for (const Value& t : c->toList()) constants.push_back(t.toTensor());
    }
    if (const Value* n = root.find("num_constants"); n && n->toInt() != static_cast<int64_t>(constants.size()))
      throw ProgramError("the program refers to " + std::to_string(n->toInt()) + " constant tensors but " +
                         std::to_string(constants.size()) + " were given");
    p.constants = std::move(constants);
    if (const Value* c = root.find("check_signature")) p.check_signature = c->toBool();

    const spec::List& inputs = root.at("inputs").toList();
    for (size_t i = 0; i < inputs.size(); ++i) {
      p.inputs.push_back(parseInput(inputs[i], i));
      int64_t slot = inputs[i].at("slot").toInt();
      if (slot < 0 || slot >= num_slots) throw ProgramError("input slot out of range");
      p.input_slots.push_back(static_cast<int32_t>(slot));
    }

    for (const Value& node : root.at("nodes").toList()) {
      NodeInfo info{node.at("name").toStr(), node.at("target").toStr(), {}};
      if (const Value* s = node.find("source")) info.source = s->toStr();
      const std::string& kind = node.at("kind").toStr();
      Instruction instr;
      if (kind == "op") instr = buildOp(node, info, p.constants, p.num_slots);
      else if (kind == "getitem") instr = buildBuiltin(node, InstrKind::GetItem, info, p.constants, p.num_slots);
      else if (kind == "sym") instr = buildBuiltin(node, InstrKind::Sym, info, p.constants, p.num_slots);
      else throw ProgramError(nodeWhat(info) + ": unknown node kind '" + kind + "'");
      instr.debug = static_cast<uint32_t>(p.nodes.size());
      p.nodes.push_back(std::move(info));
      p.instructions.push_back(std::move(instr));
    }

    for (const Value& out : root.at("outputs").toList()) {
      ArgSource a = makeUntypedArgSource(out, p.constants, "program output");
      if (a.slot >= static_cast<int32_t>(p.num_slots)) throw ProgramError("output slot out of range");
      p.outputs.push_back(std::move(a));
    }
  } catch (const spec::SpecError& e) {
    throw ProgramError(std::string("malformed program spec: ") + e.what());
  }
  planLiveness(p);
  return p;
}

}  // namespace graphex
