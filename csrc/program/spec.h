// The program spec: the one data format that crosses the C++/Python boundary.
//
// Note [One format for building, caching and deploying]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Python lowers an FX graph into a tree of spec::Value (see graphex/_spec.py, the
// twin of this file) and encodes it to bytes. C++ decodes the bytes and builds a
// Program from the tree (program.cpp). The same bytes are what cache_compile
// writes to disk and what a C++ application loads, so there is exactly one path
// from "description" to "runnable program" and it is exercised on every compile.
//
// Encoding (little endian):
//   header  : 8 bytes magic "GRAPHEX\0", u32 format version
//   value   : u8 tag, then
//     NONE/FALSE/TRUE : nothing
//     INT     : i64            FLOAT : f64
//     STR     : u32 n, n bytes
//     LIST    : u32 n, n values
//     DICT    : u32 n, n x (u32 len, key bytes, value)
//     SLOT    : u32 slot index           (a runtime value produced by the graph)
//     CONST   : u32 constant index       (a tensor in the program's constant table)
//     TENSOR  : i32 scalar type, u32 ndim, ndim x i64 size, u64 nbytes, bytes
//               (contiguous data; only used for constant tables on disk)
// Decoding never trusts lengths: every read is bounds-checked and nesting depth is
// limited, so a truncated or corrupt file is a SpecError, never a crash.
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

constexpr char kMagic[8] = {'G', 'R', 'A', 'P', 'H', 'E', 'X', '\0'};
// Bump when the encoding or the meaning of any field changes.
constexpr uint32_t kFormatVersion = 1;

// A malformed, truncated or foreign spec.
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
  Tensor = 10,
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
  static Value tensor(at::Tensor t);

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
  bool isTensor() const { return tag_ == Tag::Tensor; }

  // Accessors throw SpecError naming the expected and actual kind.
  bool toBool() const;
  int64_t toInt() const;
  double toFloat() const;  // accepts Int too
  const std::string& toStr() const;
  const List& toList() const;
  const Dict& toDict() const;
  uint32_t toSlot() const;
  uint32_t toConst() const;
  const at::Tensor& toTensor() const;

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
  std::shared_ptr<const at::Tensor> tensor_;
};

// Bytes <-> Value. decode() checks the header (magic and version) first.
std::string encode(const Value& root);
Value decode(std::string_view bytes);

// Render a value as compact, readable text (used by dumps and error messages).
std::string toText(const Value& v, size_t max_chars = 200);

}  // namespace graphex::spec
