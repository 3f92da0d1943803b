// Programs written by hand in C++ tests: a small value-tree notation, turned into program
// bytes by flatc's generated builders for csrc/schema/program.fbs (the same schema
// graphex/_spec.py writes with; Note [One typed format]). Nothing here lays out bytes.
#pragma once

#include "program/format.h"
#include "program/program.h"
#include "program/spec.h"

#include <c10/core/ScalarType.h>
#include <flatbuffers/flatbuffers.h>

#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

namespace graphex::testing {

using spec::Value;

inline Value I(int64_t v) { return Value::integer(v); }
inline Value F(double v) { return Value::floating(v); }
inline Value S(std::string v) { return Value::string(std::move(v)); }
inline Value B(bool v) { return Value::boolean(v); }
inline Value None() { return Value::none(); }
inline Value Slot(uint32_t s) { return Value::slot(s); }
inline Value Const(uint32_t k) { return Value::constant(k); }
inline Value L(std::initializer_list<Value> items) { return Value::list(spec::List(items)); }
inline Value D(std::initializer_list<std::pair<const std::string, Value>> items) {
  return Value::dict(spec::Dict(items.begin(), items.end()));
}

// A tensor description: dtype (c10, stored as the schema's DType), device "cpu", sizes (-1: symbolic).
inline Value tensorMeta(std::vector<int64_t> sizes, c10::ScalarType dtype = c10::ScalarType::Float,
                        bool with_strides = true) {
  spec::List sz, st;
  int64_t stride = 1;
  std::vector<int64_t> strides(sizes.size());
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= sizes[i];
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    sz.push_back(I(sizes[i]));
    st.push_back(I(strides[i]));
  }
  spec::Dict d{{"dtype", I(static_cast<int64_t>(format::fromScalarType(dtype)))}, {"sizes", Value::list(sz)}};
  if (with_strides) d.emplace("strides", Value::list(st));
  return Value::dict(std::move(d));
}

inline Value tensorInput(const std::string& name, uint32_t slot, std::vector<int64_t> sizes,
                         c10::ScalarType dtype = c10::ScalarType::Float) {
  return D({{"name", S(name)}, {"kind", S("tensor")}, {"slot", I(slot)}, {"tensor", tensorMeta(sizes, dtype)}});
}

inline Value scalarInput(const std::string& name, uint32_t slot, const std::string& kind) {
  return D({{"name", S(name)}, {"kind", S(kind)}, {"slot", I(slot)}});
}

inline Value op(const std::string& name, const std::string& op, const std::string& overload, Value args,
                std::vector<int64_t> outs, Value kwargs = Value::dict({}), std::string source = "") {
  spec::List o;
  for (auto s : outs) o.push_back(I(s));
  return D({{"kind", S("op")}, {"name", S(name)}, {"target", S(op + "." + overload)}, {"op", S(op)},
            {"overload", S(overload)}, {"args", std::move(args)}, {"kwargs", std::move(kwargs)},
            {"outs", Value::list(o)}, {"source", S(std::move(source))}});
}

inline Value builtin(const std::string& kind, const std::string& name, Value args, int64_t out,
                     const std::string& fn = "") {
  spec::Dict d{{"kind", S(kind)}, {"name", S(name)}, {"target", S(kind + "." + fn)}, {"args", std::move(args)},
               {"outs", L({I(out)})}};
  if (!fn.empty()) d.emplace("fn", S(fn));
  return Value::dict(std::move(d));
}

// A node with what its fake promised for each output (validate_fake): `expect` holds tensorMeta or None.
inline Value withExpect(const Value& node, Value expect) {
  spec::Dict d = node.toDict();
  d["expect"] = std::move(expect);
  return Value::dict(std::move(d));
}

