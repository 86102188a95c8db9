// The CUDA half of the system platform: which GPUs the runtime lists, what they are, and how
// much of a GPU's memory is free when its allocator first needs memory.
//
// Listing calls only cudaGetDeviceCount and cudaGetDeviceProperties. Both initialise the runtime
// (and load the driver) but create no context and allocate no device memory, so listing devices
// leaves every GPU untouched until a logical device on it is used. CUDA_VISIBLE_DEVICES and
// CUDA_DEVICE_ORDER are applied by the driver itself, so the ordinals here are the ones every
// other CUDA call in this process uses. Listing is usually the process's first CUDA call, so the
// module loading mode is fixed before it (Note [Eager CUDA module loading]).
#include <cuda_runtime_api.h>

#include <cstdio>

#include "core/cuda/module_loading.h"
#include "core/error.h"
#include "core/platform/cuda_query.h"

namespace towerflow::detail {

std::vector<GpuDescription> query_cuda_gpus(std::string* why) {
  gpu::load_cuda_modules_eagerly();
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    // No driver, no device, a driver older than the runtime: all mean "no GPU here", not a
    // failure. Clear the sticky error so later CUDA calls are not confused by it.
    if (why) *why = std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
    cudaGetLastError();
    return {};
  }
  if (count == 0 && why) *why = "the CUDA runtime lists no device";
  std::vector<GpuDescription> gpus;
  for (int ordinal = 0; ordinal < count; ++ordinal) {
    cudaDeviceProp prop{};
    status = cudaGetDeviceProperties(&prop, ordinal);
    if (status != cudaSuccess) {
      // A device that cannot be queried cannot be used either; keep the ones before it so that
      // ordinals stay the driver's.
      if (why) *why = std::string("cudaGetDeviceProperties(") + std::to_string(ordinal) + "): " + cudaGetErrorString(status);
      cudaGetLastError();
      break;
    }
    char bus_id[32];
    std::snprintf(bus_id, sizeof bus_id, "%04x:%02x:%02x.0", prop.pciDomainID, prop.pciBusID, prop.pciDeviceID);
    gpus.push_back({.name = prop.name,
                    .memory_bytes = prop.totalGlobalMem,
                    .pci_bus_id = bus_id,
                    .compute_major = prop.major,
                    .compute_minor = prop.minor});
  }
  return gpus;
}

GpuMemoryInfo query_cuda_memory(int ordinal) {
  gpu::load_cuda_modules_eagerly();
  auto fail = [&](const char* call, cudaError_t status) {
    cudaGetLastError();
    raise<DeviceError>("cannot read the free memory of CUDA device ", ordinal, ": ", call,
                       " failed: ", cudaGetErrorName(status), " (", cudaGetErrorString(status),
                       ")");
  };
  int previous = -1;
  if (cudaGetDevice(&previous) != cudaSuccess) previous = -1;
  cudaError_t status = cudaSetDevice(ordinal);
  if (status != cudaSuccess) fail("cudaSetDevice", status);
  GpuMemoryInfo info;
  // cudaMemGetInfo reports for the current device and creates its primary context, which the
  // allocation that asked would create anyway; what the context itself takes is no longer free.
  status = cudaMemGetInfo(&info.free_bytes, &info.total_bytes);
  if (status == cudaSuccess)
    status = cudaDeviceGetAttribute(&info.compute_major, cudaDevAttrComputeCapabilityMajor, ordinal);
  if (previous >= 0 && previous != ordinal) cudaSetDevice(previous);
  if (status != cudaSuccess) fail("cudaMemGetInfo", status);
  return info;
}

}  // namespace towerflow::detail
