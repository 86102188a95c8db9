#pragma once
// Human-readable byte counts and allocator statistics, for logs, error messages and the
// trainer's per-device summary.

#include <cstddef>
#include <string>

#include "core/memory/allocator.h"

namespace towerflow {

// "0 B", "255 B", "1.0 KiB", "3.5 MiB", "16.0 GiB": binary units, one decimal.
std::string format_bytes(std::size_t bytes);

// One line: "in use 1.2 GiB (peak 2.0 GiB) of 8.0 GiB limit; pool 2.0 GiB in 3 regions;
// largest free block 512.0 MiB; fragmentation 0.12; 12345 allocations (17 live)".
std::string format_stats(const AllocatorStats& s);

}  // namespace towerflow
