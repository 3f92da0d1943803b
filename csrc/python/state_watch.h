// graphex._C.StateWatch: a cheap per-call proof that the Python state a cache entry's guards read is untouched.
#pragma once

#include <pybind11/pybind11.h>

namespace graphex {
void registerStateWatch(pybind11::module_& m);
// Whether `watch` (a graphex._C.StateWatch) still holds: unchanged() without a Python call. False for any other object.
bool stateWatchUnchanged(pybind11::handle watch);
}  // namespace graphex
