// The CUDA query of a build without CUDA: this process sees no GPU.
#include "core/error.h"
#include "core/platform/cuda_query.h"

namespace towerflow::detail {

std::vector<GpuDescription> query_cuda_gpus(std::string* why) {
  if (why) *why = "this build has no CUDA support (rebuild with -DTOWERFLOW_CUDA=ON to use GPUs)";
  return {};
}

GpuMemoryInfo query_cuda_memory(int ordinal) {
  raise<DeviceError>("cannot read the free memory of CUDA device ", ordinal,
                     ": this build has no CUDA support; rebuild with -DTOWERFLOW_CUDA=ON");
}

}  // namespace towerflow::detail
