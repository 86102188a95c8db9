#pragma once
// Platform: the physical devices a process can use, the host and its CUDA GPUs.
//
// The interface is deliberately narrow so that everything above it (remapping, limits,
// validation in core/platform/logical.h) is tested on the host against described machines.
// make_system_platform() asks this machine: the host's usable cores and memory, and the GPUs the
// CUDA runtime lists (so CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER keep their usual meaning).
// With no driver, no device, or a build without CUDA, the GPU list is empty and nothing throws.
// The CUDA query uses cudaGetDeviceCount/cudaGetDeviceProperties only: no context is created.
// A described platform comes from JSON:
//   {"cpu": {"cores": 16, "memory_bytes": 68719476736},
//    "gpus": [{"name": "Tesla V100-SXM2-16GB", "memory_bytes": 17179869184,
//              "pci_bus_id": "0000:06:00.0", "compute_capability": "7.0"}, ...]}
// Methods are const and thread-safe; results do not change during a process's life.

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace towerflow {

struct HostDescription {
  int cores = 1;                 // hardware threads this process may run on
  std::size_t memory_bytes = 0;  // physical memory this process may use (cgroup limits apply)
  bool operator==(const HostDescription&) const = default;
};

struct GpuDescription {
  std::string name;              // "NVIDIA H100 80GB HBM3"
  std::size_t memory_bytes = 0;  // total device memory
  std::string pci_bus_id;        // "0000:3b:00.0"
  int compute_major = 0;         // compute capability 9.0 -> 9, 0
  int compute_minor = 0;
  std::string compute_capability() const;  // "9.0"
  bool operator==(const GpuDescription&) const = default;
};

class Platform {
 public:
  virtual ~Platform() = default;
  virtual HostDescription host() const = 0;
  // Index i is the CUDA ordinal i as this process sees it (after CUDA_VISIBLE_DEVICES).
  virtual std::vector<GpuDescription> gpus() const = 0;
  virtual std::string name() const = 0;  // "this machine", "described machine 'dgx.json'"
};

// This machine. The host and GPU queries run once, on first use, and are cached.
std::unique_ptr<Platform> make_system_platform();

// A machine given by value (tests) or by a JSON description (the tool's dry runs). The JSON
// loaders throw NotFound for a missing file and DataError naming the file and the field for a
// malformed or incomplete description.
std::unique_ptr<Platform> make_described_platform(HostDescription host, std::vector<GpuDescription> gpus,
                                                  std::string name = "described machine");
std::unique_ptr<Platform> parse_platform_json(std::string_view text, std::string_view source = "<json>");
std::unique_ptr<Platform> load_platform_json(const std::string& path);

// What a process would see on a machine with these GPUs (listed in the driver's default order)
// under CUDA_DEVICE_ORDER=`order` ("FASTEST_FIRST" or "PCI_BUS_ID"; null = unset) and
// CUDA_VISIBLE_DEVICES=`visible` (null = unset), following the driver's rules: ids are read up
// to the first invalid one, an empty list hides every GPU, a duplicate stops the list. Used for
// described machines; on this machine the driver applies the variables itself.
std::vector<GpuDescription> apply_cuda_environment(std::vector<GpuDescription> gpus, const char* visible,
                                                   const char* order);

// The host as this process sees it (affinity mask and cgroup memory limit applied).
HostDescription query_host();

}  // namespace towerflow
