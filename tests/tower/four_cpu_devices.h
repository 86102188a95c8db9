#pragma once
// Test helper: the first n of four logical CPU devices (one intra-op thread each), initialising
// the process's devices on first use.

#include <vector>

#include "core/device.h"
#include "core/platform/registry.h"

namespace towerflow::testing {

inline std::vector<Device> cpus(int n) {
  static const bool initialised = [] {
    ProcessOptions opts;
    opts.device_count["CPU"] = 4;
    opts.intra_op_threads = 1;
    initialise_devices(opts);
    return true;
  }();
  (void)initialised;
  std::vector<Device> d;
  for (int i = 0; i < n; ++i) d.push_back(Device::cpu(i));
  return d;
}

}  // namespace towerflow::testing
