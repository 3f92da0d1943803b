# The core's sources (no Python headers in any): one list, read by the main build (CMakeLists.txt: graphex_core)
# and by the loader fuzzer's own clang project (tests/fuzz/CMakeLists.txt). Paths relative to the repository root.
set(GRAPHEX_CORE_SOURCES
  csrc/program/format.cpp
  csrc/program/signature.cpp
  csrc/program/arguments.cpp
  csrc/program/program.cpp
  csrc/plan/liveness.cpp
  csrc/plan/describe.cpp
  csrc/runtime/sym_ops.cpp
  csrc/runtime/shape_guards.cpp
  csrc/runtime/binder.cpp
  csrc/runtime/executor.cpp
  csrc/deploy/safetensors.cpp
  csrc/deploy/module.cpp
)
