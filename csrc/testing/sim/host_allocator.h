// The gxsim host ("pinned") allocator (host_allocator.cpp).
#pragma once

#include <c10/core/Allocator.h>

namespace graphex::sim {

at::Allocator* host_allocator();
bool is_host_pinned(const void* ptr);  // the start of a live pinned block

}  // namespace graphex::sim
