// docs/devices.md (memory): a BFC pool over host memory, one allocation, its statistics.
#include <iostream>

#include "core/memory/memory.h"

namespace tw = towerflow;

int main() {
  // [docs:bfc]
  auto pool = tw::make_bfc_allocator(tw::make_host_sub_allocator(),
                                     {.device_name = "/cpu:0", .limit_bytes = 4ull << 30});
  void* p = pool->allocate(1 << 20);   // 256-byte aligned; throws tw::OutOfMemory
  pool->deallocate(p);                 // a foreign or freed pointer throws tw::InvalidArgument
  std::cout << tw::format_stats(pool->stats()) << "\n";
  // in use 0 B (peak 1.0 MiB) of 4.0 GiB limit; pool 2.0 MiB in 1 region; largest free block
  // 2.0 MiB; fragmentation 0.00; 1 allocation (0 live)
  // [end]
}
