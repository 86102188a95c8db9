#include "core/memory/stats.h"

#include <cstdio>

#include "core/error.h"

namespace towerflow {

std::string format_bytes(std::size_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return str(bytes, " B");
  double v = static_cast<double>(bytes) / 1024.0;
  int unit = 0;
  while (v >= 1024.0 && unit < 5) {
    v /= 1024.0;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", v, kUnits[unit]);
  return buf;
}

std::string format_stats(const AllocatorStats& s) {
  char frag[16];
  std::snprintf(frag, sizeof frag, "%.2f", s.fragmentation);
  return str("in use ", format_bytes(s.bytes_in_use), " (peak ", format_bytes(s.peak_bytes_in_use),
             ") of ", format_bytes(s.bytes_limit), " limit; pool ", format_bytes(s.pool_bytes), " in ",
             s.num_regions, s.num_regions == 1 ? " region" : " regions", "; largest free block ",
             format_bytes(s.largest_free_block), "; fragmentation ", frag, "; ", s.num_allocs,
             s.num_allocs == 1 ? " allocation (" : " allocations (", s.live_allocs, " live)");
}

}  // namespace towerflow
