#pragma once
// What the CUDA backend can do in this process, and the error every CUDA failure raises.
//
// Contract:
// - No function here includes or needs a CUDA header; the same declarations exist in a build
//   without CUDA, where every GPU entry point raises DeviceError with kNoCudaBuildMessage.
// - cuda_availability() never throws: a missing driver, no device, or a build without CUDA all
//   come back as `device_count == 0` with the reason in words.
// - CudaError is what a failed CUDA runtime, cuDNN, cuBLAS or NCCL call raises. Its message names
//   the call, the device (logical name and CUDA ordinal) and the library's status string, e.g.
//   "cudaMalloc(&ptr, bytes) failed on /gpu:1 (CUDA ordinal 0): cudaErrorMemoryAllocation (out of memory)".

#include <string>
#include <string_view>

#include "core/error.h"

namespace towerflow::gpu {

inline constexpr std::string_view kNoCudaBuildMessage =
    "this build has no CUDA support; rebuild with -DTOWERFLOW_CUDA=ON";

// A failed CUDA, cuDNN, cuBLAS or NCCL call.
class CudaError : public DeviceError {
 public:
  using DeviceError::DeviceError;
};

// True when towerflow was built with the CUDA backend (-DTOWERFLOW_CUDA=ON).
bool built_with_cuda();

struct CudaAvailability {
  bool built = false;      // the backend is compiled in
  int device_count = 0;    // CUDA devices the driver shows (after CUDA_VISIBLE_DEVICES)
  int driver_version = 0;  // e.g. 13000; 0 when there is no driver
  int runtime_version = 0; // the CUDA runtime linked in; 0 in a build without CUDA
  std::string reason;      // why device_count is 0 ("no CUDA driver is installed ..."), else empty
  bool usable() const { return device_count > 0; }
};

// Probes the driver once per call. Never throws.
CudaAvailability cuda_availability();

// One line for logs and reports: "CUDA 13.0 runtime, driver 13.0, 2 devices" or the reason.
std::string describe(const CudaAvailability& a);

}  // namespace towerflow::gpu
