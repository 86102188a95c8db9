// The allocator factory of a tree without core/memory: every request fails clearly.
#include "core/error.h"
#include "core/platform/device_allocators.h"

namespace towerflow::detail {

std::unique_ptr<Allocator> make_device_allocator(const LogicalDevice& device) {
  raise<DeviceError>("cannot create the allocator of ", device.device,
                     ": this build has no towerflow_memory library (core/memory/CMakeLists.txt)");
}

}  // namespace towerflow::detail
