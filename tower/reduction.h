#pragma once
// Reduction strategies: how the towers' gradients become one update.
//
//   ParameterDevice   the towers' gradients are gathered and summed on one device (a CPU or a
//                     GPU; default /cpu:0), the optimizer runs there once, and the new parameters
//                     are copied to every replica before the next forward (TensorFlow 1.x's
//                     variables on a parameter device).
//   AllReduce         a sum all-reduce of the replicas' flat gradient buffers (the local
//                     shared-memory all-reduce between CPU devices, NCCL between physical GPUs);
//                     the optimizer runs on every replica. With bucket_bytes > 0 the gradient
//                     buffer is reduced in buckets of about that size, each starting as soon as
//                     backward has finished writing it, while backward goes on (PyTorch DDP's
//                     buckets, Horovod's tensor fusion). Between logical devices that share one
//                     physical GPU, NCCL cannot run: the trainer falls back to ParameterDevice on
//                     the first of them and logs that it did (as TensorFlow does).
//
// parse_reduction reads the command-line forms:
//   parameter_device | parameter_device:/gpu:0 | all_reduce | bucketed[:MB]   (MB default 25)

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "core/device.h"

namespace towerflow::tower {

struct ParameterDevice {
  std::optional<Device> device;  // unset: /cpu:0
};

struct AllReduce {
  std::size_t bucket_bytes = 0;  // 0: one reduction after backward
};

using Reduction = std::variant<ParameterDevice, AllReduce>;

Reduction parse_reduction(std::string_view spec);
std::string to_string(const Reduction& reduction);

}  // namespace towerflow::tower
