#include "plan/describe.h"
#include "program/program.h"
#include "program_builder.h"

#include <gtest/gtest.h>

using namespace graphex;
using namespace graphex::testing;

namespace {

std::string errorOf(const std::string& spec) {
  try {
    Program::load(spec);
  } catch (const ProgramError& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(Program, ResolvesOperatorsAndFillsDefaults) {
  // %2 = add(%0, %1)  (alpha defaults to 1);  %3 = sum(%2, [0])
  std::string spec = program(4, L({tensorInput("x", 0, {2, 3}), tensorInput("y", 1, {2, 3})}),
                       L({op("add", "aten::add", "Tensor", L({Slot(0), Slot(1)}), {2}),
                          op("sum", "aten::sum", "dim_IntList", L({Slot(2), L({I(0)})}), {3})}),
                       L({Slot(3)}));
  Program p = Program::load(spec);
  ASSERT_EQ(p.instructions.size(), 2u);
  EXPECT_EQ(p.instructions[0].args.size(), 3u);  // self, other, alpha
  EXPECT_TRUE(p.instructions[0].args[2].constant.isInt());
  EXPECT_EQ(p.numOps(), 2u);
}

TEST(Program, ConvertsConstantsToTheSchemaType) {
  // mul.Tensor's other is a Tensor; div.Scalar's other is a Scalar; clamp takes Scalar?.
  std::string spec = program(3, L({tensorInput("x", 0, {4})}),
                       L({op("div", "aten::div", "Scalar", L({Slot(0), I(2)}), {1}),
                          op("clamp", "aten::clamp", "default", L({Slot(1)}), {2}, D({{"min", F(0.5)}}))}),
                       L({Slot(2)}));
  Program p = Program::load(spec);
  EXPECT_TRUE(p.instructions[0].args[1].constant.isInt());
  EXPECT_TRUE(p.instructions[1].args[1].constant.isDouble());
  EXPECT_TRUE(p.instructions[1].args[2].constant.isNone());
}

TEST(Program, UnknownOperatorNamesTheNodeAndTheFix) {
  std::string spec = program(2, L({tensorInput("x", 0, {4})}),
                       L({op("mystery", "nosuchlib::mystery", "default", L({Slot(0)}), {1}, D({}),
                             "model.py:12 in forward")}),
                       L({Slot(1)}));
  std::string msg = errorOf(spec);
  EXPECT_TRUE(contains(msg, "nosuchlib::mystery")) << msg;
  EXPECT_TRUE(contains(msg, "'mystery'")) << msg;
  EXPECT_TRUE(contains(msg, "model.py:12")) << msg;
  EXPECT_TRUE(contains(msg, "load_library")) << msg;
}

TEST(Program, ArgumentOfTheWrongKindIsNamed) {
  std::string spec = program(2, L({tensorInput("x", 0, {4})}),
                       L({op("sum", "aten::sum", "dim_IntList", L({Slot(0), S("zero")}), {1})}), L({Slot(1)}));
  std::string msg = errorOf(spec);
  EXPECT_TRUE(contains(msg, "argument 'dim'")) << msg;
  EXPECT_TRUE(contains(msg, "'zero'")) << msg;
}

TEST(Program, MissingRequiredArgumentIsNamed) {
  std::string spec = program(2, L({tensorInput("x", 0, {4})}),
                       L({op("add", "aten::add", "Tensor", L({Slot(0)}), {1})}), L({Slot(1)}));
  EXPECT_TRUE(contains(errorOf(spec), "argument 'other'"));
}

TEST(Program, ReadBeforeWriteIsRejected) {
  std::string spec = program(3, L({tensorInput("x", 0, {4})}),
                       L({op("add", "aten::add", "Tensor", L({Slot(0), Slot(2)}), {1})}), L({Slot(1)}));
  EXPECT_TRUE(contains(errorOf(spec), "before anything writes it"));
}

TEST(Program, DoubleWriteIsRejected) {
  std::string spec = program(2, L({tensorInput("x", 0, {4})}),
                       L({op("neg", "aten::neg", "default", L({Slot(0)}), {1}),
                          op("neg2", "aten::neg", "default", L({Slot(0)}), {1})}),
                       L({Slot(1)}));
  EXPECT_TRUE(contains(errorOf(spec), "twice"));
}

TEST(Liveness, LastReadMovesAndUnreadValuesAreDropped) {
  // %1 = neg(%0); %2 = neg(%1) [unused]; %3 = mul(%1, %1); return %3
  std::string spec = program(4, L({tensorInput("x", 0, {4})}),
                       L({op("a", "aten::neg", "default", L({Slot(0)}), {1}),
                          op("b", "aten::neg", "default", L({Slot(1)}), {2}),
                          op("c", "aten::mul", "Tensor", L({Slot(1), Slot(1)}), {3})}),
                       L({Slot(3)}));
  Program p = Program::load(spec);
  EXPECT_TRUE(p.instructions[0].args[0].move);   // x read once, last time
  EXPECT_FALSE(p.instructions[1].args[0].move);  // %1 read again later
  EXPECT_EQ(p.instructions[1].outs[0], -1);      // %2 never read: dropped at once
  EXPECT_FALSE(p.instructions[2].args[0].move);  // read twice in one instruction: no move ...
  ASSERT_EQ(p.instructions[2].frees.size(), 1u);  // ... freed after instead
  EXPECT_EQ(p.instructions[2].frees[0], 1);
  EXPECT_FALSE(describeProgram(p).empty());
}

TEST(Liveness, UnreadInputIsNotBound) {
  std::string spec = program(3, L({tensorInput("x", 0, {4}), tensorInput("unused", 1, {4})}),
                       L({op("a", "aten::neg", "default", L({Slot(0)}), {2})}), L({Slot(2)}));
  Program p = Program::load(spec);
  EXPECT_EQ(p.input_slots[0], 0);
  EXPECT_EQ(p.input_slots[1], -1);
}
