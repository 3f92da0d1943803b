#include "deploy/safetensors.h"

#include <ATen/ops/clone.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/ScalarType.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <vector>

namespace graphex::deploy {

namespace {

constexpr std::pair<const char*, c10::ScalarType> kDtypes[] = {
    {"BOOL", c10::kBool}, {"U8", c10::kByte},      {"I8", c10::kChar},          {"I16", c10::kShort},
    {"I32", c10::kInt},   {"I64", c10::kLong},     {"F16", c10::kHalf},         {"BF16", c10::kBFloat16},
    {"F32", c10::kFloat}, {"F64", c10::kDouble},   {"U16", c10::kUInt16},       {"U32", c10::kUInt32},
    {"U64", c10::kUInt64}, {"F8_E4M3", c10::kFloat8_e4m3fn}, {"F8_E5M2", c10::kFloat8_e5m2},
    {"C64", c10::kComplexFloat},
};

// A JSON reader for the safetensors header: objects, arrays, strings, integers.
struct Json {
  enum Kind { Object, Array, String, Number, Other } kind = Other;
  std::map<std::string, Json> object;
  std::vector<Json> array;
  std::string string;
  int64_t number = 0;
};

class Parser {
 public:
  Parser(std::string_view s, std::string what) : s_(s), what_(std::move(what)) {}
  Json parse() {
    Json v = value(0);
    ws();
    if (pos_ != s_.size()) fail("trailing characters");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& why) {
    throw WeightsError(what_ + ": malformed header at byte " + std::to_string(pos_) + ": " + why);
  }
  void ws() {
    while (pos_ < s_.size() && std::strchr(" \t\r\n", s_[pos_])) ++pos_;
  }
  char peek() {
    ws();
    if (pos_ >= s_.size()) fail("unexpected end");
    return s_[pos_];
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  std::string str() {
    expect('"');
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) fail("unterminated string");
      char c = s_[pos_++];
      if (c == '"') return out;
      if (c == '\\') {
        if (pos_ >= s_.size()) fail("unterminated escape");
        char e = s_[pos_++];
        if (e == 'u') {
          if (pos_ + 4 > s_.size()) fail("bad \\u escape");
          unsigned code = std::stoul(std::string(s_.substr(pos_, 4)), nullptr, 16);
          pos_ += 4;
          if (code < 0x80) out += static_cast<char>(code);
          else if (code < 0x800) out += {static_cast<char>(0xc0 | (code >> 6)), static_cast<char>(0x80 | (code & 0x3f))};
          else out += {static_cast<char>(0xe0 | (code >> 12)), static_cast<char>(0x80 | ((code >> 6) & 0x3f)),
                       static_cast<char>(0x80 | (code & 0x3f))};
        } else {
          const char* from = "\"\\/bfnrt";
          const char* to = "\"\\/\b\f\n\r\t";
          const char* p = std::strchr(from, e);
          if (!p || !*p) fail("bad escape");
          out += to[p - from];
        }
      } else {
        out += c;
      }
    }
  }
  Json value(int depth) {
    if (depth > 16) fail("nested too deeply");
    Json v;
    char c = peek();
    if (c == '{') {
      v.kind = Json::Object;
      ++pos_;
      if (peek() == '}') return ++pos_, v;
      while (true) {
        std::string k = str();
        expect(':');
        v.object[k] = value(depth + 1);
        if (peek() == ',') { ++pos_; continue; }
        expect('}');
        return v;
      }
    }
    if (c == '[') {
      v.kind = Json::Array;
      ++pos_;
      if (peek() == ']') return ++pos_, v;
      while (true) {
        v.array.push_back(value(depth + 1));
        if (peek() == ',') { ++pos_; continue; }
        expect(']');
        return v;
      }
    }
    if (c == '"') {
      v.kind = Json::String;
      v.string = str();
      return v;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
      size_t start = pos_;
      if (c == '-') ++pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
      if (pos_ - start > 18) fail("number too large");
      v.kind = Json::Number;
      v.number = std::stoll(std::string(s_.substr(start, pos_ - start)));
      return v;
    }
    for (const char* word : {"true", "false", "null"})
      if (s_.substr(pos_, std::strlen(word)) == word) return pos_ += std::strlen(word), v;
    fail("unexpected character");
  }

  std::string_view s_;
  std::string what_;
  size_t pos_ = 0;
};

struct Mapping {
  void* data = MAP_FAILED;
  size_t size = 0;
  ~Mapping() {
    if (data != MAP_FAILED) munmap(data, size);
  }
};

}  // namespace

