// Liveness: when each slot's value can be released.
//
// Note [Free each value after its last use]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every slot is written once (the lowering emits SSA). After the instruction that
// reads a slot for the last time, the executor no longer needs it: the read is
// turned into a move onto the operator's stack when that is the only read in the
// instruction, otherwise the slot is released right after the instruction runs.
// A value nobody reads is dropped as soon as it is produced, and an input nobody
// reads is never bound. So peak memory is what the graph needs at its widest
// point, as in eager, and never the sum of all intermediates.
// Program outputs are read "after the last instruction" and are never released early.
#pragma once

#include "program/program.h"

namespace graphex {

// Fill Instruction::frees and the move flags, drop unread outputs, unbind unread
// inputs. Throws ProgramError when a slot is read before it is written or written twice.
void planLiveness(Program& program);

}  // namespace graphex
