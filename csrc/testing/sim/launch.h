// A kernel launch on gxsim: run now on the host, or recorded into the capturing graph.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <optional>
#include <vector>

namespace graphex::sim {

// Note [gxsim runs kernels on the host]
// A gxsim tensor's memory is host memory from the sim allocator. Every operator without an
// explicit gxsim kernel reaches the boxed fallback (sim_fallback), which wraps each gxsim tensor
// argument as a CPU tensor over the same bytes (same storage offset, sizes, strides), redispatches
// the operator to its CPU kernel, and hands back gxsim tensors: an output that aliases an argument
// (in-place, out=, a view) is that argument or a gxsim view of its storage; a fresh CPU output is
// copied into a new gxsim tensor. So eager on gxsim runs the CPU kernels on the same values: bit for
// bit eager on the CPU.
//
// Note [Captured work does not run during capture]
// As on CUDA, a launch on a capturing stream is recorded, not executed: the fallback computes the
// outputs' sizes and strides with the operator's Meta kernel, allocates the fresh outputs (from the
// graph's pool), and records the launch: the operator, its arguments as CPU tensors aliasing the
// gxsim buffers (so the same addresses), and for each fresh output the buffer it must land in. The
// outputs' contents are undefined until the first replay, and an in-place op captured on a static
// input does not change it during capture. Replay re-runs the launches in order on the CPU kernels;
// fresh results are copied into the recorded output buffers, aliasing results are written in place.
// CPU tensors passed as arguments (0-dim scalars) are copied at capture, as CUDA bakes kernel
// arguments into the graph. An operator whose output shapes need the data (nonzero, no Meta kernel)
// or that returns a value to the host (item, equal) breaks the capture (Note [What breaks a capture]).
struct Launch {
  c10::OperatorHandle op;
  std::vector<c10::IValue> args;               // CPU aliases of gxsim memory, CPU snapshots, others
  std::vector<std::optional<at::Tensor>> targets;  // per flattened output: where a fresh result goes
  c10::StreamId stream = 0;                    // the stream it was launched on (the origin or a forked one)
};

void run_launch(const Launch& launch);  // one recorded launch, during replay

// The PrivateUse1 boxed fallback.
void sim_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// A CPU tensor over the same bytes as a gxsim tensor (non-owning: the caller keeps `sim` alive).
at::Tensor cpu_alias(const at::Tensor& sim);

}  // namespace graphex::sim
