#include "tower/devices.h"

#include <algorithm>
#include <thread>

#include "core/collectives/process_group.h"
#include "core/platform/platform.h"
#include "core/platform/registry.h"

namespace towerflow::tower {

ProcessOptions with_tower_defaults(ProcessOptions opts, const TowerDefaults& d) {
  const bool cpus_configured = opts.device_count.count("CPU") || opts.virtual_devices.cpu_memory_limits_mb;
  if (!d.has_gpu && !cpus_configured && d.two_cpu_towers) opts.device_count["CPU"] = 2;
  if (d.processes_on_host > 1 && opts.intra_op_threads.value_or(0) == 0) {
    int cpu_devices = 1;
    if (auto it = opts.device_count.find("CPU"); it != opts.device_count.end()) cpu_devices = std::max(1, it->second);
    if (opts.virtual_devices.cpu_memory_limits_mb)
      cpu_devices = std::max(1, static_cast<int>(opts.virtual_devices.cpu_memory_limits_mb->size()));
    opts.intra_op_threads = std::max(1, d.hardware_threads / d.processes_on_host / cpu_devices);
  }
  return opts;
}

std::vector<Device> default_towers(const ProcessOptions& opts) {
  const TowerDefaults d{.has_gpu = !make_system_platform()->gpus().empty(),
                        .processes_on_host = collectives::world().local_size(),
                        .hardware_threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()))};
  return logical_devices(with_tower_defaults(opts, d));
}

}  // namespace towerflow::tower
