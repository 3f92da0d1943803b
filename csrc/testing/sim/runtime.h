// The gxsim runtime: device, streams, events, and which streams are capturing into which graph.
// Kernels run synchronously on the host (Note [gxsim runs kernels on the host]), so streams are
// bookkeeping: an id per stream, a thread-local current stream, and the capture registry that
// decides, per stream, whether a kernel launch runs now or is recorded into a graph.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/core/Allocator.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "launch.h"

// torch >= 2.12 has the device-generic graph API (at::GraphImplInterface, torch.accelerator.Graph)
// and DeviceGuardImplInterface::isStreamCapturing; 2.11 has neither.
#if __has_include(<ATen/core/GraphImplInterface.h>)
#define GRAPHEX_SIM_TORCH_GRAPH_API 1
#else
#define GRAPHEX_SIM_TORCH_GRAPH_API 0
#endif

namespace graphex::sim {

constexpr c10::DeviceType kDeviceType = c10::DeviceType::PrivateUse1;
constexpr c10::DeviceIndex kDeviceCount = 1;
constexpr c10::StreamId kDefaultStreamId = 0;

inline c10::Device device(c10::DeviceIndex index = 0) { return c10::Device(kDeviceType, index); }
void check_device_index(c10::DeviceIndex index);

// ---- streams ----------------------------------------------------------------------------------
c10::Stream default_stream(c10::DeviceIndex index = 0);
c10::Stream current_stream(c10::DeviceIndex index = 0);
c10::Stream exchange_stream(c10::Stream stream);  // returns the previous current stream
c10::Stream new_stream(c10::DeviceIndex index = 0);

// ---- captures -----------------------------------------------------------------------------------
// One capture underway: the streams taking part (the origin and the streams forked from it through
// events), what was recorded, and whether an illegal operation invalidated it.
struct CaptureState {
  uint64_t id = 0;
  c10::MempoolId_t pool{0, 0};
  c10::StreamId origin = 0;
  std::set<c10::StreamId> streams;   // every stream in the capture, the origin included
  std::set<c10::StreamId> unjoined;  // forked streams with work not yet joined back into the origin
  std::vector<Launch> launches;
  bool invalidated = false;
  std::string error;                 // why it was invalidated
};

// The capture the given stream takes part in, or null.
std::shared_ptr<CaptureState> capture_of(c10::StreamId stream);
inline std::shared_ptr<CaptureState> current_capture() { return capture_of(current_stream().id()); }
bool any_capture_underway();

void register_capture(const std::shared_ptr<CaptureState>& state);    // the origin stream starts capturing
void unregister_capture(const std::shared_ptr<CaptureState>& state);  // all its streams stop
uint64_t next_capture_id();

// Note [What breaks a capture]: an operation CUDA refuses while a stream captures (a host read, a
// copy to the CPU, a synchronize, a query) invalidates the capture, as CUDA does, and throws with
// CUDA's message. capture_end() then fails and ends the capture; the device is usable again.
[[noreturn]] void capture_violation(CaptureState& state, const std::string& what);
// A launch on an invalidated capture fails like CUDA's cudaErrorStreamCaptureInvalidated.
void check_capture_valid(const CaptureState& state);

// ---- events -------------------------------------------------------------------------------------
struct Event {
  bool recorded = false;
  c10::StreamId stream = 0;
  std::weak_ptr<CaptureState> capture;  // set when recorded on a capturing stream
  std::chrono::steady_clock::time_point time;
};
void record_event(Event& event, const c10::Stream& stream);
void block_on_event(const Event& event, const c10::Stream& stream);  // fork/join bookkeeping
bool query_event(const Event& event);
void synchronize_event(const Event& event);
void synchronize_stream(const c10::Stream& stream);
bool query_stream(const c10::Stream& stream);
void synchronize_device();

// ---- counters (graphex.testing.sim.stats()) -------------------------------------------------------
struct Counters {
  std::atomic<int64_t> kernel_launches{0};    // device work run outside any replay (kernels and copies)
  std::atomic<int64_t> captured_launches{0};  // launches recorded into graphs
  std::atomic<int64_t> replayed_launches{0};  // launches run by replays
  std::atomic<int64_t> graph_replays{0};
  std::atomic<int64_t> captures{0};           // captures that ended with a graph
};
Counters& counters();

}  // namespace graphex::sim
