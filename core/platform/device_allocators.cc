#include "core/platform/device_allocators.h"

#include "core/memory/sub_allocators.h"

namespace towerflow::detail {

std::unique_ptr<Allocator> make_device_allocator(const LogicalDevice& device) {
  BfcOptions opts{.device_name = device.device.str(),
                  .limit_bytes = device.memory_limit_bytes,
                  .allow_growth = device.allow_growth};
  if (device.device.is_gpu())
    return make_bfc_allocator(make_cuda_sub_allocator(device.physical_index), opts);
  return make_bfc_allocator(make_host_sub_allocator(), opts);
}

}  // namespace towerflow::detail
