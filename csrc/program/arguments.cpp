#include "program/arguments.h"

#include <ATen/ops/scalar_tensor.h>
#include <c10/core/Device.h>

namespace graphex {

namespace {

using Kind = ArgSource::Kind;
using spec::Value;

[[noreturn]] void badArg(const std::string& what, const c10::TypePtr& type, const Value& v,
                         const std::string& why = {}) {
  throw ProgramError(what + " expects " + type->str() + ", but the graph passes " +
                     spec::toText(v, 80) + (why.empty() ? "" : " (" + why + ")"));
}

const at::Tensor& constantTensor(const Value& v, const std::vector<at::Tensor>& constants,
                                 const std::string& what) {
  uint32_t k = v.toConst();
  if (k >= constants.size())
    throw ProgramError(what + " refers to constant tensor " + std::to_string(k) + " but the program has " +
                       std::to_string(constants.size()));
  return constants[k];
}

ArgSource constant(c10::IValue iv) {
  ArgSource a;
  a.kind = Kind::Constant;
  a.constant = std::move(iv);
  return a;
}

ArgSource slotSource(const Value& v, Kind kind = Kind::Slot) {
  ArgSource a;
  a.kind = kind;
  a.slot = static_cast<int32_t>(v.toSlot());
  return a;
}

// A scalar (non-list, non-tensor) constant converted to the schema's type.
c10::IValue scalarConstant(const Value& v, const c10::TypePtr& type, const std::string& what) {
  switch (type->kind()) {
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType:
      if (v.isInt()) return v.toInt();
      if (v.isBool()) return static_cast<int64_t>(v.toBool());
      break;
    case c10::TypeKind::FloatType:
    case c10::TypeKind::SymFloatType:
      if (v.isInt() || v.isFloat()) return v.toFloat();
      break;
    case c10::TypeKind::BoolType:
    case c10::TypeKind::SymBoolType:
      if (v.isBool()) return v.toBool();
      if (v.isInt()) return v.toInt() != 0;
      break;
    case c10::TypeKind::NumberType:  // Scalar
      if (v.isInt()) return v.toInt();
      if (v.isFloat()) return v.toFloat();
      if (v.isBool()) return v.toBool();
      break;
    case c10::TypeKind::StringType:
      if (v.isStr()) return v.toStr();
      break;
    case c10::TypeKind::DeviceObjType:
      if (v.isStr()) {
        try {
          return c10::Device(v.toStr());
        } catch (const std::exception& e) {
          badArg(what, type, v, "not a device name");
        }
      }
      break;
    case c10::TypeKind::AnyType:
      if (v.isInt()) return v.toInt();
      if (v.isFloat()) return v.toFloat();
      if (v.isBool()) return v.toBool();
      if (v.isStr()) return v.toStr();
      break;
    default:
      break;
  }
  badArg(what, type, v);
}

ArgSource listSource(const Value& v, const c10::TypePtr& elem, const std::vector<at::Tensor>& constants,
                     const std::string& what, const c10::TypePtr& list_type) {
  const spec::List& items = v.toList();
  ArgSource a;
  bool is_optional_tensor = elem->kind() == c10::TypeKind::OptionalType &&
                            elem->castRaw<c10::OptionalType>()->getElementType()->kind() ==
                                c10::TypeKind::TensorType;
  switch (elem->kind()) {
    case c10::TypeKind::TensorType: a.kind = Kind::TensorList; break;
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType: a.kind = Kind::IntList; break;
    case c10::TypeKind::FloatType: a.kind = Kind::DoubleList; break;
    case c10::TypeKind::BoolType: a.kind = Kind::BoolList; break;
    default:
      if (is_optional_tensor) {
        a.kind = Kind::OptionalTensorList;
        break;
      }
      badArg(what, list_type, v, "lists of " + elem->str() + " are not supported");
  }
  a.items.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const Value& item = items[i];
    std::string item_what = what + " element " + std::to_string(i);
    ListItem li;
    if (item.isSlot()) {
      li.slot = static_cast<int32_t>(item.toSlot());
    } else if (item.isConst()) {
      if (a.kind != Kind::TensorList && a.kind != Kind::OptionalTensorList) badArg(item_what, elem, item);
      li.constant = constantTensor(item, constants, item_what);
    } else if (item.isNone()) {
      if (a.kind != Kind::OptionalTensorList) badArg(item_what, elem, item);
      li.constant = c10::IValue();
    } else {
      if (a.kind == Kind::TensorList || a.kind == Kind::OptionalTensorList) badArg(item_what, elem, item);
      li.constant = scalarConstant(item, elem, item_what);
    }
    a.items.push_back(std::move(li));
  }
  if (v.containsSlot()) return a;

