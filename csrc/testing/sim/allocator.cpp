// The gxsim caching allocator (Note [gxsim memory pools], allocator.h).
#include "allocator.h"

#include "runtime.h"

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

namespace graphex::sim {
namespace {

constexpr size_t kRound = 512;
constexpr size_t kAlign = 64;
const c10::MempoolId_t kGeneral{0, 0};

struct Block {
  size_t size = 0;
  c10::MempoolId_t pool{0, 0};
  bool in_use = false;
};

struct Pool {
  std::multimap<size_t, void*> free;  // size -> block
  int use_count = 0;
};

struct State {
  std::mutex mutex;
  std::map<void*, Block> blocks;  // every block from the OS
  std::map<c10::MempoolId_t, Pool> pools;
  std::vector<std::pair<c10::MempoolId_t, std::function<bool()>>> captures;  // allocate-to-pool
  int64_t allocated = 0;
  int64_t reserved = 0;
  uint64_t next_handle = 1;
  State() { pools[kGeneral].use_count = 1; }
};

State& state() {
  static auto* s = new State();  // leaked: tensors may be freed during interpreter teardown
  return *s;
}

void free_block(void* ptr);

// A c10::DeviceAllocator, so torch.accelerator.empty_cache() / memory_stats() work on gxsim.
class SimAllocator final : public c10::DeviceAllocator {
 public:
  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t /*mempool_id*/) override { empty_cache(); }
  void recordStream(const c10::DataPtr& /*ptr*/, c10::Stream /*stream*/) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex /*device*/) override {
    c10::CachingDeviceAllocator::DeviceStats stats;
    auto m = memory_stats();
    const auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    stats.allocated_bytes[all].current = m.allocated_bytes;
    stats.reserved_bytes[all].current = m.reserved_bytes;
    return stats;
  }
  void resetAccumulatedStats(c10::DeviceIndex /*device*/) override {}
  void resetPeakStats(c10::DeviceIndex /*device*/) override {}

  c10::DataPtr allocate(size_t n) override {
    if (n == 0) return c10::DataPtr(nullptr, device());
    void* ptr = allocate_raw(n);
    return c10::DataPtr(ptr, ptr, &free_block, device());
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_block; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

 private:
  static void* allocate_raw(size_t n);
};

void* SimAllocator::allocate_raw(size_t n) {
  const size_t size = (n + kRound - 1) / kRound * kRound;
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  c10::MempoolId_t pool_id = kGeneral;
  for (auto it = s.captures.rbegin(); it != s.captures.rend(); ++it) {
    if (it->second()) {
      pool_id = it->first;
      break;
    }
  }
  auto& pool = s.pools[pool_id];
  auto found = pool.free.lower_bound(size);
  if (found != pool.free.end() && found->first <= 2 * size) {
    void* ptr = found->second;
    pool.free.erase(found);
    auto& block = s.blocks.at(ptr);
    block.in_use = true;
    s.allocated += static_cast<int64_t>(block.size);
    return ptr;
  }
  void* ptr = std::aligned_alloc(kAlign, size);
  TORCH_CHECK(ptr != nullptr, "gxsim: out of memory allocating ", size, " bytes");
  s.blocks[ptr] = Block{size, pool_id, true};
  s.allocated += static_cast<int64_t>(size);
  s.reserved += static_cast<int64_t>(size);
  return ptr;
}

void free_block(void* ptr) {
  if (ptr == nullptr) return;
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  auto it = s.blocks.find(ptr);
  TORCH_INTERNAL_ASSERT(it != s.blocks.end() && it->second.in_use, "gxsim: freeing an unknown block");
  auto& block = it->second;
  block.in_use = false;
  s.allocated -= static_cast<int64_t>(block.size);
  if (s.pools.find(block.pool) == s.pools.end()) block.pool = kGeneral;  // its pool was released
  s.pools[block.pool].free.emplace(block.size, ptr);
}

}  // namespace

c10::Allocator* allocator() {
  static SimAllocator instance;
  return &instance;
}

void retain_pool(c10::MempoolId_t pool) {
  TORCH_CHECK(pool != kGeneral, "gxsim: the general pool cannot be a graph's pool");
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.pools[pool].use_count++;
}

void release_pool(c10::MempoolId_t pool) {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  auto it = s.pools.find(pool);
  if (it == s.pools.end() || pool == kGeneral) return;
  if (--it->second.use_count > 0) return;
  auto& general = s.pools[kGeneral];
  for (auto& [size, ptr] : it->second.free) {
    s.blocks.at(ptr).pool = kGeneral;
    general.free.emplace(size, ptr);
  }
  for (auto& [ptr, block] : s.blocks) {
    if (block.pool == pool) block.pool = kGeneral;  // live tensors' blocks go to the general pool when freed
  }
  s.pools.erase(it);
}

void begin_allocate_to_pool(c10::MempoolId_t pool, std::function<bool()> filter) {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.captures.emplace_back(pool, std::move(filter));
}

void end_allocate_to_pool(c10::MempoolId_t pool) {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  for (auto it = s.captures.begin(); it != s.captures.end(); ++it) {
    if (it->first == pool) {
      s.captures.erase(it);
      return;
    }
  }
}

c10::MempoolId_t new_pool_handle() {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return {s.next_handle++, 0};
}

c10::MempoolId_t pool_of(const void* ptr) {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  auto it = s.blocks.find(const_cast<void*>(ptr));
  if (it == s.blocks.end()) return {static_cast<c10::CaptureId_t>(-1), static_cast<c10::CaptureId_t>(-1)};
  return it->second.pool;
}

bool owns(const void* ptr) {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  auto it = s.blocks.upper_bound(const_cast<void*>(ptr));
  if (it == s.blocks.begin()) return false;
  --it;
  auto* base = static_cast<const char*>(it->first);
  return it->second.in_use && static_cast<const char*>(ptr) < base + it->second.size;
}

void empty_cache() {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.pools.size() > 1) return;  // a graph may still read cached general blocks (Note [gxsim memory pools])
  auto& general = s.pools[kGeneral];
  for (auto& [size, ptr] : general.free) {
    s.blocks.erase(ptr);
    s.reserved -= static_cast<int64_t>(size);
    std::free(ptr);
  }
  general.free.clear();
}

MemoryStats memory_stats() {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return {s.allocated, s.reserved};
}

}  // namespace graphex::sim

// The allocator of every gxsim storage (empty, empty_strided, resize_).
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, graphex::sim::allocator())
