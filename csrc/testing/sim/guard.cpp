// The gxsim device guard: device, streams and events for c10 (DeviceGuard, StreamGuard, c10::Event,
// torch.Stream / torch.Event / torch.accelerator).
#include "runtime.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

namespace graphex::sim {
namespace {

struct SimGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  SimGuardImpl() = default;
  explicit SimGuardImpl(c10::DeviceType t) {
    TORCH_CHECK(t == kDeviceType, "SimGuardImpl initialized with a non-PrivateUse1 device type: ", t);
  }
  c10::DeviceType type() const override { return kDeviceType; }

  c10::Device exchangeDevice(c10::Device d) const override {
    check_device_index(d.index());
    return device(0);
  }
  c10::Device getDevice() const override { return device(0); }
  void setDevice(c10::Device d) const override { check_device_index(d.index()); }
  void uncheckedSetDevice(c10::Device /*d*/) const noexcept override {}

  c10::Stream getStream(c10::Device d) const noexcept override { return current_stream(d.index()); }
  c10::Stream getDefaultStream(c10::Device d) const override { return default_stream(d.index()); }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool /*high_priority*/ = false) const override {
    return new_stream(d.index());
  }
  c10::Stream getNewStream(c10::Device d, int /*priority*/ = 0) const override { return new_stream(d.index()); }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override { return exchange_stream(s); }
  c10::DeviceIndex deviceCount() const noexcept override { return kDeviceCount; }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag /*flag*/) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(), "Event device index ",
                static_cast<int>(device_index), " does not match recording stream's device index ",
                static_cast<int>(stream.device_index()), ".");
    if (*event == nullptr) *event = new Event();
    record_event(*static_cast<Event*>(*event), stream);
  }
  void block(void* event, const c10::Stream& stream) const override {
    if (event != nullptr) block_on_event(*static_cast<Event*>(event), stream);
  }
  bool queryEvent(void* event) const override {
    return event == nullptr || query_event(*static_cast<Event*>(event));
  }
  void destroyEvent(void* event, const c10::DeviceIndex /*device_index*/) const noexcept override {
    delete static_cast<Event*>(event);
  }
  void synchronizeEvent(void* event) const override {
    if (event != nullptr) synchronize_event(*static_cast<Event*>(event));
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex /*device_index*/) const override {
    TORCH_CHECK(start && end, "Both events must be recorded before calculating elapsed time.");
    auto* a = static_cast<Event*>(start);
    auto* b = static_cast<Event*>(end);
    TORCH_CHECK(a->recorded && b->recorded, "Both events must be recorded before calculating elapsed time.");
    return std::chrono::duration<double, std::milli>(b->time - a->time).count();
  }

  bool queryStream(const c10::Stream& stream) const override { return query_stream(stream); }
  void synchronizeStream(const c10::Stream& stream) const override { synchronize_stream(stream); }
  void synchronizeDevice(const c10::DeviceIndex /*device_index*/) const override { synchronize_device(); }
#if GRAPHEX_SIM_TORCH_GRAPH_API
  bool isStreamCapturing(const c10::Stream& stream) const override { return capture_of(stream.id()) != nullptr; }
#endif
  void recordDataPtrOnStream(const c10::DataPtr& /*data_ptr*/, const c10::Stream& /*stream*/) const override {}
};

}  // namespace
}  // namespace graphex::sim

C10_REGISTER_GUARD_IMPL(PrivateUse1, graphex::sim::SimGuardImpl);
