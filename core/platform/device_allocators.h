#pragma once
// Private to core/platform: makes the allocator of one logical device (the registry calls it on
// the device's first use). CPU devices get a BFC pool over host memory, GPU devices a BFC pool
// over cudaMalloc on their physical ordinal; a build without CUDA throws DeviceError for a GPU.

#include <memory>

#include "core/memory/allocator.h"
#include "core/platform/logical.h"

namespace towerflow::detail {

std::unique_ptr<Allocator> make_device_allocator(const LogicalDevice& device);

}  // namespace towerflow::detail