std::map<std::string, at::Tensor> loadSafetensors(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw WeightsError("cannot open weights " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    throw WeightsError("cannot stat weights " + path);
  }
  auto mapping = std::make_shared<Mapping>();
  mapping->size = static_cast<size_t>(st.st_size);
  if (mapping->size > 0) mapping->data = mmap(nullptr, mapping->size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (mapping->size < 8) throw WeightsError(path + ": not a safetensors file (" + std::to_string(mapping->size) + " bytes)");
  if (mapping->data == MAP_FAILED) throw WeightsError("cannot map weights " + path + ": " + std::strerror(errno));
  const char* base = static_cast<const char*>(mapping->data);
  uint64_t header_len;
  std::memcpy(&header_len, base, 8);
  if (header_len > mapping->size - 8)
    throw WeightsError(path + ": not a safetensors file or truncated (header of " + std::to_string(header_len) +
                       " bytes, file of " + std::to_string(mapping->size) + ")");
  Json header = Parser(std::string_view(base + 8, header_len), path).parse();
  if (header.kind != Json::Object) throw WeightsError(path + ": the header is not a JSON object");
  const char* data = base + 8 + header_len;
  uint64_t data_size = mapping->size - 8 - header_len;
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, entry] : header.object) {
    if (name == "__metadata__" || isPadding(name)) continue;  // Note [Weights are 64-byte aligned]
    std::string what = path + ": tensor '" + name + "'";
    auto field = [&](const char* key, Json::Kind kind) -> const Json& {
      auto it = entry.object.find(key);
      if (entry.kind != Json::Object || it == entry.object.end() || it->second.kind != kind)
        throw WeightsError(what + ": missing or malformed '" + key + "'");
      return it->second;
    };
    const std::string& dtype_name = field("dtype", Json::String).string;
    std::optional<c10::ScalarType> dtype;
    for (const auto& [n, t] : kDtypes)
      if (dtype_name == n) dtype = t;
    if (!dtype) throw WeightsError(what + ": dtype " + dtype_name + " is not supported");
    std::vector<int64_t> shape;
    uint64_t numel = 1;
    for (const Json& d : field("shape", Json::Array).array) {
      if (d.kind != Json::Number || d.number < 0 || (d.number > 0 && numel > (uint64_t{1} << 48) / d.number))
        throw WeightsError(what + ": bad shape");
      shape.push_back(d.number);
      numel *= static_cast<uint64_t>(d.number);
    }
    const auto& offsets = field("data_offsets", Json::Array).array;
    if (offsets.size() != 2 || offsets[0].kind != Json::Number || offsets[1].kind != Json::Number ||
        offsets[0].number < 0 || offsets[1].number < offsets[0].number ||
        static_cast<uint64_t>(offsets[1].number) > data_size)
      throw WeightsError(what + ": data_offsets outside the file (truncated?)");
    uint64_t nbytes = static_cast<uint64_t>(offsets[1].number - offsets[0].number);
    if (nbytes != numel * c10::elementSize(*dtype))
      throw WeightsError(what + ": " + std::to_string(nbytes) + " bytes for " + dtype_name + " of " +
                         std::to_string(numel) + " elements");
    void* ptr = const_cast<char*>(data + offsets[0].number);
    if (reinterpret_cast<uintptr_t>(ptr) % c10::elementSize(*dtype) != 0)
      throw WeightsError(what + ": data is not aligned to its element size");
    at::Tensor t = at::from_blob(ptr, shape, [mapping](void*) {}, at::TensorOptions().dtype(*dtype));
    // Note [Weights are 64-byte aligned]: a tensor off the alignment eager's allocator gives (a file
    // another tool wrote) is copied once, here, into an aligned one, so kernels take eager's path.
    if (reinterpret_cast<uintptr_t>(ptr) % kWeightsAlignment != 0) t = t.clone();
    out.emplace(name, std::move(t));
  }
  return out;
}

namespace {

uint64_t alignUp(uint64_t n) { return (n + kWeightsAlignment - 1) / kWeightsAlignment * kWeightsAlignment; }

}  // namespace

// Note [Weights are 64-byte aligned]: the data section and every tensor start on kWeightsAlignment,
// each gap before a tensor is a padding entry, as graphex.exporting.safetensors_bytes writes them.
void saveSafetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors) {
  std::string header = "{";
  uint64_t end = 0;  // of the data written so far
  int pads = 0;
  std::vector<std::pair<uint64_t, at::Tensor>> blobs;  // data offset, tensor
  auto entry = [&](const std::string& name, const char* dname, const std::string& shape, uint64_t begin,
                   uint64_t nbytes) {
    if (header.size() > 1) header += ",";
    header += "\"" + name + "\":{\"dtype\":\"" + dname + "\",\"shape\":[" + shape + "],\"data_offsets\":[" +
              std::to_string(begin) + "," + std::to_string(begin + nbytes) + "]}";
  };
  for (const auto& [name, t0] : tensors) {
    if (isPadding(name))
      throw WeightsError("cannot save '" + name + "': names starting with " + std::string(kPaddingPrefix) +
                         " are reserved for padding (Note [Weights are 64-byte aligned])");
    at::Tensor t = t0.contiguous().cpu();
    const char* dname = nullptr;
    for (const auto& [n, st] : kDtypes)
      if (st == t.scalar_type()) dname = n;
    if (!dname) throw WeightsError("cannot save " + name + ": dtype " + c10::toString(t.scalar_type()));
    uint64_t nbytes = t.numel() * t.element_size();
    uint64_t begin = alignUp(end);
    if (begin > end)
      entry(std::string(kPaddingPrefix) + std::to_string(pads++), "U8", std::to_string(begin - end), end, begin - end);
    std::string shape;
    for (int64_t i = 0; i < t.dim(); ++i) shape += (i ? "," : "") + std::to_string(t.size(i));
    entry(name, dname, shape, begin, nbytes);
    end = begin + nbytes;
    blobs.emplace_back(begin, t);
  }
  header += "}";
  while ((8 + header.size()) % kWeightsAlignment) header += ' ';
  std::ofstream f(path, std::ios::binary);
  uint64_t n = header.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << header;
  const char zeros[kWeightsAlignment] = {};
  uint64_t written = 0;
  for (const auto& [begin, t] : blobs) {
    f.write(zeros, begin - written);  // the padding entry's bytes, < kWeightsAlignment
    uint64_t nbytes = t.numel() * t.element_size();
    f.write(static_cast<const char*>(t.const_data_ptr()), nbytes);
    written = begin + nbytes;
  }
  if (!f) throw WeightsError("cannot write " + path);
}

}  // namespace graphex::deploy
