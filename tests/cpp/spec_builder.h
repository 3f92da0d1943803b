// Helpers to write program specs by hand in C++ tests.
#pragma once

#include "program/spec.h"

#include <c10/core/ScalarType.h>

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

inline Value tensorInput(const std::string& name, uint32_t slot, std::vector<int64_t> sizes,
                         c10::ScalarType dtype = c10::ScalarType::Float) {
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
  return D({{"name", S(name)}, {"kind", S("tensor")}, {"slot", I(slot)}, {"dtype", I(static_cast<int>(dtype))},
            {"device", S("cpu")}, {"sizes", Value::list(sz)}, {"strides", Value::list(st)}});
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

inline Value program(uint32_t num_slots, Value inputs, Value nodes, Value outputs, int num_constants = 0) {
  return D({{"name", S("test_graph")}, {"num_slots", I(num_slots)}, {"inputs", std::move(inputs)},
            {"nodes", std::move(nodes)}, {"outputs", std::move(outputs)}, {"num_constants", I(num_constants)}});
}

}  // namespace graphex::testing
