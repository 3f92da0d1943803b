#include "program/signature.h"
#include "runtime/executor.h"
#include "program_builder.h"

#include <ATen/ops/add.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/index_copy.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/neg.h>
#include <ATen/ops/sin.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>
#include <torch/library.h>

#include <stdexcept>

using namespace graphex;
using namespace graphex::testing;

namespace {
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
}  // namespace

TEST(Executor, ChainMatchesDirectAtenCallsBitwise) {
  // y = sin(x * w + b)
  std::string spec = program(6, L({tensorInput("x", 0, {8}), tensorInput("w", 1, {8}), tensorInput("b", 2, {8})}),
                       L({op("mul", "aten::mul", "Tensor", L({Slot(0), Slot(1)}), {3}),
                          op("add", "aten::add", "Tensor", L({Slot(3), Slot(2)}), {4}),
                          op("sin", "aten::sin", "default", L({Slot(4)}), {5})}),
                       L({Slot(5)}));
  Executor ex(Program::load(spec));
  at::Tensor x = at::randn({8}), w = at::randn({8}), b = at::randn({8});
  for (int run = 0; run < 3; ++run) {
    auto out = ex.run({x, w, b});
    ASSERT_EQ(out.size(), 1u);
    EXPECT_TRUE(at::equal(out[0].toTensor(), at::sin(at::add(at::mul(x, w), b))));
  }
}

TEST(Executor, InPlaceUpdateWritesTheCallersTensor) {
  // cache.index_copy_(0, pos, val): same storage before and after, no copy.
  std::string spec = program(4, L({tensorInput("cache", 0, {4, 2}), tensorInput("pos", 1, {1}, c10::kLong),
                             tensorInput("val", 2, {1, 2})}),
                       L({op("upd", "aten::index_copy_", "default", L({Slot(0), I(0), Slot(1), Slot(2)}), {3})}),
                       NoOutputs());
  Executor ex(Program::load(spec));
  at::Tensor cache = at::zeros({4, 2});
  const void* ptr = cache.const_data_ptr();
  at::Tensor val = at::randn({1, 2});
  auto out = ex.run({cache, at::tensor({int64_t{2}}), val});
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(cache.const_data_ptr(), ptr);
  EXPECT_TRUE(at::equal(cache[2], val[0]));
}

TEST(Executor, TensorListsAndGetItem) {
  // parts = split(x, 2); y = cat([parts[1], parts[0]])
  std::string spec = program(5, L({tensorInput("x", 0, {4})}),
                       L({op("split", "aten::split", "Tensor", L({Slot(0), I(2)}), {1}),
                          builtin("getitem", "p0", L({Slot(1), I(0)}), 2),
                          builtin("getitem", "p1", L({Slot(1), I(1)}), 3),
                          op("cat", "aten::cat", "default", L({L({Slot(3), Slot(2)})}), {4})}),
                       L({Slot(4)}));
  Executor ex(Program::load(spec));
  at::Tensor x = at::randn({4});
  auto out = ex.run({x});
  EXPECT_TRUE(at::equal(out[0].toTensor(), at::cat({x.slice(0, 2, 4), x.slice(0, 0, 2)})));
}

TEST(Executor, SymbolicSizesAreComputedPerCall) {
  // n = sym_size(x, 0); m = n * 2; y = x.view([m // 2, -1])... here: new_zeros([m])
  std::string spec = program(4, L({scalarInput("s0", 0, "int"), tensorInput("x", 1, {3})}),
                       L({builtin("sym", "m", L({Slot(0), I(2)}), 2, "Mul"),
                          op("zeros", "aten::new_zeros", "default", L({Slot(1), L({Slot(2)})}), {3})}),
                       L({Slot(3), Slot(2)}));
  Executor ex(Program::load(spec));
  auto out = ex.run({int64_t{5}, at::randn({3})});
  EXPECT_EQ(out[0].toTensor().size(0), 10);
  EXPECT_EQ(out[1].toInt(), 10);
}

