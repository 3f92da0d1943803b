#include "runtime/sym_ops.h"

#include <ATen/ops/scalar_tensor.h>

#include <cmath>
#include <stdexcept>
#include <string>

namespace graphex {

namespace {

bool isNumber(const c10::IValue& v) { return v.isInt() || v.isDouble() || v.isBool(); }
int64_t asInt(const c10::IValue& v) { return v.isBool() ? static_cast<int64_t>(v.toBool()) : v.toInt(); }
double asDouble(const c10::IValue& v) {
  if (v.isDouble()) return v.toDouble();
  return static_cast<double>(asInt(v));
}
bool asBool(const c10::IValue& v) {
  if (v.isBool()) return v.toBool();
  if (v.isInt()) return v.toInt() != 0;
  return v.toDouble() != 0.0;
}
bool bothIntegral(const c10::IValue& a, const c10::IValue& b) { return !a.isDouble() && !b.isDouble(); }

int64_t floorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
int64_t floorMod(int64_t a, int64_t b) {
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

}  // namespace

c10::IValue applySymFn(SymFn fn, const c10::IValue* args, size_t n) {
  auto arity = [&](size_t want) {
    if (n != want)
      throw std::runtime_error(std::string("sym.") + symFnName(fn) + " takes " + std::to_string(want) +
                               " operands, got " + std::to_string(n));
    for (size_t i = 0; i < n; ++i)
      if (!isNumber(args[i]))
        throw std::runtime_error(std::string("sym.") + symFnName(fn) + ": operand " + std::to_string(i) +
                                 " is a " + args[i].tagKind() + ", not a number");
  };
  switch (fn) {
    case SymFn::ScalarTensor: {
      arity(1);
      const c10::IValue& a = args[0];
      at::Tensor t = a.isDouble() ? at::scalar_tensor(a.toDouble(), at::kDouble)
                     : a.isBool() ? at::scalar_tensor(a.toBool(), at::kBool)
                                  : at::scalar_tensor(a.toInt(), at::kLong);
      t.unsafeGetTensorImpl()->set_wrapped_number(true);
      return t;
    }
    case SymFn::IfThenElse:
      arity(3);
      return asBool(args[0]) ? args[1] : args[2];
    case SymFn::Neg:
    case SymFn::Abs:
    case SymFn::Not:
    case SymFn::ToFloat:
    case SymFn::ToInt:
    case SymFn::Ceil:
    case SymFn::Floor: {
      arity(1);
      const c10::IValue& a = args[0];
      switch (fn) {
        case SymFn::Neg: return a.isDouble() ? c10::IValue(-a.toDouble()) : c10::IValue(-asInt(a));
        case SymFn::Abs:
          return a.isDouble() ? c10::IValue(std::fabs(a.toDouble())) : c10::IValue(static_cast<int64_t>(std::llabs(asInt(a))));
        case SymFn::Not: return !asBool(a);
        case SymFn::ToFloat: return asDouble(a);
        case SymFn::ToInt: return a.isDouble() ? static_cast<int64_t>(std::trunc(a.toDouble())) : asInt(a);
        case SymFn::Ceil: return a.isDouble() ? static_cast<int64_t>(std::ceil(a.toDouble())) : asInt(a);
        case SymFn::Floor: return a.isDouble() ? static_cast<int64_t>(std::floor(a.toDouble())) : asInt(a);
        default: break;
      }
      break;
    }
    default: {
      arity(2);
      const c10::IValue& a = args[0];
      const c10::IValue& b = args[1];
      bool ints = bothIntegral(a, b);
      switch (fn) {
        case SymFn::Add: return ints ? c10::IValue(asInt(a) + asInt(b)) : c10::IValue(asDouble(a) + asDouble(b));
        case SymFn::Sub: return ints ? c10::IValue(asInt(a) - asInt(b)) : c10::IValue(asDouble(a) - asDouble(b));
        case SymFn::Mul: return ints ? c10::IValue(asInt(a) * asInt(b)) : c10::IValue(asDouble(a) * asDouble(b));
        case SymFn::FloorDiv:
          if (asDouble(b) == 0.0) throw std::runtime_error("sym.FloorDiv: division by zero");
          return ints ? c10::IValue(floorDiv(asInt(a), asInt(b)))
                      : c10::IValue(std::floor(asDouble(a) / asDouble(b)));
        case SymFn::TrueDiv:
          if (asDouble(b) == 0.0) throw std::runtime_error("sym.TrueDiv: division by zero");
          return asDouble(a) / asDouble(b);
        case SymFn::Mod:
          if (asDouble(b) == 0.0) throw std::runtime_error("sym.Mod: modulo by zero");
          if (ints) return floorMod(asInt(a), asInt(b));
          {
            double r = std::fmod(asDouble(a), asDouble(b));
            if (r != 0.0 && ((r < 0) != (asDouble(b) < 0))) r += asDouble(b);
            return r;
          }
        case SymFn::Pow:
          if (ints && asInt(b) >= 0) {
            int64_t base = asInt(a), e = asInt(b), r = 1;
            while (e-- > 0) r *= base;
            return r;
          }
          return std::pow(asDouble(a), asDouble(b));
        case SymFn::Eq: return ints ? asInt(a) == asInt(b) : asDouble(a) == asDouble(b);
        case SymFn::Ne: return ints ? asInt(a) != asInt(b) : asDouble(a) != asDouble(b);
        case SymFn::Lt: return ints ? asInt(a) < asInt(b) : asDouble(a) < asDouble(b);
        case SymFn::Le: return ints ? asInt(a) <= asInt(b) : asDouble(a) <= asDouble(b);
        case SymFn::Gt: return ints ? asInt(a) > asInt(b) : asDouble(a) > asDouble(b);
        case SymFn::Ge: return ints ? asInt(a) >= asInt(b) : asDouble(a) >= asDouble(b);
        case SymFn::And: return asBool(a) && asBool(b);
        case SymFn::Or: return asBool(a) || asBool(b);
        case SymFn::Max:
          if (ints) return std::max(asInt(a), asInt(b));
          return std::max(asDouble(a), asDouble(b));
        case SymFn::Min:
          if (ints) return std::min(asInt(a), asInt(b));
          return std::min(asDouble(a), asDouble(b));
        default: break;
      }
    }
  }
  throw std::runtime_error(std::string("sym.") + symFnName(fn) + ": unsupported operands");
}

}  // namespace graphex