  // Entirely constant: build the list once now.
  switch (a.kind) {
    case Kind::TensorList: {
      c10::List<at::Tensor> l;
      for (auto& li : a.items) l.push_back(li.constant.toTensor());
      return constant(l);
    }
    case Kind::OptionalTensorList: {
      c10::List<std::optional<at::Tensor>> l;
      for (auto& li : a.items)
        l.push_back(li.constant.isNone() ? std::nullopt : std::optional<at::Tensor>(li.constant.toTensor()));
      return constant(l);
    }
    case Kind::IntList: {
      c10::List<int64_t> l;
      for (auto& li : a.items) l.push_back(li.constant.toInt());
      return constant(l);
    }
    case Kind::DoubleList: {
      c10::List<double> l;
      for (auto& li : a.items) l.push_back(li.constant.toDouble());
      return constant(l);
    }
    case Kind::BoolList: {
      c10::List<bool> l;
      for (auto& li : a.items) l.push_back(li.constant.toBool());
      return constant(l);
    }
    default: break;
  }
  return a;
}

}  // namespace

at::Tensor wrappedNumber(const spec::Value& v) {
  // What Python's argument parser does with `torch.ops.aten.add.Tensor(x, 1)`: a 0-dim
  // tensor flagged as a wrapped number, so type promotion treats it as a Python scalar.
  at::Tensor t = v.isFloat() ? at::scalar_tensor(v.toFloat(), at::kDouble)
                 : v.isBool() ? at::scalar_tensor(v.toBool(), at::kBool)
                              : at::scalar_tensor(v.toInt(), at::kLong);
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

ArgSource makeArgSource(const Value& v, const c10::TypePtr& type, const std::vector<at::Tensor>& constants,
                        const std::string& what) {
  if (type->kind() == c10::TypeKind::OptionalType) {
    if (v.isNone()) return constant(c10::IValue());
    return makeArgSource(v, type->castRaw<c10::OptionalType>()->getElementType(), constants, what);
  }
  if (v.isSlot()) {
    if (type->kind() == c10::TypeKind::FloatType) return slotSource(v, Kind::SlotAsDouble);
    return slotSource(v);
  }
  switch (type->kind()) {
    case c10::TypeKind::TensorType:
      if (v.isConst()) return constant(constantTensor(v, constants, what));
      if (v.isInt() || v.isFloat() || v.isBool()) return constant(wrappedNumber(v));
      badArg(what, type, v);
    case c10::TypeKind::ListType:
      if (!v.isList()) badArg(what, type, v);
      return listSource(v, type->castRaw<c10::ListType>()->getElementType(), constants, what, type);
    case c10::TypeKind::NoneType:
    case c10::TypeKind::GeneratorType:
      if (v.isNone()) return constant(c10::IValue());
      badArg(what, type, v, "only the default generator (None) can be captured");
    default:
      if (v.isList() || v.isConst() || v.isDict()) badArg(what, type, v);
      if (v.isNone()) badArg(what, type, v);
      return constant(scalarConstant(v, type, what));
  }
}

ArgSource makeUntypedArgSource(const Value& v, const std::vector<at::Tensor>& constants,
                               const std::string& what) {
  if (v.isSlot()) return slotSource(v);
  if (v.isConst()) return constant(constantTensor(v, constants, what));
  if (v.isNone()) return constant(c10::IValue());
  if (v.isBool()) return constant(v.toBool());
  if (v.isInt()) return constant(v.toInt());
  if (v.isFloat()) return constant(v.toFloat());
  if (v.isStr()) return constant(v.toStr());
  if (v.isList() && !v.containsSlot()) {
    // A constant list of ints/floats (e.g. a size returned by the graph).
    c10::impl::GenericList l(c10::AnyType::get());
    for (const Value& item : v.toList()) l.push_back(makeUntypedArgSource(item, constants, what).constant);
    return constant(l);
  }
  throw ProgramError(what + ": cannot use " + spec::toText(v, 80) + " here");
}

}  // namespace graphex
