#pragma once
// Private to core/platform: the CUDA half of make_system_platform(). Implemented by towerflow_cuda
// (core/cuda/cuda_platform.cc in CUDA builds, core/cuda/stub.cc otherwise).

#include <cstddef>
#include <string>
#include <vector>

#include "core/platform/platform.h"

namespace towerflow::detail {

// The GPUs the CUDA runtime lists, in ordinal order. "No driver", "no device" and an
// insufficient driver all give an empty list (with the reason in *why, when not null); the query
// never creates a context and never throws for a missing GPU.
std::vector<GpuDescription> query_cuda_gpus(std::string* why);

struct GpuMemoryInfo {
  std::size_t free_bytes = 0;   // cudaMemGetInfo's free memory
  std::size_t total_bytes = 0;
  int compute_major = 0;
};

// Free and total memory of the GPU with this CUDA ordinal, from cudaMemGetInfo: this creates the
// device's primary context (as its first cudaMalloc would). Throws DeviceError when the query
// fails, and in a build without CUDA.
GpuMemoryInfo query_cuda_memory(int ordinal);

}  // namespace towerflow::detail
