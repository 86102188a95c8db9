#pragma once
// Logical devices: what ProcessOptions make of a platform's physical devices. A pure function,
// so that TensorFlow's remapping rules are tested on described machines.
//
// Numbering, as TensorFlow numbers them: logical GPUs follow visible_device_list order, each
// GPU's virtual devices in turn; then the logical CPU devices. TensorFlow's documented example,
// visible_device_list="1,0" with virtual devices of 1 GB and 2 GB on the first listed GPU and
// none on the second, gives /gpu:0 = visible GPU 1 with 1 GB, /gpu:1 = visible GPU 1 with 2 GB,
// /gpu:2 = visible GPU 0 with its default limit.
//
// Memory limits: a GPU's default limit is its total memory times per_process_gpu_memory_fraction,
// or, without a fraction, the memory free on it at its first allocation less TensorFlow's
// system reserve (225 MiB when under 2 GiB are free; else 500 MiB up to compute capability 6.x,
// 1050 MiB for 7.x, 1536 MiB from 8.0), as TensorFlow computes it when it opens a device: what
// NCCL, cuDNN, cuBLAS and other processes hold by then is left alone (gpu_memory_limit_at_open).
// Listing devices opens none, so such a device has limit_from_free_memory set and, until its
// first allocation, memory_limit_bytes = its total memory less the reserve, an upper bound. With
// growth the default is that upper bound (the pool takes memory only as it needs it). A CPU
// device's default limit is the host's memory. Virtual-device limits replace the default;
// memory_limit entries replace both.
//
// resolve_logical_devices throws InvalidArgument, with TensorFlow's wording where it has one and
// the fix, for: an entry of visible_device_list that is not a visible GPU id or is listed twice;
// a fraction outside (0, 1]; a fraction together with GPU virtual devices; GPU virtual-device
// entries that do not match the GPUs in use; CPU virtual devices that disagree with
// device_count CPU; growth that differs between GPUs; a memory_growth or memory_limit entry
// naming a device that does not exist; limits larger than the device (one limit, or the sum of
// the explicit limits of one physical device).

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/platform/options.h"
#include "core/platform/platform.h"

namespace towerflow {

struct LogicalDevice {
  Device device;                       // /cpu:1, /gpu:2 (TensorFlow's numbering)
  int physical_index = 0;              // CPU: 0; GPU: the CUDA ordinal after CUDA_VISIBLE_DEVICES
  std::size_t memory_limit_bytes = 0;  // the allocator's hard limit (an upper bound, see below)
  // A GPU's default limit without growth: the allocator takes free memory less the reserve at its
  // first allocation (gpu_memory_limit_at_open); memory_limit_bytes is the bound until then.
  bool limit_from_free_memory = false;
  bool allow_growth = true;
  int intra_op_threads = 1;            // threads the CPU kernels of this device use
  std::string description;             // "physical CPU 0, memory limit 4.0 GiB, growth on"

  bool operator==(const LogicalDevice&) const = default;
};

// GPUs first (TensorFlow's order), then CPUs. `opts` is used as given: apply the environment
// (apply_environment) before calling when it should count.
std::vector<LogicalDevice> resolve_logical_devices(const ProcessOptions& opts, const Platform& platform);

// The GPU ids of visible_device_list in order (all visible GPUs when unset or empty), validated
// against `visible_count` with TensorFlow's messages.
std::vector<int> parse_visible_device_list(const std::string& list, int visible_count);

// TensorFlow's system-memory reserve for a GPU with this much memory (total when listing, free
// when opening, as TensorFlow's MinSystemMemory takes it) and compute capability.
std::size_t gpu_system_memory_reserve(std::size_t total_bytes, int compute_major);

// A GPU's limit when it is opened with free_bytes of its total_bytes free: total_bytes * fraction
// with a fraction, else free_bytes - reserve_bytes. Throws OutOfMemory naming `device`, the free
// memory and the reserve, and the options that avoid it, when free_bytes < reserve_bytes (or
// leaves less than 256 bytes) without a fraction.
std::size_t gpu_memory_limit_at_open(const std::string& device, std::size_t free_bytes,
                                     std::size_t total_bytes, std::optional<double> fraction,
                                     std::size_t reserve_bytes);

// "4.0 GiB", "512.0 MiB", "100 B": binary units, one decimal.
std::string format_byte_size(std::size_t bytes);

}  // namespace towerflow
