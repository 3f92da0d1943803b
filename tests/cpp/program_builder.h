// Programs written by hand in C++ tests, as flatc's generated object API for
// csrc/schema/program.fbs (fb::ProgramT, fb::NodeT, fb::ArgT ...), packed by the generated
// code: the same tables graphex/program/encode.py writes (Note [One typed format]), with no notation
// of their own in between. The helpers below only fill those objects in; tests may also
// set any field directly (a malformed program is one assignment away).
#pragma once

#include "program/format.h"
#include "program/program.h"

#include <c10/core/ScalarType.h>
#include <flatbuffers/flatbuffers.h>

#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace graphex::testing {

namespace detail {
template <typename T>
std::vector<std::unique_ptr<T>> owned(const std::vector<T>& items) {
  std::vector<std::unique_ptr<T>> out;
  for (const T& item : items) out.push_back(std::make_unique<T>(item));
  return out;
}
}  // namespace detail

inline fb::ArgT arg(fb::ArgKind kind, int64_t i = 0) {
  fb::ArgT a;
  a.kind = kind;
  a.i = i;
  return a;
}
inline fb::ArgT I(int64_t v) { return arg(fb::ArgKind::Int, v); }
inline fb::ArgT B(bool v) { return arg(fb::ArgKind::Bool, v); }
inline fb::ArgT None() { return arg(fb::ArgKind::None); }
inline fb::ArgT Slot(uint32_t s) { return arg(fb::ArgKind::Slot, s); }
inline fb::ArgT Const(uint32_t k) { return arg(fb::ArgKind::Const, k); }
inline fb::ArgT F(double v) {
  fb::ArgT a = arg(fb::ArgKind::Float);
  a.f = v;
  return a;
}
inline fb::ArgT S(std::string v) {
  fb::ArgT a = arg(fb::ArgKind::Str);
  a.s = std::move(v);
  return a;
}
inline fb::ArgT L(std::initializer_list<fb::ArgT> items) {
  fb::ArgT a = arg(fb::ArgKind::List);
  a.items = detail::owned(std::vector<fb::ArgT>(items));
  return a;
}
// The inputs and the nodes of a program, in order.
inline std::vector<fb::InputT> L(std::initializer_list<fb::InputT> items) { return items; }
inline std::vector<fb::NodeT> L(std::initializer_list<fb::NodeT> items) { return items; }
// A program with no outputs.
inline fb::ArgT NoOutputs() { return arg(fb::ArgKind::List); }

// Keyword arguments of an op node.
using Kwargs = std::vector<std::pair<std::string, fb::ArgT>>;
inline Kwargs D(std::initializer_list<std::pair<std::string, fb::ArgT>> items) { return Kwargs(items); }

// A tensor description: dtype (c10, stored as the schema's DType), device cpu, sizes (-1: symbolic).
inline fb::TensorMetaT tensorMeta(std::vector<int64_t> sizes, c10::ScalarType dtype = c10::ScalarType::Float,
                                  bool with_strides = true) {
  fb::TensorMetaT m;
  m.dtype = format::fromScalarType(dtype);
  m.device = std::make_unique<fb::Device>(fb::DeviceType::CPU, -1);
  if (with_strides) {
    m.strides.resize(sizes.size());
    int64_t stride = 1;
    for (size_t i = sizes.size(); i-- > 0;) {
      m.strides[i] = stride;
      stride *= sizes[i];
    }
  }
  m.sizes = std::move(sizes);
  return m;
}

inline fb::InputT tensorInput(const std::string& name, int32_t slot, std::vector<int64_t> sizes,
                              c10::ScalarType dtype = c10::ScalarType::Float) {
  fb::InputT in;
  in.name = name;
  in.kind = fb::InputKind::Tensor;
  in.slot = slot;
  in.tensor = std::make_unique<fb::TensorMetaT>(tensorMeta(std::move(sizes), dtype));
  return in;
}

