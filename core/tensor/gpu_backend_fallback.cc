// make_gpu_backend for a link in which core/cuda does not define it: a GPU device then has no
// backend, and using one raises the no-CUDA error. The definition is weak and lives in its own
// archive, linked after towerflow_cuda, so the CUDA backend's definition wins wherever it exists.

#include "core/cuda/status.h"
#include "core/error.h"
#include "core/tensor/backend_impl.h"

namespace towerflow {

[[gnu::weak]] std::unique_ptr<Backend> make_gpu_backend(const Device& device, Allocator&) {
  raise<DeviceError>("no GPU backend for ", device, ": ", gpu::kNoCudaBuildMessage);
}

}  // namespace towerflow
