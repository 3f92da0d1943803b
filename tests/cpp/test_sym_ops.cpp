#include "runtime/sym_ops.h"

#include <gtest/gtest.h>

using namespace graphex;

namespace {
c10::IValue apply(SymFn fn, c10::IValue a, c10::IValue b) {
  c10::IValue args[2] = {std::move(a), std::move(b)};
  return applySymFn(fn, args, 2);
}
c10::IValue apply1(SymFn fn, c10::IValue a) { return applySymFn(fn, &a, 1); }
}  // namespace

TEST(SymOps, IntegerDivisionAndModuloFollowPython) {
  EXPECT_EQ(apply(SymFn::FloorDiv, 7, 2).toInt(), 3);
  EXPECT_EQ(apply(SymFn::FloorDiv, -7, 2).toInt(), -4);
  EXPECT_EQ(apply(SymFn::FloorDiv, 7, -2).toInt(), -4);
  EXPECT_EQ(apply(SymFn::Mod, -7, 3).toInt(), 2);
  EXPECT_EQ(apply(SymFn::Mod, 7, -3).toInt(), -2);
  EXPECT_DOUBLE_EQ(apply(SymFn::Mod, -7.5, 2.0).toDouble(), 0.5);
  EXPECT_DOUBLE_EQ(apply(SymFn::TrueDiv, 7, 2).toDouble(), 3.5);
}

TEST(SymOps, TypesPromoteLikePython) {
  EXPECT_TRUE(apply(SymFn::Add, 2, 3).isInt());
  EXPECT_TRUE(apply(SymFn::Add, 2, 3.0).isDouble());
  EXPECT_TRUE(apply(SymFn::Lt, 2, 3).toBool());
  EXPECT_EQ(apply(SymFn::Max, 2, 9).toInt(), 9);
  EXPECT_EQ(apply(SymFn::Pow, 3, 4).toInt(), 81);
  EXPECT_EQ(apply1(SymFn::Ceil, 2.1).toInt(), 3);
  EXPECT_EQ(apply1(SymFn::Floor, -2.1).toInt(), -3);
  EXPECT_EQ(apply1(SymFn::ToInt, -2.9).toInt(), -2);
  EXPECT_EQ(apply1(SymFn::Neg, 4).toInt(), -4);
}

TEST(SymOps, DivisionByZeroIsAnError) {
  EXPECT_THROW(apply(SymFn::FloorDiv, 1, 0), std::runtime_error);
  EXPECT_THROW(apply(SymFn::Mod, 1, 0), std::runtime_error);
}

TEST(SymOps, WrongOperandsAreAnError) {
  EXPECT_THROW(apply1(SymFn::Add, 1), std::runtime_error);
  EXPECT_THROW(apply(SymFn::Add, 1, c10::IValue("x")), std::runtime_error);
}

TEST(SymOps, IfThenElsePicksByTheCondition) {  // torch.sym_ite
  c10::IValue yes[3] = {true, 4, -7};
  c10::IValue no[3] = {false, 4, -7};
  c10::IValue from_int[3] = {0, 1.5, 2.5};
  EXPECT_EQ(applySymFn(SymFn::IfThenElse, yes, 3).toInt(), 4);
  EXPECT_EQ(applySymFn(SymFn::IfThenElse, no, 3).toInt(), -7);
  EXPECT_EQ(applySymFn(SymFn::IfThenElse, from_int, 3).toDouble(), 2.5);
  EXPECT_THROW(applySymFn(SymFn::IfThenElse, yes, 2), std::runtime_error);
}
