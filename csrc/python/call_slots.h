// graphex._C's call slots: FastCall, CachedCall, RunnerCall and DirectCall (csrc/python/call_slots.cpp).
#pragma once

#include <pybind11/pybind11.h>

namespace graphex {
void registerCallSlots(pybind11::module_& m);
}  // namespace graphex
