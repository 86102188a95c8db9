// The per-device backend table: one Backend per logical device, created on first use from the
// device registry (its allocator and, for CPUs, its intra-op thread count).

#include <map>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "core/platform/registry.h"
#include "core/tensor/backend_impl.h"
#include "core/tensor/cpu_backend.h"

namespace towerflow {

namespace {

struct BackendTable {
  std::mutex mu;
  // Backends live until the process ends: tensors freed at exit still return memory to them.
  std::map<Device, std::unique_ptr<Backend>> backends;
  std::map<Device, std::unique_ptr<Backend>> overrides;
  std::vector<std::unique_ptr<Backend>> retired;  // replaced overrides; tensors may still use them
};

BackendTable& table() {
  static auto* t = new BackendTable;  // never destroyed: see the member comment
  return *t;
}

}  // namespace

Backend& backend_for(const Device& device) {
  BackendTable& t = table();
  std::lock_guard lock(t.mu);
  if (auto it = t.overrides.find(device); it != t.overrides.end()) return *it->second;
  if (auto it = t.backends.find(device); it != t.backends.end()) return *it->second;
  const LogicalDevice& info = device_info(device);  // NotFound for an unknown device
  std::unique_ptr<Backend> be;
  if (device.is_cpu()) {
    be = make_cpu_backend(device, device_allocator(device), info.intra_op_threads);
  } else {
    be = make_gpu_backend(device, info.physical_index, device_allocator(device));
  }
  Backend& ref = *be;
  t.backends.emplace(device, std::move(be));
  return ref;
}

void set_backend_for_testing(const Device& device, std::unique_ptr<Backend> backend) {
  BackendTable& t = table();
  std::lock_guard lock(t.mu);
  if (auto it = t.overrides.find(device); it != t.overrides.end()) {
    t.retired.push_back(std::move(it->second));
    t.overrides.erase(it);
  }
  if (backend) t.overrides[device] = std::move(backend);
}

void reset_backends_for_testing() {
  BackendTable& t = table();
  std::lock_guard lock(t.mu);
  t.backends.clear();
  t.overrides.clear();
  t.retired.clear();
}

}  // namespace towerflow
