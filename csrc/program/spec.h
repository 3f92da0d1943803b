// spec::Value: the in-memory value tree of one argument while a Program is built.
//
// Programs are stored as FlatBuffers (csrc/program/format.h, Note [One typed format]);
// an argument's typed table becomes a Value (format::toValue) that program building
// converts by the operator's schema (arguments.cpp). Values are never written to disk.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace graphex::spec {

// A value of the wrong kind for where it is used.
class SpecError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class Tag : uint8_t {
  None = 0,
  False = 1,
  True = 2,
  Int = 3,
  Float = 4,
  Str = 5,
  List = 6,
  Dict = 7,
  Slot = 8,
  Const = 9,
};

class Value;
using List = std::vector<Value>;
using Dict = std::map<std::string, Value, std::less<>>;

// A node of the spec tree. Small and copyable; lists and dicts are shared.
class Value {
 public:
  Value() : tag_(Tag::None) {}
  static Value none() { return Value(); }
  static Value boolean(bool b) { return Value(b ? Tag::True : Tag::False); }
  static Value integer(int64_t i);
  static Value floating(double d);
  static Value string(std::string s);
  static Value list(List items);
  static Value dict(Dict items);
  static Value slot(uint32_t index);
  static Value constant(uint32_t index);

  Tag tag() const { return tag_; }
  bool isNone() const { return tag_ == Tag::None; }
  bool isBool() const { return tag_ == Tag::True || tag_ == Tag::False; }
  bool isInt() const { return tag_ == Tag::Int; }
  bool isFloat() const { return tag_ == Tag::Float; }
  bool isStr() const { return tag_ == Tag::Str; }
  bool isList() const { return tag_ == Tag::List; }
  bool isDict() const { return tag_ == Tag::Dict; }
  bool isSlot() const { return tag_ == Tag::Slot; }
  bool isConst() const { return tag_ == Tag::Const; }

  // Accessors throw SpecError naming the expected and actual kind.
  bool toBool() const;
  int64_t toInt() const;
  double toFloat() const;  // accepts Int too
  const std::string& toStr() const;
  const List& toList() const;
  const Dict& toDict() const;
  uint32_t toSlot() const;
  uint32_t toConst() const;

  // Dict field access: `at` throws SpecError naming the missing key.
  const Value& at(std::string_view key) const;
  const Value* find(std::string_view key) const;

  // True when this value or anything inside it is a Slot.
  bool containsSlot() const;

  std::string tagName() const;

 private:
  explicit Value(Tag t) : tag_(t) {}
  Tag tag_;
  int64_t int_ = 0;
  double float_ = 0.0;
  std::shared_ptr<const std::string> str_;
  std::shared_ptr<const List> list_;
  std::shared_ptr<const Dict> dict_;
};

// Render a value as compact, readable text (used by dumps and error messages).
std::string toText(const Value& v, size_t max_chars = 200);

}  // namespace graphex::spec
