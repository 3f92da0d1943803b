#include "program/format.h"

#include <ATen/ops/empty.h>
#include <flatbuffers/flatbuffers.h>

#include <cstring>

namespace graphex::format {

namespace {

// fb::DType, in order, as c10 scalar types (Note [graphex owns its enums on disk]).
constexpr c10::ScalarType kScalarTypes[] = {
    c10::ScalarType::Bool,         c10::ScalarType::Byte,          c10::ScalarType::Char,
    c10::ScalarType::Short,        c10::ScalarType::Int,           c10::ScalarType::Long,
    c10::ScalarType::Half,         c10::ScalarType::BFloat16,      c10::ScalarType::Float,
    c10::ScalarType::Double,       c10::ScalarType::ComplexHalf,   c10::ScalarType::ComplexFloat,
    c10::ScalarType::ComplexDouble, c10::ScalarType::Float8_e4m3fn, c10::ScalarType::Float8_e5m2,
    c10::ScalarType::Float8_e4m3fnuz, c10::ScalarType::Float8_e5m2fnuz, c10::ScalarType::UInt16,
    c10::ScalarType::UInt32,       c10::ScalarType::UInt64,
};
static_assert(sizeof(kScalarTypes) / sizeof(kScalarTypes[0]) == static_cast<size_t>(fb::DType::MAX) + 1,
              "every fb::DType maps to a c10::ScalarType");

constexpr c10::DeviceType kDeviceTypes[] = {
    c10::DeviceType::CPU, c10::DeviceType::CUDA, c10::DeviceType::Meta, c10::DeviceType::XPU,
    c10::DeviceType::MPS, c10::DeviceType::HPU,  c10::DeviceType::PrivateUse1,
};
static_assert(sizeof(kDeviceTypes) / sizeof(kDeviceTypes[0]) == static_cast<size_t>(fb::DeviceType::MAX) + 1);

constexpr c10::Layout kLayouts[] = {
    c10::kStrided, c10::kSparse, c10::kSparseCsr, c10::kMkldnn, c10::kSparseCsc, c10::kSparseBsr,
    c10::kSparseBsc, c10::kJagged,
};
static_assert(sizeof(kLayouts) / sizeof(kLayouts[0]) == static_cast<size_t>(fb::Layout::MAX) + 1);

constexpr c10::MemoryFormat kMemoryFormats[] = {
    c10::MemoryFormat::Contiguous, c10::MemoryFormat::Preserve, c10::MemoryFormat::ChannelsLast,
    c10::MemoryFormat::ChannelsLast3d,
};
static_assert(sizeof(kMemoryFormats) / sizeof(kMemoryFormats[0]) == static_cast<size_t>(fb::MemoryFormat::MAX) + 1);

template <typename E, typename T, size_t N>
const T& lookup(const T (&table)[N], E e, const char* what) {
  auto i = static_cast<int64_t>(e);
  if (i < 0 || i >= static_cast<int64_t>(N))
    throw FormatError(std::string("graphex program: unknown ") + what + " code " + std::to_string(i) +
                      " (written by a newer graphex?)");
  return table[i];
}

}  // namespace

const fb::Program& verify(std::string_view bytes) {
  // Layout: u32 size of what follows, then the FlatBuffer (root offset, "GXPG", tables).
  constexpr size_t kPrefix = sizeof(flatbuffers::uoffset_t);
  if (bytes.size() < kPrefix + 8 || !fb::SizePrefixedProgramBufferHasIdentifier(bytes.data()))
    throw FormatError("not a graphex program: the file identifier is not \"GXPG\" (" + std::to_string(bytes.size()) +
                      " bytes; a cache entry, a .pt file or another format?)");
  uint64_t declared = flatbuffers::ReadScalar<flatbuffers::uoffset_t>(bytes.data()) + uint64_t{kPrefix};
  if (declared != bytes.size())
    throw FormatError("graphex program is truncated or has trailing bytes: it declares " + std::to_string(declared) +
                      " bytes, the file has " + std::to_string(bytes.size()) +
                      "; rebuild it (graphex.export, or delete the cache entry)");
  // FlatBuffers offsets are 32-bit: a buffer past 2 GiB cannot be a valid program.
  if (bytes.size() >= FLATBUFFERS_MAX_BUFFER_SIZE)
    throw FormatError("graphex program: " + std::to_string(bytes.size()) + " bytes is larger than the format allows");
  flatbuffers::Verifier verifier(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                                 /*max_depth=*/128, /*max_tables=*/1u << 24);
  if (!fb::VerifySizePrefixedProgramBuffer(verifier))
    throw FormatError("graphex program is corrupt (" + std::to_string(bytes.size()) +
                      " bytes fail the FlatBuffers verifier); rebuild it (graphex.export, or delete the cache entry)");
  const fb::Program& p = *fb::GetSizePrefixedProgram(bytes.data());
  if (p.format_version() < kOldestReadableVersion || p.format_version() > kFormatVersion)
    throw FormatError("graphex program has format version " + std::to_string(p.format_version()) +
                      "; this build reads versions " + std::to_string(kOldestReadableVersion) + " to " +
                      std::to_string(kFormatVersion) + ". Export it again with this graphex");
  return p;
}

c10::ScalarType toScalarType(fb::DType dtype) { return lookup(kScalarTypes, dtype, "dtype"); }

fb::DType fromScalarType(c10::ScalarType dtype) {
  for (size_t i = 0; i < sizeof(kScalarTypes) / sizeof(kScalarTypes[0]); ++i)
    if (kScalarTypes[i] == dtype) return static_cast<fb::DType>(i);
  throw FormatError(std::string("graphex programs cannot hold dtype ") + c10::toString(dtype));
}

c10::Device toDevice(const fb::Device* device) {
  if (device == nullptr) return c10::Device(c10::DeviceType::CPU);
  c10::DeviceType type = lookup(kDeviceTypes, device->type(), "device type");
  if (device->index() < -1) throw FormatError("graphex program: negative device index");
  return c10::Device(type, static_cast<c10::DeviceIndex>(device->index()));
}

c10::Layout toLayout(fb::Layout layout) { return lookup(kLayouts, layout, "layout"); }
c10::MemoryFormat toMemoryFormat(fb::MemoryFormat format) { return lookup(kMemoryFormats, format, "memory format"); }

at::Tensor toTensor(const fb::Tensor& t, const std::string& what) {
  c10::ScalarType dtype = toScalarType(t.dtype());
  std::vector<int64_t> sizes;
  uint64_t numel = 1;
  if (t.sizes()) {
    if (t.sizes()->size() > 64) throw FormatError(what + ": rank " + std::to_string(t.sizes()->size()) + " too large");
    for (int64_t s : *t.sizes()) {
      if (s < 0 || (s > 0 && numel > (uint64_t{1} << 48) / static_cast<uint64_t>(s)))
        throw FormatError(what + ": size " + std::to_string(s) + " out of range");
      numel *= static_cast<uint64_t>(s);
      sizes.push_back(s);
    }
  }
  uint64_t nbytes = numel * c10::elementSize(dtype);
  uint64_t have = t.data() ? t.data()->size() : 0;
  if (have != nbytes)
    throw FormatError(what + ": " + std::to_string(have) + " data bytes for a " + c10::toString(dtype) + " tensor of " +
                      std::to_string(numel) + " elements");
  at::Tensor out = at::empty(sizes, at::TensorOptions().dtype(dtype));
  if (nbytes) std::memcpy(out.mutable_data_ptr(), t.data()->data(), nbytes);
  return out;
}

}  // namespace graphex::format
