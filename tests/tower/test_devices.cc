#include <catch2/catch.hpp>

#include "tower/devices.h"

namespace tw = towerflow;
using tw::ProcessOptions;
using tw::tower::with_tower_defaults;

TEST_CASE("tower defaults: two CPU towers without a GPU, threads shared by a host's processes",
          "[tower][devices]") {
  // Without a GPU and without CPU options: two logical CPU devices.
  CHECK(with_tower_defaults({}, {.hardware_threads = 8}).device_count == std::map<std::string, int>{{"CPU", 2}});
  // With a GPU, or CPU devices the options already count, or devices the program names: as given.
  CHECK(with_tower_defaults({}, {.has_gpu = true, .hardware_threads = 8}) == ProcessOptions{});
  const ProcessOptions three{.device_count = {{"CPU", 3}}};
  CHECK(with_tower_defaults(three, {.hardware_threads = 8}) == three);
  ProcessOptions virtual_cpus;
  virtual_cpus.virtual_devices.cpu_memory_limits_mb = std::vector<double>{512, 512, 512};
  CHECK(with_tower_defaults(virtual_cpus, {.hardware_threads = 8}) == virtual_cpus);
  CHECK(with_tower_defaults({}, {.hardware_threads = 8, .two_cpu_towers = false}) == ProcessOptions{});

  // Processes sharing a host: each takes its share of the threads, split over its CPU devices.
  CHECK(with_tower_defaults({}, {.processes_on_host = 2, .hardware_threads = 8}).intra_op_threads == 2);
  CHECK(with_tower_defaults(three, {.processes_on_host = 2, .hardware_threads = 12}).intra_op_threads == 2);
  CHECK(with_tower_defaults(virtual_cpus, {.processes_on_host = 2, .hardware_threads = 12}).intra_op_threads == 2);
  CHECK(with_tower_defaults({}, {.has_gpu = true, .processes_on_host = 4, .hardware_threads = 16}).intra_op_threads == 4);
  // Never below one thread; a thread count the options set is kept.
  CHECK(with_tower_defaults({}, {.processes_on_host = 8, .hardware_threads = 2}).intra_op_threads == 1);
  CHECK(with_tower_defaults({.intra_op_threads = 3}, {.processes_on_host = 2, .hardware_threads = 8})
            .intra_op_threads == 3);
  // One process: the registry splits the host's threads itself.
  CHECK(!with_tower_defaults({}, {.hardware_threads = 8}).intra_op_threads);
}
