#pragma once
// Device memory, the umbrella header: the Allocator and SubAllocator contracts, the BFC pool,
// the host / cudaMalloc / pinned-host sub-allocators, and statistics formatting.

#include "core/memory/allocator.h"
#include "core/memory/stats.h"
#include "core/memory/sub_allocators.h"
