#pragma once
// Helpers shared by the platform tests: fixture paths and described machines.

#include <cstdlib>
#include <string>

#include "core/platform/platform.h"

namespace towerflow::testing {

inline std::string platform_fixture(const std::string& name) {
  const char* root = std::getenv("TOWERFLOW_TEST_DATA");
  return std::string(root ? root : TW_FIXTURES_DIR) + "/platform/" + name;
}

inline constexpr std::size_t kGiB = std::size_t{1} << 30;
inline constexpr std::size_t kMiB = std::size_t{1} << 20;

// n GPUs of `gib` GiB each, compute capability `major`.0, PCI bus ids 0000:0i:00.0.
inline std::unique_ptr<Platform> machine(int n, std::size_t gib, int major = 8, int cores = 8,
                                         std::size_t host_gib = 64) {
  std::vector<GpuDescription> gpus;
  for (int i = 0; i < n; ++i)
    gpus.push_back({.name = "GPU model " + std::to_string(i),
                    .memory_bytes = gib * kGiB,
                    .pci_bus_id = "0000:0" + std::to_string(i) + ":00.0",
                    .compute_major = major,
                    .compute_minor = 0});
  return make_described_platform({.cores = cores, .memory_bytes = host_gib * kGiB}, gpus);
}

}  // namespace towerflow::testing
