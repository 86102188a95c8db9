// What the CUDA backend can do here: built in, driver present, how many devices.

#include <cuda_runtime.h>

#include "core/cuda/module_loading.h"
#include "core/cuda/status.h"

namespace towerflow::gpu {

bool built_with_cuda() { return true; }

CudaAvailability cuda_availability() {
  load_cuda_modules_eagerly();  // may be the first CUDA call: Note [Eager CUDA module loading]
  CudaAvailability a;
  a.built = true;
  cudaRuntimeGetVersion(&a.runtime_version);
  // cudaDriverGetVersion succeeds with 0 when no driver is installed: the clean way to tell "no
  // driver" from "driver but no device" without touching a device.
  if (cudaDriverGetVersion(&a.driver_version) != cudaSuccess || a.driver_version == 0) {
    cudaGetLastError();
    a.driver_version = 0;
    a.reason = "no CUDA driver is installed (libcuda.so was not found or reports no version); "
               "install the NVIDIA driver to use GPUs, or use /cpu devices";
    return a;
  }
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  cudaGetLastError();
  if (status != cudaSuccess) {
    a.reason = str("the CUDA driver reports no usable device: ", cudaGetErrorName(status), " (",
                   cudaGetErrorString(status), ")");
    if (status == cudaErrorInsufficientDriver)
      a.reason += str("; the driver (", a.driver_version / 1000, ".", a.driver_version % 1000 / 10,
                      ") is older than this CUDA runtime (", a.runtime_version / 1000, ".",
                      a.runtime_version % 1000 / 10, "): update the NVIDIA driver");
    return a;
  }
  if (count == 0) {
    a.reason = "the CUDA driver shows no device (check CUDA_VISIBLE_DEVICES)";
    return a;
  }
  a.device_count = count;
  return a;
}

std::string describe(const CudaAvailability& a) {
  auto version = [](int v) { return str(v / 1000, ".", v % 1000 / 10); };
  if (!a.built) return std::string(kNoCudaBuildMessage);
  std::string s = str("CUDA ", version(a.runtime_version), " runtime");
  if (a.driver_version > 0) s += str(", driver ", version(a.driver_version));
  if (a.usable()) return s + str(", ", a.device_count, a.device_count == 1 ? " device" : " devices");
  return s + ": " + a.reason;
}

}  // namespace towerflow::gpu
