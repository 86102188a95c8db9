#include "core/platform/device_allocators.h"

#include "core/memory/sub_allocators.h"
#include "core/platform/cuda_query.h"

namespace towerflow::detail {

std::unique_ptr<Allocator> make_device_allocator(const LogicalDevice& device) {
  BfcOptions opts{.device_name = device.device.str(),
                  .limit_bytes = device.memory_limit_bytes,
                  .allow_growth = device.allow_growth};
  if (device.device.is_gpu() && device.limit_from_free_memory) {
    // The default GPU limit: free memory less TensorFlow's reserve, read at the pool's first
    // allocation, after whatever NCCL, cuDNN and cuBLAS took before (logical.h).
    opts.limit_at_first_use = [name = device.device.str(), ordinal = device.physical_index] {
      const GpuMemoryInfo m = query_cuda_memory(ordinal);
      return gpu_memory_limit_at_open(name, m.free_bytes, m.total_bytes, std::nullopt,
                                      gpu_system_memory_reserve(m.free_bytes, m.compute_major));
    };
  }
  if (device.device.is_gpu())
    return make_bfc_allocator(make_cuda_sub_allocator(device.physical_index), opts);
  return make_bfc_allocator(make_host_sub_allocator(), opts);
}

}  // namespace towerflow::detail
