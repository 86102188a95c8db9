// The CUDA query of a build without CUDA: this process sees no GPU.
#include "core/platform/cuda_query.h"

namespace towerflow::detail {

std::vector<GpuDescription> query_cuda_gpus(std::string* why) {
  if (why) *why = "this build has no CUDA support (rebuild with -DTOWERFLOW_CUDA=ON to use GPUs)";
  return {};
}

}  // namespace towerflow::detail
