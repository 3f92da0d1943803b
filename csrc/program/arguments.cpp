#include "program/arguments.h"

#include "program/format.h"

#include <ATen/ops/scalar_tensor.h>
#include <c10/core/Device.h>

#include <sstream>

namespace graphex {

namespace {

using Kind = ArgSource::Kind;
using K = fb::ArgKind;

K kindOf(const fb::Arg* a) { return a == nullptr ? K::None : a->kind(); }

[[noreturn]] void badArg(const std::string& what, const c10::TypePtr& type, const fb::Arg* a,
                         const std::string& why = {}) {
  throw ProgramError(what + " expects " + type->str() + ", but the graph passes " + argText(a, 80) +
                     (why.empty() ? "" : " (" + why + ")"));
}

// A slot or constant-table index (both stored in `i`), checked to fit.
uint32_t indexOf(const fb::Arg* a, const std::string& what) {
  if (a->i() < 0 || a->i() > UINT32_MAX)
    throw ProgramError(what + ": slot or constant index " + std::to_string(a->i()) + " out of range");
  return static_cast<uint32_t>(a->i());
}

bool containsSlot(const fb::Arg* a) {
  if (kindOf(a) == K::Slot) return true;
  if (kindOf(a) == K::List && a->items())
    for (const fb::Arg* item : *a->items())
      if (containsSlot(item)) return true;
  return false;
}

const at::Tensor& constantTensor(const fb::Arg* a, const std::vector<at::Tensor>& constants, const std::string& what) {
  uint32_t k = indexOf(a, what);
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

ArgSource slotSource(const fb::Arg* arg, const std::string& what, Kind kind = Kind::Slot) {
  ArgSource a;
  a.kind = kind;
  a.slot = static_cast<int32_t>(indexOf(arg, what));
  return a;
}

// The integer a schema int carries: an Int, a Bool, or one of graphex's enums as the c10 code
// the boxed calling convention uses (dtypes, layouts and memory formats are ints there).
std::optional<int64_t> asInt(const fb::Arg* a) {
  switch (kindOf(a)) {
    case K::Int: return a->i();
    case K::Bool: return static_cast<int64_t>(a->i() != 0);
    case K::DType: return static_cast<int64_t>(format::toScalarType(a->dtype()));
    case K::Layout: return static_cast<int64_t>(format::toLayout(a->layout()));
    case K::MemoryFormat: return static_cast<int64_t>(format::toMemoryFormat(a->memory_format()));
    default: return std::nullopt;
  }
}

// A Python number passed where a schema wants a Tensor, as the Python arg parser makes it: a 0-dim
// tensor flagged as a wrapped number, so type promotion treats it as a Python scalar.
at::Tensor wrappedNumber(const fb::Arg* a) {
  at::Tensor t = kindOf(a) == K::Float  ? at::scalar_tensor(a->f(), at::kDouble)
                 : kindOf(a) == K::Bool ? at::scalar_tensor(a->i() != 0, at::kBool)
                                        : at::scalar_tensor(a->i(), at::kLong);
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

std::string str(const fb::Arg* a) { return a->s() ? a->s()->str() : std::string(); }

// A scalar (non-list, non-tensor) constant converted to the schema's type.
c10::IValue scalarConstant(const fb::Arg* a, const c10::TypePtr& type, const std::string& what) {
  K k = kindOf(a);
  switch (type->kind()) {
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType:
      if (auto i = asInt(a)) return *i;
      break;
    case c10::TypeKind::FloatType:
    case c10::TypeKind::SymFloatType:
      if (k == K::Int) return static_cast<double>(a->i());
      if (k == K::Float) return a->f();
      break;
    case c10::TypeKind::BoolType:
    case c10::TypeKind::SymBoolType:
      if (k == K::Bool || k == K::Int) return a->i() != 0;
      break;
    case c10::TypeKind::NumberType:  // Scalar
      if (k == K::Int) return a->i();
      if (k == K::Float) return a->f();
      if (k == K::Bool) return a->i() != 0;
      break;
    case c10::TypeKind::StringType:
      if (k == K::Str) return str(a);
      break;
    case c10::TypeKind::DeviceObjType:
      if (k == K::Device) return format::toDevice(a->device());
      if (k == K::Str) {
        try {
          return c10::Device(str(a));
        } catch (const std::exception&) {
          badArg(what, type, a, "not a device name");
        }
      }
      break;
    case c10::TypeKind::AnyType:
      if (k == K::Float) return a->f();
      if (k == K::Bool) return a->i() != 0;
      if (k == K::Str) return str(a);
      if (k == K::Device) return format::toDevice(a->device());
      if (auto i = asInt(a)) return *i;
      break;
    default:
      break;
  }
  badArg(what, type, a);
}

ArgSource listSource(const fb::Arg* v, const c10::TypePtr& elem, const std::vector<at::Tensor>& constants,
                     const std::string& what, const c10::TypePtr& list_type) {
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
      // An empty list of any other element type is a constant (mkldnn::_convolution_pointwise's `Scalar?[] scalars`
      // with no post-op: Note [A frozen convolution weight is prepacked once], graphex/lowering/prepack.py).
      if (!v->items() || v->items()->size() == 0) return constant(c10::IValue(c10::impl::GenericList(elem)));
      badArg(what, list_type, v, "lists of " + elem->str() + " are not supported");
  }
  bool of_tensors = a.kind == Kind::TensorList || a.kind == Kind::OptionalTensorList;
  bool reads_a_slot = false;
  if (v->items()) {
    a.items.reserve(v->items()->size());
    for (uint32_t i = 0; i < v->items()->size(); ++i) {
      const fb::Arg* item = v->items()->Get(i);
      std::string item_what = what + " element " + std::to_string(i);
      ListItem li;
      switch (kindOf(item)) {
        case K::Slot:
          li.slot = static_cast<int32_t>(indexOf(item, item_what));
          reads_a_slot = true;
          break;
        case K::Const:
          if (!of_tensors) badArg(item_what, elem, item);
          li.constant = constantTensor(item, constants, item_what);
          break;
        case K::None:
          if (a.kind != Kind::OptionalTensorList) badArg(item_what, elem, item);
          li.constant = c10::IValue();
          break;
        case K::List: badArg(item_what, elem, item);
        default:
          if (of_tensors) badArg(item_what, elem, item);
          li.constant = scalarConstant(item, elem, item_what);
      }
      a.items.push_back(std::move(li));
    }
  }
  if (reads_a_slot) return a;

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

ArgSource makeArgSource(const fb::Arg* v, const c10::TypePtr& type, const std::vector<at::Tensor>& constants,
                        const std::string& what) {
  K k = kindOf(v);
  if (type->kind() == c10::TypeKind::OptionalType) {
    if (k == K::None) return constant(c10::IValue());
    return makeArgSource(v, type->castRaw<c10::OptionalType>()->getElementType(), constants, what);
  }
  if (k == K::Slot) return slotSource(v, what, type->kind() == c10::TypeKind::FloatType ? Kind::SlotAsDouble : Kind::Slot);
  switch (type->kind()) {
    case c10::TypeKind::TensorType:
      if (k == K::Const) return constant(constantTensor(v, constants, what));
      if (k == K::Int || k == K::Float || k == K::Bool) return constant(wrappedNumber(v));
      badArg(what, type, v);
    case c10::TypeKind::ListType:
      if (k != K::List) badArg(what, type, v);
      return listSource(v, type->castRaw<c10::ListType>()->getElementType(), constants, what, type);
    case c10::TypeKind::NoneType:
    case c10::TypeKind::GeneratorType:
      if (k == K::None) return constant(c10::IValue());
      badArg(what, type, v, "only the default generator (None) can be captured");
    default:
      if (k == K::List || k == K::Const || k == K::None) badArg(what, type, v);
      return constant(scalarConstant(v, type, what));
  }
}

ArgSource makeUntypedArgSource(const fb::Arg* v, const std::vector<at::Tensor>& constants, const std::string& what) {
  switch (kindOf(v)) {
    case K::Slot: return slotSource(v, what);
    case K::Const: return constant(constantTensor(v, constants, what));
    case K::None: return constant(c10::IValue());
    case K::Bool: return constant(v->i() != 0);
    case K::Int: return constant(v->i());
    case K::Float: return constant(v->f());
    case K::Str: return constant(str(v));
    case K::List:
      if (!containsSlot(v)) {
        // A constant list of ints/floats (e.g. a size returned by the graph).
        c10::impl::GenericList l(c10::AnyType::get());
        if (v->items())
          for (const fb::Arg* item : *v->items()) l.push_back(makeUntypedArgSource(item, constants, what).constant);
        return constant(l);
      }
      break;
    default: break;
  }
  throw ProgramError(what + ": cannot use " + argText(v, 80) + " here");
}

std::string argText(const fb::Arg* a, size_t max_chars) {
  std::ostringstream os;
  switch (kindOf(a)) {
    case K::None: os << "None"; break;
    case K::Bool: os << (a->i() != 0 ? "True" : "False"); break;
    case K::Int: os << a->i(); break;
    case K::Float: os << a->f(); break;
    case K::Str: os << '\'' << str(a) << '\''; break;
    case K::Slot: os << '%' << a->i(); break;
    case K::Const: os << "const" << a->i(); break;
    case K::DType: os << fb::EnumNameDType(a->dtype()); break;
    case K::Layout: os << fb::EnumNameLayout(a->layout()); break;
    case K::MemoryFormat: os << fb::EnumNameMemoryFormat(a->memory_format()); break;
    case K::Device:
      if (a->device() == nullptr) os << "device(?)";
      else os << "device(" << fb::EnumNameDeviceType(a->device()->type()) << ", " << a->device()->index() << ')';
      break;
    case K::List: {
      os << '[';
      bool first = true;
      if (a->items())
        for (const fb::Arg* item : *a->items()) {
          if (!first) os << ", ";
          first = false;
          os << argText(item, max_chars);
          if (static_cast<size_t>(os.tellp()) > max_chars) break;
        }
      os << ']';
      break;
    }
    default: os << "<argument kind " << static_cast<int>(kindOf(a)) << '>';
  }
  std::string s = os.str();
  if (s.size() > max_chars) s = s.substr(0, max_chars) + "...";
  return s;
}

}  // namespace graphex
