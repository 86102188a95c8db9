// The CUDA sub-allocators in a build without CUDA: every call says how to get them.

#include "core/error.h"
#include "core/memory/sub_allocators.h"

namespace towerflow {

std::unique_ptr<SubAllocator> make_cuda_sub_allocator(int cuda_ordinal) {
  if (cuda_ordinal < 0) raise<InvalidArgument>("CUDA device ordinal ", cuda_ordinal, " is negative; use 0 or above");
  raise<DeviceError>("cannot allocate memory on CUDA device ", cuda_ordinal,
                     ": this build has no CUDA support; rebuild with -DTOWERFLOW_CUDA=ON");
}

std::unique_ptr<SubAllocator> make_pinned_host_sub_allocator() {
  raise<DeviceError>("cannot allocate pinned host memory: this build has no CUDA support; rebuild with "
                     "-DTOWERFLOW_CUDA=ON");
}

}  // namespace towerflow
