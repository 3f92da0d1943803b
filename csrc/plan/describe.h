// A readable listing of a built Program: one line per instruction with the slots
// it reads, where it moves or frees them, and the user's source line.
#pragma once

#include "program/program.h"

#include <string>

namespace graphex {

std::string describeProgram(const Program& program);

}  // namespace graphex