TEST(Executor, OutputsAreFreshEachCall) {
  std::string spec = program(2, L({tensorInput("x", 0, {4})}),
                       L({op("neg", "aten::neg", "default", L({Slot(0)}), {1})}), L({Slot(1)}));
  Executor ex(Program::load(spec));
  at::Tensor a = at::randn({4});
  at::Tensor first = ex.run({a})[0].toTensor();
  at::Tensor keep = first.clone();
  at::Tensor second = ex.run({at::randn({4})})[0].toTensor();
  EXPECT_NE(first.const_data_ptr(), second.const_data_ptr());
  EXPECT_TRUE(at::equal(first, keep));
}

TEST(Executor, SignatureMismatchNamesTheInputAndBothSides) {
  std::string spec = program(2, L({tensorInput("x", 0, {4})}),
                       L({op("neg", "aten::neg", "default", L({Slot(0)}), {1})}), L({Slot(1)}));
  Executor ex(Program::load(spec));
  try {
    (void)ex.run({at::randn({5})});
    FAIL();
  } catch (const SignatureError& e) {
    std::string msg = e.what();
    EXPECT_TRUE(contains(msg, "'x'")) << msg;
    EXPECT_TRUE(contains(msg, "float32[4]")) << msg;
    EXPECT_TRUE(contains(msg, "float32[5]")) << msg;
  }
  EXPECT_THROW((void)ex.run({at::randn({4}).to(at::kDouble)}), SignatureError);
  EXPECT_THROW((void)ex.run({at::randn({8}).slice(0, 0, 8, 2)}), SignatureError);  // stride 2
  EXPECT_THROW((void)ex.run({}), SignatureError);
}

TEST(Executor, FailingOperatorNamesNodeAndSourceLine) {
  std::string spec = program(3, L({tensorInput("a", 0, {2, 3}), tensorInput("b", 1, {2, 3})}),
                       L({op("mm_1", "aten::mm", "default", L({Slot(0), Slot(1)}), {2}, D({}),
                             "model.py:7 in forward: a @ b")}),
                       L({Slot(2)}));
  Executor ex(Program::load(spec));
  try {
    (void)ex.run({at::randn({2, 3}), at::randn({2, 3})});
    FAIL();
  } catch (const ExecutionError& e) {
    std::string msg = e.what();
    EXPECT_TRUE(contains(msg, "'mm_1'")) << msg;
    EXPECT_TRUE(contains(msg, "aten::mm")) << msg;
    EXPECT_TRUE(contains(msg, "model.py:7")) << msg;
    EXPECT_TRUE(contains(msg, "cannot be multiplied")) << msg;
    EXPECT_EQ(e.kind, KernelErrorKind::Runtime);
    EXPECT_EQ(e.graph, "test_graph");
    EXPECT_EQ(e.node, "mm_1");
    EXPECT_EQ(e.op, "aten::mm.default");
    EXPECT_EQ(e.source, "model.py:7 in forward: a @ b");
  }
}

// Note [A replay error keeps its cause]: the kernel's message exactly as eager shows it, its
// c10 class as a kind, and the exception itself.
TEST(Executor, FailingOperatorKeepsTheKernelsMessageKindAndException) {
  std::string spec = program(3, L({tensorInput("x", 0, {4}), tensorInput("idx", 1, {2}, c10::kLong)}),
                       L({op("sel", "aten::index_select", "default", L({Slot(0), I(0), Slot(1)}), {2})}),
                       L({Slot(2)}));
  Executor ex(Program::load(spec));
  at::Tensor x = at::randn({4}), idx = at::tensor({int64_t{0}, int64_t{9}});
  std::string eager;
  try {
    (void)at::index_select(x, 0, idx);
  } catch (const c10::IndexError& e) {
    eager = e.what_without_backtrace();
  }
  ASSERT_FALSE(eager.empty());
  try {
    (void)ex.run({x, idx});
    FAIL();
  } catch (const ExecutionError& e) {
    EXPECT_EQ(e.kind, KernelErrorKind::Index);
    EXPECT_EQ(e.kernel_message, eager);
    EXPECT_TRUE(contains(e.what(), eager)) << e.what();
    EXPECT_FALSE(contains(e.what(), "Exception raised from")) << e.what();  // no C++ backtrace
    ASSERT_TRUE(e.cause);
    EXPECT_THROW(std::rethrow_exception(e.cause), c10::IndexError);
  }
}

