// The gxsim host ("pinned") allocator: plain host memory, tracked so that is_pinned() knows it.
// torch.accelerator.empty_host_cache() and Tensor.pin_memory() need one per accelerator.
#include "host_allocator.h"

#include <ATen/core/CachingHostAllocator.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

namespace graphex::sim {
namespace {

std::mutex& mutex() {
  static auto* m = new std::mutex();
  return *m;
}
std::set<const void*>& live() {
  static auto* s = new std::set<const void*>();
  return *s;
}

void free_host(void* ptr) {
  {
    std::lock_guard<std::mutex> lock(mutex());
    live().erase(ptr);
  }
  std::free(ptr);
}

struct SimHostAllocator final : at::HostAllocator {
  at::DataPtr allocate(size_t n) override {
    if (n == 0) return at::DataPtr(nullptr, c10::Device(c10::kCPU));
    void* ptr = std::aligned_alloc(64, (n + 63) / 64 * 64);
    TORCH_CHECK(ptr != nullptr, "gxsim: out of host memory allocating ", n, " bytes");
    {
      std::lock_guard<std::mutex> lock(mutex());
      live().insert(ptr);
    }
    return at::DataPtr(ptr, ptr, &free_host, c10::Device(c10::kCPU));
  }
  at::DeleterFnPtr raw_deleter() const override { return &free_host; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
  bool record_event(void* /*ptr*/, void* /*ctx*/, c10::Stream /*stream*/) override { return true; }
  void empty_cache() override {}  // nothing cached
  at::HostStats get_stats() override { return {}; }
  void reset_accumulated_stats() override {}
  void reset_peak_stats() override {}
};

SimHostAllocator host;

}  // namespace

at::Allocator* host_allocator() { return &host; }

bool is_host_pinned(const void* ptr) {
  std::lock_guard<std::mutex> lock(mutex());
  return live().count(ptr) > 0;
}

}  // namespace graphex::sim

REGISTER_HOST_ALLOCATOR(c10::DeviceType::PrivateUse1, &graphex::sim::host)
