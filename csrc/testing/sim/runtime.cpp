// The gxsim runtime: streams, events, the capture registry, counters (runtime.h).
#include "runtime.h"

#include <c10/util/Exception.h>

#include <map>

namespace graphex::sim {
namespace {

std::atomic<c10::StreamId> next_stream{1};
std::atomic<uint64_t> next_capture{1};
thread_local c10::StreamId tls_current_stream = kDefaultStreamId;

struct Registry {
  std::mutex mutex;
  std::map<c10::StreamId, std::shared_ptr<CaptureState>> by_stream;
};
Registry& registry() {
  static auto* r = new Registry();
  return *r;
}

c10::Stream make_stream(c10::StreamId id, c10::DeviceIndex index) {
  return c10::Stream(c10::Stream::UNSAFE, device(index), id);
}

// The message CUDA gives for cudaErrorStreamCaptureUnsupported, then what was attempted.
std::string not_permitted(const std::string& what) {
  return "gxsim error: operation not permitted when stream is capturing: " + what;
}

}  // namespace

void check_device_index(c10::DeviceIndex index) {
  TORCH_CHECK(index >= -1 && index < kDeviceCount, "gxsim: invalid device index ", static_cast<int>(index),
              " (there is ", static_cast<int>(kDeviceCount), " gxsim device)");
}

c10::Stream default_stream(c10::DeviceIndex index) { return make_stream(kDefaultStreamId, index < 0 ? 0 : index); }
c10::Stream current_stream(c10::DeviceIndex index) { return make_stream(tls_current_stream, index < 0 ? 0 : index); }
c10::Stream exchange_stream(c10::Stream stream) {
  auto previous = current_stream(stream.device_index());
  tls_current_stream = stream.id();
  return previous;
}
c10::Stream new_stream(c10::DeviceIndex index) { return make_stream(next_stream++, index < 0 ? 0 : index); }

std::shared_ptr<CaptureState> capture_of(c10::StreamId stream) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.by_stream.find(stream);
  return it == r.by_stream.end() ? nullptr : it->second;
}

bool any_capture_underway() {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return !r.by_stream.empty();
}

void register_capture(const std::shared_ptr<CaptureState>& state) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  TORCH_CHECK(r.by_stream.find(state->origin) == r.by_stream.end(),
              "gxsim: the stream is already capturing (cudaErrorIllegalState)");
  state->streams.insert(state->origin);
  r.by_stream[state->origin] = state;
}

void unregister_capture(const std::shared_ptr<CaptureState>& state) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (auto stream : state->streams) {
    auto it = r.by_stream.find(stream);
    if (it != r.by_stream.end() && it->second == state) r.by_stream.erase(it);
  }
}

uint64_t next_capture_id() { return next_capture++; }

void capture_violation(CaptureState& state, const std::string& what) {
  auto message = not_permitted(what);
  if (!state.invalidated) {
    state.invalidated = true;
    state.error = message;
  }
  TORCH_CHECK(false, message);
}

void check_capture_valid(const CaptureState& state) {
  TORCH_CHECK(!state.invalidated,
              "gxsim error: operation failed due to a previous error during capture (the capture was "
              "invalidated by: ", state.error, "); end it with capture_end()");
}

void record_event(Event& event, const c10::Stream& stream) {
  event.recorded = true;
  event.stream = stream.id();
  event.time = std::chrono::steady_clock::now();
  event.capture = capture_of(stream.id());
}

void block_on_event(const Event& event, const c10::Stream& stream) {
  if (!event.recorded) return;
  auto capture = event.capture.lock();
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (!capture || r.by_stream.find(capture->origin) == r.by_stream.end() ||
      r.by_stream[capture->origin] != capture) {
    return;  // an event recorded outside any capture: the work is done already
  }
  auto it = r.by_stream.find(stream.id());
  if (it == r.by_stream.end()) {
    // Fork: the stream waits on work of the capture, so it joins it (as in CUDA).
    capture->streams.insert(stream.id());
    capture->unjoined.insert(stream.id());
    r.by_stream[stream.id()] = capture;
  } else if (it->second == capture && stream.id() == capture->origin) {
    capture->unjoined.erase(event.stream);  // join back into the origin stream
  }
}

bool query_event(const Event& event) {
  if (auto capture = event.capture.lock(); capture && capture_of(capture->origin) == capture) {
    capture_violation(*capture, "querying an event recorded during capture (cudaEventQuery)");
  }
  return true;  // kernels run synchronously: recorded work is complete
}

void synchronize_event(const Event& event) {
  if (auto capture = event.capture.lock(); capture && capture_of(capture->origin) == capture) {
    capture_violation(*capture, "synchronizing an event recorded during capture (cudaEventSynchronize)");
  }
}

void synchronize_stream(const c10::Stream& stream) {
  if (auto capture = capture_of(stream.id())) {
    capture_violation(*capture, "synchronizing a capturing stream (cudaStreamSynchronize)");
  }
}

bool query_stream(const c10::Stream& stream) {
  if (auto capture = capture_of(stream.id())) {
    capture_violation(*capture, "querying a capturing stream (cudaStreamQuery)");
  }
  return true;
}

void synchronize_device() {
  std::shared_ptr<CaptureState> capture;
  {
    auto& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    if (!r.by_stream.empty()) capture = r.by_stream.begin()->second;
  }
  if (capture) {
    capture_violation(*capture, "synchronizing the device while a stream captures (cudaDeviceSynchronize)");
  }
}

Counters& counters() {
  static Counters c;
  return c;
}

}  // namespace graphex::sim
