// This machine's GPUs through the registry. Skips (visibly) where no GPU is visible.
#include <catch2/catch.hpp>

#include "test_skip.h"

#include "core/platform/registry.h"

namespace tw = towerflow;
using tw::Device;

TEST_CASE("GPUs of this machine become logical devices with lazily created allocators", "[platform][cuda]") {
  auto gpus = tw::make_system_platform()->gpus();
  if (gpus.empty()) {
    TW_SKIP("no GPU visible (" << tw::make_system_platform()->name() << ")");
  }
  tw::reset_devices_for_testing();
  const auto& devices = tw::initialise_devices({.allow_growth = true});
  REQUIRE(devices.size() == gpus.size() + 1);
  for (std::size_t i = 0; i < gpus.size(); ++i) {
    CHECK(devices[i].device == Device::gpu(static_cast<int>(i)));
    CHECK(devices[i].physical_index == static_cast<int>(i));
    CHECK(devices[i].memory_limit_bytes ==
          gpus[i].memory_bytes - tw::gpu_system_memory_reserve(gpus[i].memory_bytes, gpus[i].compute_major));
    CHECK(gpus[i].pci_bus_id.size() == 12);  // "0000:3b:00.0"
  }
  tw::Allocator& a = tw::device_allocator(Device::gpu(0));
  CHECK(&a == &tw::device_allocator(Device::gpu(0)));
  void* p = a.allocate(1 << 20);
  CHECK(p != nullptr);
  CHECK(a.stats().bytes_in_use >= (1u << 20));
  a.deallocate(p);
  tw::reset_devices_for_testing();
}