namespace detail {

using flatbuffers::FlatBufferBuilder;
using flatbuffers::Offset;

inline Offset<fb::Arg> arg(FlatBufferBuilder& b, const Value& v) {
  switch (v.tag()) {
    case spec::Tag::None: return fb::CreateArg(b, fb::ArgKind::None);
    case spec::Tag::False:
    case spec::Tag::True: return fb::CreateArg(b, fb::ArgKind::Bool, v.toBool());
    case spec::Tag::Int: return fb::CreateArg(b, fb::ArgKind::Int, v.toInt());
    case spec::Tag::Float: return fb::CreateArg(b, fb::ArgKind::Float, 0, v.toFloat());
    case spec::Tag::Str: return fb::CreateArg(b, fb::ArgKind::Str, 0, 0, b.CreateString(v.toStr()));
    case spec::Tag::Slot: return fb::CreateArg(b, fb::ArgKind::Slot, v.toSlot());
    case spec::Tag::Const: return fb::CreateArg(b, fb::ArgKind::Const, v.toConst());
    case spec::Tag::List: {
      std::vector<Offset<fb::Arg>> items;
      for (const Value& item : v.toList()) items.push_back(arg(b, item));
      return fb::CreateArg(b, fb::ArgKind::List, 0, 0, 0, b.CreateVector(items));
    }
    case spec::Tag::Dict: break;
  }
  throw spec::SpecError("spec_builder: a dict is not an argument");
}

inline Offset<flatbuffers::Vector<Offset<fb::Arg>>> args(FlatBufferBuilder& b, const Value& list) {
  std::vector<Offset<fb::Arg>> out;
  for (const Value& v : list.toList()) out.push_back(arg(b, v));
  return b.CreateVector(out);
}

inline Offset<flatbuffers::Vector<int64_t>> longs(FlatBufferBuilder& b, const Value& list) {
  std::vector<int64_t> out;
  for (const Value& v : list.toList()) out.push_back(v.toInt());
  return b.CreateVector(out);
}

inline Offset<fb::TensorMeta> meta(FlatBufferBuilder& b, const Value& m) {
  fb::Device cpu(fb::DeviceType::CPU, -1);
  auto sizes = longs(b, m.at("sizes"));
  auto strides = m.find("strides") ? longs(b, m.at("strides")) : 0;
  return fb::CreateTensorMeta(b, static_cast<fb::DType>(m.at("dtype").toInt()), &cpu, sizes, strides);
}

inline fb::InputKind inputKind(const std::string& k) {
  if (k == "tensor") return fb::InputKind::Tensor;
  if (k == "int") return fb::InputKind::Int;
  if (k == "float") return fb::InputKind::Float;
  if (k == "bool") return fb::InputKind::Bool;
  return fb::InputKind::Other;
}

inline Offset<fb::Node> node(FlatBufferBuilder& b, const Value& n) {
  const std::string& kind = n.at("kind").toStr();
  std::vector<Offset<fb::Kwarg>> kwargs;
  if (const Value* kw = n.find("kwargs"))
    for (const auto& [k, v] : kw->toDict()) kwargs.push_back(fb::CreateKwarg(b, b.CreateString(k), arg(b, v)));
  std::vector<int32_t> outs;
  for (const Value& o : n.at("outs").toList()) outs.push_back(static_cast<int32_t>(o.toInt()));
  Offset<flatbuffers::Vector<Offset<fb::Expect>>> expect = 0;
  if (const Value* e = n.find("expect")) {
    std::vector<Offset<fb::Expect>> items;
    for (const Value& m : e->toList()) items.push_back(fb::CreateExpect(b, m.isNone() ? 0 : meta(b, m)));
    expect = b.CreateVector(items);
  }
  fb::SymFn sym = fb::SymFn::Add;
  if (const Value* fn = n.find("fn")) {
    auto parsed = symFnFromName(fn->toStr());
    if (!parsed) throw spec::SpecError("spec_builder: unknown sym fn " + fn->toStr());
    sym = static_cast<fb::SymFn>(*parsed);
  }
  auto str = [&](const char* key) { return n.find(key) ? b.CreateString(n.at(key).toStr()) : 0; };
  fb::NodeKind nk = kind == "op" ? fb::NodeKind::Op : kind == "getitem" ? fb::NodeKind::GetItem : fb::NodeKind::Sym;
  return fb::CreateNode(b, nk, str("name"), str("target"), str("source"), str("op"), str("overload"), sym,
                        args(b, n.at("args")), b.CreateVector(kwargs), b.CreateVector(outs), expect);
}

}  // namespace detail

// Program bytes, as graphex/_spec.py writes them.
inline std::string program(uint32_t num_slots, Value inputs, Value nodes, Value outputs, int num_constants = 0) {
  flatbuffers::FlatBufferBuilder b;
  std::vector<flatbuffers::Offset<fb::Input>> ins;
  for (const Value& in : inputs.toList()) {
    auto name = b.CreateString(in.at("name").toStr());
    auto meta = in.find("tensor") ? detail::meta(b, in.at("tensor")) : 0;
    ins.push_back(fb::CreateInput(b, name, detail::inputKind(in.at("kind").toStr()),
                                  static_cast<int32_t>(in.at("slot").toInt()), meta));
  }
  std::vector<flatbuffers::Offset<fb::Node>> ns;
  for (const Value& n : nodes.toList()) ns.push_back(detail::node(b, n));
  auto root = fb::CreateProgram(b, format::kFormatVersion, b.CreateString("test_graph"), num_slots, b.CreateVector(ins),
                                b.CreateVector(ns), detail::args(b, outputs), static_cast<uint32_t>(num_constants));
  fb::FinishSizePrefixedProgramBuffer(b, root);
  return std::string(reinterpret_cast<const char*>(b.GetBufferPointer()), b.GetSize());
}

}  // namespace graphex::testing
