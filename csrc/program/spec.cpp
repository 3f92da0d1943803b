#include "program/spec.h"

#include <sstream>

namespace graphex::spec {

Value Value::integer(int64_t i) {
  Value v(Tag::Int);
  v.int_ = i;
  return v;
}
Value Value::floating(double d) {
  Value v(Tag::Float);
  v.float_ = d;
  return v;
}
Value Value::string(std::string s) {
  Value v(Tag::Str);
  v.str_ = std::make_shared<const std::string>(std::move(s));
  return v;
}
Value Value::list(List items) {
  Value v(Tag::List);
  v.list_ = std::make_shared<const List>(std::move(items));
  return v;
}
Value Value::dict(Dict items) {
  Value v(Tag::Dict);
  v.dict_ = std::make_shared<const Dict>(std::move(items));
  return v;
}
Value Value::slot(uint32_t index) {
  Value v(Tag::Slot);
  v.int_ = index;
  return v;
}
Value Value::constant(uint32_t index) {
  Value v(Tag::Const);
  v.int_ = index;
  return v;
}

std::string Value::tagName() const {
  switch (tag_) {
    case Tag::None: return "None";
    case Tag::False:
    case Tag::True: return "bool";
    case Tag::Int: return "int";
    case Tag::Float: return "float";
    case Tag::Str: return "str";
    case Tag::List: return "list";
    case Tag::Dict: return "dict";
    case Tag::Slot: return "slot";
    case Tag::Const: return "const";
  }
  return "?";
}

namespace {
[[noreturn]] void wrongKind(const Value& v, const char* expected) {
  throw SpecError(std::string("spec: expected ") + expected + ", found " + v.tagName() +
                  " (" + toText(v, 80) + ")");
}
}  // namespace

bool Value::toBool() const {
  if (!isBool()) wrongKind(*this, "bool");
  return tag_ == Tag::True;
}
int64_t Value::toInt() const {
  if (!isInt()) wrongKind(*this, "int");
  return int_;
}
double Value::toFloat() const {
  if (isInt()) return static_cast<double>(int_);
  if (!isFloat()) wrongKind(*this, "float");
  return float_;
}
const std::string& Value::toStr() const {
  if (!isStr()) wrongKind(*this, "str");
  return *str_;
}
const List& Value::toList() const {
  if (!isList()) wrongKind(*this, "list");
  return *list_;
}
const Dict& Value::toDict() const {
  if (!isDict()) wrongKind(*this, "dict");
  return *dict_;
}
uint32_t Value::toSlot() const {
  if (!isSlot()) wrongKind(*this, "slot");
  return static_cast<uint32_t>(int_);
}
uint32_t Value::toConst() const {
  if (!isConst()) wrongKind(*this, "const");
  return static_cast<uint32_t>(int_);
}

const Value* Value::find(std::string_view key) const {
  const Dict& d = toDict();
  auto it = d.find(key);
  return it == d.end() ? nullptr : &it->second;
}

const Value& Value::at(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) throw SpecError("spec: missing field '" + std::string(key) + "'");
  return *v;
}

bool Value::containsSlot() const {
  if (isSlot()) return true;
  if (isList()) {
    for (const Value& item : *list_)
      if (item.containsSlot()) return true;
  }
  return false;
}

std::string toText(const Value& v, size_t max_chars) {
  std::ostringstream os;
  switch (v.tag()) {
    case Tag::None: os << "None"; break;
    case Tag::False: os << "False"; break;
    case Tag::True: os << "True"; break;
    case Tag::Int: os << v.toInt(); break;
    case Tag::Float: os << v.toFloat(); break;
    case Tag::Str: os << '\'' << v.toStr() << '\''; break;
    case Tag::Slot: os << '%' << v.toSlot(); break;
    case Tag::Const: os << "const" << v.toConst(); break;
    case Tag::List: {
      os << '[';
      bool first = true;
      for (const Value& item : v.toList()) {
        if (!first) os << ", ";
        first = false;
        os << toText(item, max_chars);
        if (static_cast<size_t>(os.tellp()) > max_chars) break;
      }
      os << ']';
      break;
    }
    case Tag::Dict: {
      os << '{';
      bool first = true;
      for (const auto& [k, item] : v.toDict()) {
        if (!first) os << ", ";
        first = false;
        os << k << ": " << toText(item, max_chars);
        if (static_cast<size_t>(os.tellp()) > max_chars) break;
      }
      os << '}';
      break;
    }
  }
  std::string s = os.str();
  if (s.size() > max_chars) s = s.substr(0, max_chars) + "...";
  return s;
}

}  // namespace graphex::spec