// `kind`: "int", "float", "bool" or "other".
inline fb::InputT scalarInput(const std::string& name, int32_t slot, const std::string& kind) {
  fb::InputT in;
  in.name = name;
  in.kind = kind == "int" ? fb::InputKind::Int : kind == "float" ? fb::InputKind::Float
            : kind == "bool" ? fb::InputKind::Bool : fb::InputKind::Other;
  in.slot = slot;
  return in;
}

inline fb::NodeT op(const std::string& name, const std::string& op, const std::string& overload, const fb::ArgT& args,
                    std::vector<int32_t> outs, const Kwargs& kwargs = {}, std::string source = "") {
  fb::NodeT n;
  n.kind = fb::NodeKind::Op;
  n.name = name;
  n.target = op + "." + overload;
  n.op = op;
  n.overload = overload;
  n.source = std::move(source);
  for (const auto& a : args.items) n.args.push_back(std::make_unique<fb::ArgT>(*a));
  for (const auto& [key, value] : kwargs) {
    auto kw = std::make_unique<fb::KwargT>();
    kw->name = key;
    kw->value = std::make_unique<fb::ArgT>(value);
    n.kwargs.push_back(std::move(kw));
  }
  n.outs = std::move(outs);
  return n;
}

// A builtin node: `kind` "getitem", or "sym" computing SymFn `fn` (the schema's name, "Mul").
inline fb::NodeT builtin(const std::string& kind, const std::string& name, const fb::ArgT& args, int32_t out,
                         const std::string& fn = "") {
  fb::NodeT n;
  n.kind = kind == "getitem" ? fb::NodeKind::GetItem : fb::NodeKind::Sym;
  n.name = name;
  n.target = kind + "." + fn;
  if (n.kind == fb::NodeKind::Sym) {
    auto parsed = symFnFromName(fn);
    if (!parsed) throw std::invalid_argument("program_builder: unknown sym fn " + fn);
    n.sym = *parsed;
  }
  for (const auto& a : args.items) n.args.push_back(std::make_unique<fb::ArgT>(*a));
  n.outs = {out};
  return n;
}

// A node with what its fake promised for each output (validate_fake).
inline fb::NodeT withExpect(fb::NodeT node, std::initializer_list<fb::TensorMetaT> expect) {
  for (const fb::TensorMetaT& m : expect) {
    auto e = std::make_unique<fb::ExpectT>();
    e->tensor = std::make_unique<fb::TensorMetaT>(m);
    node.expect.push_back(std::move(e));
  }
  return node;
}

// Program bytes, packed by flatc's generated code.
inline std::string pack(const fb::ProgramT& p) {
  flatbuffers::FlatBufferBuilder b;
  fb::FinishSizePrefixedProgramBuffer(b, fb::Program::Pack(b, &p));
  return std::string(reinterpret_cast<const char*>(b.GetBufferPointer()), b.GetSize());
}

inline fb::ProgramT programT(uint32_t num_slots, const std::vector<fb::InputT>& inputs,
                             const std::vector<fb::NodeT>& nodes, const fb::ArgT& outputs, uint32_t num_constants = 0) {
  fb::ProgramT p;
  p.format_version = format::kFormatVersion;
  p.name = "test_graph";
  p.num_slots = num_slots;
  p.inputs = detail::owned(inputs);
  p.nodes = detail::owned(nodes);
  for (const auto& a : outputs.items) p.outputs.push_back(std::make_unique<fb::ArgT>(*a));
  p.num_constants = num_constants;
  return p;
}

inline std::string program(uint32_t num_slots, const std::vector<fb::InputT>& inputs,
                           const std::vector<fb::NodeT>& nodes, const fb::ArgT& outputs, uint32_t num_constants = 0) {
  return pack(programT(num_slots, inputs, nodes, outputs, num_constants));
}

}  // namespace graphex::testing
