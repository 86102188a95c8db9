#pragma once
// The CPU backend (private to core/tensor): Backend over host memory, the core/cpu kernels for
// convolution, pooling, batch norm and GEMM, and Eigen loops for everything else, all on the
// device's CpuContext.

#include <memory>
#include <vector>

#include "core/cpu/context.h"
#include "core/tensor/backend_impl.h"

namespace towerflow {

// `threads`: the device's intra-op threads. `allocator` outlives the backend. `missing` lists op
// kinds the backend claims not to support: tests of placement use it to stand in for a device
// that lacks kernels (with a GPU's Device, memory stays host memory).
std::unique_ptr<Backend> make_cpu_backend(const Device& device, Allocator& allocator, int threads,
                                          std::vector<OpKind> missing = {});

// The intra-op thread context of a logical CPU device (one per device, owned by its backend):
// for CPU code outside the op set that should share the device's threads (an optimizer update,
// a CPU all-reduce). Throws InvalidArgument for a non-CPU device, NotFound for an unknown one.
const cpu::CpuContext& cpu_context_for(const Device& cpu_device);

}  // namespace towerflow
