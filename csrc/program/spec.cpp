#include "program/spec.h"

#include <ATen/ops/empty.h>
#include <c10/core/ScalarType.h>

#include <cstring>
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
Value Value::tensor(at::Tensor t) {
  Value v(Tag::Tensor);
  v.tensor_ = std::make_shared<const at::Tensor>(std::move(t));
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
    case Tag::Tensor: return "tensor";
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
const at::Tensor& Value::toTensor() const {
  if (!isTensor()) wrongKind(*this, "tensor");
  return *tensor_;
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

// ---------------------------------------------------------------------------
// Encoding

namespace {

class Writer {
 public:
  void u8(uint8_t x) { out_.push_back(static_cast<char>(x)); }
  template <typename T>
  void raw(T x) {
    char buf[sizeof(T)];
    std::memcpy(buf, &x, sizeof(T));
    out_.append(buf, sizeof(T));
  }
  void bytes(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  void str(const std::string& s) {
    raw<uint32_t>(static_cast<uint32_t>(s.size()));
    bytes(s.data(), s.size());
  }

  void value(const Value& v) {
    u8(static_cast<uint8_t>(v.tag()));
    switch (v.tag()) {
      case Tag::None:
      case Tag::False:
      case Tag::True: return;
      case Tag::Int: raw<int64_t>(v.toInt()); return;
      case Tag::Float: raw<double>(v.toFloat()); return;
      case Tag::Str: str(v.toStr()); return;
      case Tag::List:
        raw<uint32_t>(static_cast<uint32_t>(v.toList().size()));
        for (const Value& item : v.toList()) value(item);
        return;
      case Tag::Dict:
        raw<uint32_t>(static_cast<uint32_t>(v.toDict().size()));
        for (const auto& [k, item] : v.toDict()) {
          str(k);
          value(item);
        }
        return;
      case Tag::Slot: raw<uint32_t>(v.toSlot()); return;
      case Tag::Const: raw<uint32_t>(v.toConst()); return;
      case Tag::Tensor: {
        at::Tensor t = v.toTensor().contiguous();
        raw<int32_t>(static_cast<int32_t>(t.scalar_type()));
        raw<uint32_t>(static_cast<uint32_t>(t.dim()));
        for (int64_t s : t.sizes()) raw<int64_t>(s);
        uint64_t nbytes = t.numel() * t.element_size();
        raw<uint64_t>(nbytes);
        if (nbytes) bytes(t.const_data_ptr(), nbytes);
        return;
      }
    }
  }

  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}

  template <typename T>
  T raw(const char* what) {
    need(sizeof(T), what);
    T x;
    std::memcpy(&x, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return x;
  }
  std::string_view take(size_t n, const char* what) {
    need(n, what);
    std::string_view s = in_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  std::string str(const char* what) {
    auto n = raw<uint32_t>(what);
    return std::string(take(n, what));
  }

  Value value(int depth) {
    if (depth > kMaxDepth) fail("nesting deeper than the format allows");
    auto tag = raw<uint8_t>("tag");
    switch (static_cast<Tag>(tag)) {
      case Tag::None: return Value::none();
      case Tag::False: return Value::boolean(false);
      case Tag::True: return Value::boolean(true);
      case Tag::Int: return Value::integer(raw<int64_t>("int"));
      case Tag::Float: return Value::floating(raw<double>("float"));
      case Tag::Str: return Value::string(str("string"));
      case Tag::List: {
        auto n = raw<uint32_t>("list length");
        // Each element takes at least one byte: reject impossible lengths early.
        need(n, "list elements");
        List items;
        items.reserve(n);
        for (uint32_t i = 0; i < n; ++i) items.push_back(value(depth + 1));
        return Value::list(std::move(items));
      }
      case Tag::Dict: {
        auto n = raw<uint32_t>("dict length");
        need(n, "dict entries");
        Dict items;
        for (uint32_t i = 0; i < n; ++i) {
          std::string key = str("dict key");
          items.emplace(std::move(key), value(depth + 1));
        }
        return Value::dict(std::move(items));
      }
      case Tag::Slot: return Value::slot(raw<uint32_t>("slot"));
      case Tag::Const: return Value::constant(raw<uint32_t>("const"));
      case Tag::Tensor: return tensor();
    }
    fail("unknown tag " + std::to_string(tag));
  }

  Value tensor() {
    auto st = raw<int32_t>("tensor dtype");
    if (st < 0 || st >= static_cast<int32_t>(c10::ScalarType::NumOptions))
      fail("tensor dtype code " + std::to_string(st) + " out of range");
    auto dtype = static_cast<c10::ScalarType>(st);
    auto ndim = raw<uint32_t>("tensor rank");
    if (ndim > 64) fail("tensor rank " + std::to_string(ndim) + " too large");
    std::vector<int64_t> sizes(ndim);
    uint64_t numel = 1;
    for (auto& s : sizes) {
      s = raw<int64_t>("tensor size");
      if (s < 0) fail("negative tensor size");
      numel *= static_cast<uint64_t>(s);
    }
    auto nbytes = raw<uint64_t>("tensor byte count");
    if (nbytes != numel * c10::elementSize(dtype)) fail("tensor byte count does not match its shape");
    std::string_view data = take(nbytes, "tensor data");
    at::Tensor t = at::empty(sizes, at::TensorOptions().dtype(dtype));
    if (nbytes) std::memcpy(t.mutable_data_ptr(), data.data(), nbytes);
    return Value::tensor(std::move(t));
  }

  void need(size_t n, const char* what) {
    if (in_.size() - pos_ < n)
      fail(std::string("truncated while reading ") + what + " (needs " + std::to_string(n) +
           " bytes, " + std::to_string(in_.size() - pos_) + " left)");
  }
  [[noreturn]] void fail(const std::string& msg) {
    throw SpecError("spec: corrupt data at byte " + std::to_string(pos_) + ": " + msg);
  }
  size_t pos() const { return pos_; }
  size_t size() const { return in_.size(); }

 private:
  static constexpr int kMaxDepth = 64;
  std::string_view in_;
  size_t pos_ = 0;
};

}  // namespace

std::string encode(const Value& root) {
  Writer w;
  w.bytes(kMagic, sizeof(kMagic));
  w.raw<uint32_t>(kFormatVersion);
  w.value(root);
  return w.take();
}

Value decode(std::string_view bytes) {
  Reader r(bytes);
  std::string_view magic = r.take(sizeof(kMagic), "header");
  if (std::memcmp(magic.data(), kMagic, sizeof(kMagic)) != 0)
    throw SpecError("spec: not a graphex program (bad magic bytes)");
  auto version = r.raw<uint32_t>("format version");
  if (version != kFormatVersion)
    throw SpecError("spec: format version " + std::to_string(version) +
                    " is not the version this build reads (" + std::to_string(kFormatVersion) + ")");
  Value root = r.value(0);
  if (r.pos() != r.size())
    throw SpecError("spec: " + std::to_string(r.size() - r.pos()) + " trailing bytes after the program");
  return root;
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
    case Tag::Tensor: os << "tensor" << v.toTensor().sizes(); break;
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
