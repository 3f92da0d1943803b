// The gxsim PrivateUse1 hooks: what torch asks of a PrivateUse1 backend (is it built and available,
// how many devices, the default generator, which device a pointer is on).
#include "allocator.h"
#include "host_allocator.h"
#include "runtime.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Storage.h>

#include <cstring>

namespace graphex::sim {
namespace {

struct SimHooks final : public at::PrivateUse1HooksInterface {
  void init() const override {}
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex /*device_index*/) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return kDeviceCount; }
  void setCurrentDevice(c10::DeviceIndex d) const override { check_device_index(d); }
  c10::DeviceIndex getCurrentDevice() const override { return 0; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    check_device_index(d);
    return 0;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex /*d*/) const override { return 0; }
  // gxsim kernels are the CPU kernels and draw from the CPU generator (Note [gxsim runs kernels on the host]).
  const at::Generator& getDefaultGenerator(c10::DeviceIndex /*device_index*/) const override {
    return at::detail::getDefaultCPUGenerator();
  }
  at::Generator getNewGenerator(c10::DeviceIndex /*device_index*/ = -1) const override {
    return at::make_generator<at::CPUGeneratorImpl>();
  }
  at::Allocator* getPinnedMemoryAllocator() const override { return host_allocator(); }
  bool isPinnedPtr(const void* data) const override { return is_host_pinned(data); }
  at::Device getDeviceFromPtr(void* data) const override {
    TORCH_CHECK(owns(data), "gxsim: the pointer is not in gxsim memory");
    return device(0);
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    auto* impl = storage.unsafeGetStorageImpl();
    TORCH_CHECK(impl->resizable(), "Trying to resize storage that is not resizable");
    c10::DataPtr fresh = allocator()->allocate(newsize);
    const size_t keep = std::min(newsize, impl->nbytes());
    if (keep > 0) std::memcpy(fresh.get(), impl->data(), keep);
    impl->set_data_ptr_noswap(std::move(fresh));
    impl->set_nbytes(newsize);
  }
};

[[maybe_unused]] const bool registered = [] {
  at::RegisterPrivateUse1HooksInterface(new SimHooks());
  return true;
}();

}  // namespace
}  // namespace graphex::sim
