#include "spec_builder.h"

#include <ATen/ops/allclose.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <gtest/gtest.h>

#include <random>

using namespace graphex;
using namespace graphex::testing;

namespace {

Value sample() {
  return D({{"ints", L({I(0), I(-7), I(int64_t{1} << 40)})},
            {"float", F(-2.5)},
            {"text", S("aten::add")},
            {"flags", L({B(true), B(false), None()})},
            {"refs", L({Slot(3), Const(1)})},
            {"nested", D({{"deep", L({L({L({I(1)})})})}})},
            {"tensor", Value::tensor(at::arange(6, at::kFloat).reshape({2, 3}))}});
}

}  // namespace

TEST(Spec, RoundTripPreservesEveryKind) {
  std::string bytes = spec::encode(sample());
  Value back = spec::decode(bytes);
  EXPECT_EQ(spec::encode(back), bytes);
  EXPECT_EQ(back.at("ints").toList()[2].toInt(), int64_t{1} << 40);
  EXPECT_DOUBLE_EQ(back.at("float").toFloat(), -2.5);
  EXPECT_EQ(back.at("refs").toList()[0].toSlot(), 3u);
  EXPECT_EQ(back.at("refs").toList()[1].toConst(), 1u);
  EXPECT_TRUE(at::equal(back.at("tensor").toTensor(), at::arange(6, at::kFloat).reshape({2, 3})));
}

TEST(Spec, EveryTruncationIsAnErrorNotACrash) {
  std::string bytes = spec::encode(sample());
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_THROW(spec::decode(std::string_view(bytes.data(), n)), spec::SpecError) << "prefix of " << n << " bytes";
  }
}

TEST(Spec, RandomCorruptionIsAnErrorOrAValidTree) {
  std::string bytes = spec::encode(sample());
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string bad = bytes;
    int flips = 1 + trial % 4;
    for (int f = 0; f < flips; ++f) bad[rng() % bad.size()] = static_cast<char>(rng());
    try {
      Value v = spec::decode(bad);
      (void)spec::toText(v);  // whatever decodes must be a well-formed tree
    } catch (const spec::SpecError&) {
    }
  }
}

TEST(Spec, ForeignAndFutureFilesAreRejectedWithAReason) {
  try {
    spec::decode("not a graphex file at all");
    FAIL();
  } catch (const spec::SpecError& e) {
    EXPECT_NE(std::string(e.what()).find("magic"), std::string::npos);
  }
  std::string bytes = spec::encode(I(1));
  bytes[8] = static_cast<char>(spec::kFormatVersion + 1);
  try {
    spec::decode(bytes);
    FAIL();
  } catch (const spec::SpecError& e) {
    EXPECT_NE(std::string(e.what()).find("format version"), std::string::npos);
  }
}

TEST(Spec, TrailingBytesAreRejected) {
  std::string bytes = spec::encode(I(1)) + "x";
  EXPECT_THROW(spec::decode(bytes), spec::SpecError);
}

TEST(Spec, AccessorsNameWhatWasExpected) {
  try {
    (void)I(3).toStr();
    FAIL();
  } catch (const spec::SpecError& e) {
    EXPECT_NE(std::string(e.what()).find("expected str, found int"), std::string::npos);
  }
  try {
    (void)D({}).at("nodes");
    FAIL();
  } catch (const spec::SpecError& e) {
    EXPECT_NE(std::string(e.what()).find("'nodes'"), std::string::npos);
  }
}
