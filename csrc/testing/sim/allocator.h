// The gxsim caching allocator: host memory in blocks, cached per pool (Note [gxsim memory pools]).
#pragma once

#include <c10/core/Allocator.h>

#include <cstdint>
#include <functional>

namespace graphex::sim {

c10::Allocator* allocator();

// Note [gxsim memory pools]
// Like CUDA's caching allocator: freed blocks go back to the free list of the pool they came
// from and are handed out again by that pool only (best fit, no splitting), never returned to the
// OS while any graph pool exists. The general pool {0, 0} serves eager allocations. While a capture
// is underway, allocations made on one of its streams (the filter says which) come from the graph's
// private pool; a pool retained by several graphs (capture_begin(pool=other.pool())) is shared, and
// its blocks stay out of the general pool until the last graph releases it (reset or destruction):
// then its free blocks, and later the blocks still held by live tensors when they are freed, move
// to the general pool.
void retain_pool(c10::MempoolId_t pool);   // creates it on first use
void release_pool(c10::MempoolId_t pool);
void begin_allocate_to_pool(c10::MempoolId_t pool, std::function<bool()> filter);
void end_allocate_to_pool(c10::MempoolId_t pool);
c10::MempoolId_t new_pool_handle();        // like torch.cuda.graph_pool_handle(): {id, 0}

// The pool a block belongs to ({-1,-1} for a pointer that is not a gxsim block's start).
c10::MempoolId_t pool_of(const void* ptr);
bool owns(const void* ptr);                 // inside any live gxsim block
// Frees the general pool's cached blocks, only while no graph pool exists.
void empty_cache();

struct MemoryStats {
  int64_t allocated_bytes = 0;  // in live blocks
  int64_t reserved_bytes = 0;   // allocated from the OS, cached included
};
MemoryStats memory_stats();

}  // namespace graphex::sim
