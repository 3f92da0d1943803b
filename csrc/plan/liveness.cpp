#include "plan/liveness.h"

#include <limits>

namespace graphex {

namespace {

constexpr int64_t kNever = -1;
constexpr int64_t kAtEnd = std::numeric_limits<int64_t>::max();

template <typename F>
void forEachRead(Instruction& instr, F&& f) {
  for (ArgSource& a : instr.args) {
    if (a.slot >= 0) f(a.slot, &a.move);
    for (ListItem& li : a.items)
      if (li.slot >= 0) f(li.slot, &li.move);
  }
}

}  // namespace

void planLiveness(Program& p) {
  const size_t n = p.num_slots;
  std::vector<int64_t> written_at(n, kNever);
  std::vector<int64_t> last_read(n, kNever);
  auto describe = [&](size_t i) {
    const NodeInfo& info = p.nodes[p.instructions[i].debug];
    return "node '" + info.name + "' (" + info.target + ")";
  };

  for (int32_t s : p.input_slots) {
    if (s < 0) continue;
    if (written_at[s] != kNever) throw ProgramError("two inputs are bound to slot " + std::to_string(s));
    written_at[s] = -2;  // before the first instruction
  }
  for (size_t i = 0; i < p.instructions.size(); ++i) {
    Instruction& instr = p.instructions[i];
    forEachRead(instr, [&](int32_t s, bool*) {
      if (written_at[s] == kNever)
        throw ProgramError(describe(i) + " reads slot %" + std::to_string(s) + " before anything writes it");
      last_read[s] = static_cast<int64_t>(i);
    });
    for (int32_t s : instr.outs) {
      if (s < 0) continue;
      if (written_at[s] != kNever) throw ProgramError(describe(i) + " writes slot %" + std::to_string(s) + " twice");
      written_at[s] = static_cast<int64_t>(i);
    }
  }
  for (const ArgSource& out : p.outputs) {
    if (out.slot < 0) continue;
    if (written_at[out.slot] == kNever)
      throw ProgramError("program output reads slot %" + std::to_string(out.slot) + " that nothing writes");
    last_read[out.slot] = kAtEnd;
  }

  for (auto& s : p.input_slots)
    if (s >= 0 && last_read[s] == kNever) s = -1;

  for (size_t i = 0; i < p.instructions.size(); ++i) {
    Instruction& instr = p.instructions[i];
    instr.frees.clear();
    for (auto& s : instr.outs)
      if (s >= 0 && last_read[s] == kNever) s = -1;  // nobody reads it: drop at once

    // Count reads of each slot within this instruction: only a single read can move.
    std::vector<std::pair<int32_t, int>> counts;
    forEachRead(instr, [&](int32_t s, bool*) {
      for (auto& [slot, c] : counts)
        if (slot == s) {
          ++c;
          return;
        }
      counts.emplace_back(s, 1);
    });
    forEachRead(instr, [&](int32_t s, bool* move) {
      *move = false;
      if (last_read[s] != static_cast<int64_t>(i)) return;
      for (auto& [slot, c] : counts)
        if (slot == s && c == 1) *move = true;
    });
    for (auto& [slot, c] : counts)
      if (c > 1 && last_read[slot] == static_cast<int64_t>(i)) instr.frees.push_back(slot);
  }
}

}  // namespace graphex
