// graphex::Module (C++, no Python) on artifacts Python wrote: tests/cpp/make_artifacts.py runs first
// (a ctest fixture) and leaves, per case, the exported directory, the inputs and eager's result;
// the C++ result must equal eager's bit for bit.
#include "deploy/module.h"
#include "deploy/safetensors.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace {

std::string artifacts() {
  const char* dir = std::getenv("GRAPHEX_TEST_ARTIFACTS");
  return dir ? dir : "";
}

void expectEagerResult(const std::string& name) {
  const std::string dir = artifacts();
  if (dir.empty()) GTEST_SKIP() << "GRAPHEX_TEST_ARTIFACTS is unset: run through ctest (it writes the artifacts first)";
  graphex::Module module = graphex::Module::load(dir + "/" + name);
  auto named = graphex::deploy::loadSafetensors(dir + "/" + name + ".inputs.safetensors");
  ASSERT_EQ(named.size(), module.numArguments());
  std::vector<c10::IValue> args;
  for (size_t i = 0; i < named.size(); ++i) args.emplace_back(named.at(std::to_string(i)).clone());
  std::vector<c10::IValue> result = module.run(args);
  auto expected = graphex::deploy::loadSafetensors(dir + "/" + name + ".expected.safetensors");
  ASSERT_EQ(result.size(), expected.size());
  for (size_t i = 0; i < result.size(); ++i) {
    ASSERT_TRUE(result[i].isTensor()) << "leaf " << i;
    const at::Tensor& want = expected.at(std::to_string(i));
    const at::Tensor got = result[i].toTensor();
    EXPECT_EQ(got.sizes(), want.sizes()) << "leaf " << i;
    EXPECT_EQ(got.scalar_type(), want.scalar_type()) << "leaf " << i;
    EXPECT_TRUE(at::equal(got, want)) << "leaf " << i << " differs from eager";
  }
  // A second run on the same module gives the same bits (per-run state is not carried over).
  std::vector<c10::IValue> again = module.run(args);
  for (size_t i = 0; i < again.size(); ++i) EXPECT_TRUE(at::equal(again[i].toTensor(), result[i].toTensor()));
}

TEST(DeployFromPython, StaticArtifactMatchesEagerBitwise) { expectEagerResult("static"); }

TEST(DeployFromPython, DynamicArtifactRunsOtherSizesBitwise) { expectEagerResult("dynamic"); }

}  // namespace
