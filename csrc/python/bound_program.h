// The one program a cache entry runs, shared by the Python module's files: BoundProgram and its run.
#pragma once

#include "runtime/binder.h"
#include "runtime/executor.h"

#include <pybind11/pybind11.h>

#include <memory>

namespace graphex {

// Note [One binder]: a program with the binder of its tables, what a cache entry runs. The executor is
// shared with Python (first-run validation, dumps); every other run goes through try_run.
struct BoundProgram {
  std::shared_ptr<Executor> executor;
  Binder binder;
};

// The flattened result, or None (nothing run) when the call breaks a shape guard or does not fit the signature
// (csrc/python/module.cpp). `args`: the call's flattened arguments, a list or a tuple.
pybind11::object tryRunBound(const BoundProgram& bp, pybind11::handle args, const pybind11::list& held);

}  // namespace graphex