namespace {
at::Tensor failingKernel(const at::Tensor&) { throw std::invalid_argument("not a c10 error"); }
}  // namespace

TORCH_LIBRARY_FRAGMENT(graphex_cpp_test, m) { m.def("fail(Tensor x) -> Tensor"); }
TORCH_LIBRARY_IMPL(graphex_cpp_test, CPU, m) { m.impl("fail", &failingKernel); }

TEST(Executor, ForeignKernelErrorIsKeptAsTheCause) {
  std::string spec = program(2, L({tensorInput("x", 0, {4})}),
                       L({op("f", "graphex_cpp_test::fail", "default", L({Slot(0)}), {1})}), L({Slot(1)}));
  Executor ex(Program::load(spec));
  try {
    (void)ex.run({at::randn({4})});
    FAIL();
  } catch (const ExecutionError& e) {
    EXPECT_EQ(e.kind, KernelErrorKind::Foreign);
    EXPECT_EQ(e.kernel_message, "not a c10 error");
    EXPECT_THROW(std::rethrow_exception(e.cause), std::invalid_argument);
  }
}

TEST(Executor, ValidatingRunComparesOutputsWithTheFakesPromise) {
  // A node whose recorded promise (expect) says float32[4]; the real op returns float32[3].
  fb::NodeT node = withExpect(op("sum", "aten::sum", "dim_IntList", L({Slot(0), L({I(1)})}), {1}),
                              {tensorMeta({4}, c10::kFloat, /*with_strides=*/false)});
  std::string spec = program(2, L({tensorInput("x", 0, {3, 4})}), L({node}), L({Slot(1)}));
  Executor ex(Program::load(spec));
  at::Tensor x = at::randn({3, 4});
  EXPECT_NO_THROW((void)ex.run({x}));  // the plain run does not check
  try {
    (void)ex.runValidated({x});
    FAIL();
  } catch (const FakeMismatchError& e) {
    EXPECT_EQ(e.output, 0u);
    EXPECT_EQ(e.expected, "float32[4] on cpu");
    EXPECT_EQ(e.actual, "float32[3] on cpu");
  }
}

TEST(Executor, TimedRunReportsEveryInstruction) {
  std::string spec = program(3, L({tensorInput("x", 0, {4})}),
                       L({op("a", "aten::neg", "default", L({Slot(0)}), {1}),
                          op("b", "aten::sin", "default", L({Slot(1)}), {2})}),
                       L({Slot(2)}));
  Executor ex(Program::load(spec));
  std::vector<int64_t> ns;
  at::Tensor x = at::randn({4});
  auto out = ex.runTimed({x}, ns);
  ASSERT_EQ(ns.size(), 2u);
  EXPECT_GT(ns[0], 0);
  EXPECT_TRUE(at::equal(out[0].toTensor(), at::sin(at::neg(x))));
  EXPECT_EQ(ex.runCount(), 1u);
}

// Note [A program's tensor inputs are separate tensors]: the first two inputs that are one tensor, by identity; a view of a tensor
// is another tensor (overlapping views are not what this check is for).
TEST(Signature, RepeatedTensorNamesTheFirstTwoInputsThatAreOneTensor) {
  at::Tensor a = at::zeros({2}), b = at::zeros({2});
  std::vector<c10::IValue> repeated{a, c10::IValue(3), b, a, b};
  EXPECT_EQ(graphex::repeatedTensor(repeated), (std::pair<int64_t, int64_t>{0, 3}));
  std::vector<c10::IValue> separate{a, b, a.view({2}), c10::IValue(), c10::IValue(1.5)};
  EXPECT_EQ(graphex::repeatedTensor(separate).first, -1);
  EXPECT_EQ(graphex::repeatedTensor({}).first, -1);
}
