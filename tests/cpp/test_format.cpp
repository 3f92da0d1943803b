// Note [One typed format]: the verifier rejects what is not a graphex program this build reads,
// with a reason, before anything is built or run.
#include "program/format.h"
#include "program/program.h"
#include "runtime/executor.h"
#include "program_builder.h"

#include <ATen/ops/add.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include <random>

using namespace graphex;
using namespace graphex::testing;

namespace {

std::string sample() {
  // %2 = add(%0, %1, alpha=2); %3 = sum(%2, [0], keepdim=True); return %3, 1.5
  return program(4, L({tensorInput("x", 0, {2, 3}), tensorInput("y", 1, {2, 3})}),
                 L({op("add", "aten::add", "Tensor", L({Slot(0), Slot(1)}), {2}, D({{"alpha", I(2)}})),
                    op("sum", "aten::sum", "dim_IntList", L({Slot(2), L({I(0)}), B(true)}), {3})}),
                 L({Slot(3), F(1.5)}));
}

std::string errorOf(std::string_view bytes) {
  try {
    format::verify(bytes);
  } catch (const format::FormatError& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(Format, AVerifiedProgramBuildsAndRuns) {
  std::string bytes = sample();
  EXPECT_EQ(errorOf(bytes), "");
  Executor ex(Program::load(bytes));
  at::Tensor x = at::randn({2, 3}), y = at::randn({2, 3});
  auto out = ex.run({x, y});
  EXPECT_TRUE(at::equal(out[0].toTensor(), at::add(x, y, 2).sum({0}, true)));
  EXPECT_EQ(out[1].toDouble(), 1.5);
}

TEST(Format, EveryTruncationIsAnErrorNotACrash) {
  std::string bytes = sample();
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::string prefix = bytes.substr(0, n);  // its own allocation: a read past it is caught by ASan
    EXPECT_THROW(format::verify(prefix), format::FormatError) << "prefix of " << n << " bytes";
  }
}

TEST(Format, RandomCorruptionIsAnErrorOrAProgramError) {
  std::string bytes = sample();
  std::mt19937 rng(1234);
  int rejected = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string bad = bytes;
    int flips = 1 + trial % 4;
    for (int f = 0; f < flips; ++f) bad[rng() % bad.size()] = static_cast<char>(rng());
    try {
      Program::load(bad);  // whatever verifies must build, or fail with a ProgramError
    } catch (const format::FormatError&) {
      ++rejected;
    } catch (const ProgramError&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 0);
}

TEST(Format, ForeignBytesAreRejectedByIdentifier) {
  EXPECT_TRUE(contains(errorOf(""), "not a graphex program"));
  EXPECT_TRUE(contains(errorOf("not a graphex file at all"), "not a graphex program"));
  EXPECT_TRUE(contains(errorOf(std::string("PK\x03\x04 a zip, as torch.save writes", 33)), "not a graphex program"));
  std::string bytes = sample();
  bytes[9] = 'Z';  // identifier is bytes 8..11, after the size and the root offset
  EXPECT_TRUE(contains(errorOf(bytes), "file identifier"));
}

TEST(Format, CorruptOffsetsFailTheVerifier) {
  std::string bytes = sample();
  bytes[4] = static_cast<char>(0xff);  // root offset far past the end
  bytes[5] = static_cast<char>(0xff);
  EXPECT_TRUE(contains(errorOf(bytes), "corrupt")) << errorOf(bytes);
  EXPECT_TRUE(contains(errorOf(bytes.substr(0, bytes.size() - 1)), "truncated"));
  EXPECT_TRUE(contains(errorOf(bytes + "x"), "trailing bytes"));
}

TEST(Format, AnotherFormatVersionIsRejectedWithTheFix) {
  flatbuffers::FlatBufferBuilder b;
  fb::FinishSizePrefixedProgramBuffer(b, fb::CreateProgram(b, format::kFormatVersion + 1, b.CreateString("future")));
  std::string bytes(reinterpret_cast<const char*>(b.GetBufferPointer()), b.GetSize());
  std::string msg = errorOf(bytes);
  EXPECT_TRUE(contains(msg, "format version " + std::to_string(format::kFormatVersion + 1))) << msg;
  EXPECT_TRUE(contains(msg, "Export it again")) << msg;
  EXPECT_THROW(Program::load(bytes), format::FormatError);
}

TEST(Format, EnumsAreGraphexOwnAndUnknownCodesAreRejected) {
  EXPECT_EQ(format::toScalarType(fb::DType::Float32), c10::kFloat);
  EXPECT_EQ(format::toScalarType(fb::DType::BFloat16), c10::kBFloat16);
  EXPECT_EQ(format::fromScalarType(c10::kLong), fb::DType::Int64);
  for (int code = 0; code <= static_cast<int>(fb::DType::MAX); ++code)
    EXPECT_EQ(format::fromScalarType(format::toScalarType(static_cast<fb::DType>(code))), static_cast<fb::DType>(code));
  EXPECT_THROW(format::toScalarType(static_cast<fb::DType>(100)), format::FormatError);
  fb::Device cuda1(fb::DeviceType::CUDA, 1);
  EXPECT_EQ(format::toDevice(&cuda1), c10::Device(c10::DeviceType::CUDA, 1));
  EXPECT_EQ(format::toLayout(fb::Layout::Strided), c10::kStrided);
  EXPECT_EQ(format::toMemoryFormat(fb::MemoryFormat::ChannelsLast), c10::MemoryFormat::ChannelsLast);
}

TEST(Format, ConstantWithTheWrongByteCountIsNamed) {
  flatbuffers::FlatBufferBuilder b;
  std::vector<int64_t> sizes{2, 2};
  std::vector<uint8_t> data(12);  // float32[2, 2] needs 16
  auto t = fb::CreateTensor(b, fb::DType::Float32, b.CreateVector(sizes), b.CreateVector(data));
  std::vector<flatbuffers::Offset<fb::Tensor>> consts{t};
  fb::FinishSizePrefixedProgramBuffer(b, fb::CreateProgram(b, format::kFormatVersion, b.CreateString("c"), 0, 0, 0, 0, 1,
                                               b.CreateVector(consts)));
  try {
    Program::load(std::string(reinterpret_cast<const char*>(b.GetBufferPointer()), b.GetSize()));
    FAIL();
  } catch (const ProgramError& e) {
    EXPECT_TRUE(contains(e.what(), "constant 0: 12 data bytes")) << e.what();
  }
}

TEST(Format, AnArgumentOfAKindThisBuildDoesNotKnowIsNamed) {
  // The verifier checks offsets, not enum ranges: a newer writer's argument kind reaches the builder,
  // which names it instead of reading it as something else.
  fb::ArgT future = I(1);
  future.kind = static_cast<fb::ArgKind>(99);
  fb::ProgramT p = programT(2, L({tensorInput("x", 0, {4})}),
                            L({op("add", "aten::add", "Tensor", L({Slot(0), future}), {1})}), L({Slot(1)}));
  try {
    Program::load(pack(p));
    FAIL();
  } catch (const ProgramError& e) {
    EXPECT_TRUE(contains(e.what(), "argument 'other'")) << e.what();
    EXPECT_TRUE(contains(e.what(), "<argument kind 99>")) << e.what();
  }
}

TEST(Format, DevicesAndDtypesAreReadAsGraphexsEnumsNotParsed) {
  // %1 = x.to(device=cpu, dtype=float64): a Device table and a DType, converted without a string.
  fb::ArgT device = arg(fb::ArgKind::Device);
  device.device = std::make_unique<fb::Device>(fb::DeviceType::CPU, -1);
  fb::ArgT dtype = arg(fb::ArgKind::DType);
  dtype.dtype = fb::DType::Float64;
  std::string bytes = program(2, L({tensorInput("x", 0, {3})}),
                              L({op("to", "aten::to", "device", L({Slot(0), device, dtype}), {1})}), L({Slot(1)}));
  Executor ex(Program::load(bytes));
  at::Tensor x = at::randn({3});
  auto out = ex.run({x});
  EXPECT_EQ(out[0].toTensor().scalar_type(), c10::kDouble);
  EXPECT_TRUE(at::equal(out[0].toTensor(), x.to(c10::kDouble)));
}
