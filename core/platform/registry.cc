#include "core/platform/registry.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "core/platform/device_allocators.h"

namespace towerflow {
namespace {

// Note [Registry concurrency]: initialisation and allocator creation take the mutex. Once
// `ready` is set (release), `devices` and `options` never change until a test reset, so readers
// only load `ready` (acquire) and read them without a lock. Allocators are published through
// atomics so device_allocator() takes no lock after a device's first use.
struct Registry {
  std::mutex mu;
  std::atomic<bool> ready{false};
  ProcessOptions options;
  std::vector<LogicalDevice> devices;
  std::vector<std::unique_ptr<Allocator>> owned;
  std::unique_ptr<std::atomic<Allocator*>[]> allocators;
  std::unique_ptr<Platform> test_platform;
  std::set<Device> logged_fallbacks;
};

// Never destroyed, like the backend table (core/tensor/backend.cc) whose GPU contexts hold memory
// from these allocators: destroying them at exit would free regions under live contexts, after
// the CUDA runtime may already have unloaded. The operating system reclaims both.
Registry& registry() {
  static auto* r = new Registry;
  return *r;
}

void ensure_initialised() {
  if (!registry().ready.load(std::memory_order_acquire)) initialise_devices(ProcessOptions{});
}

std::string existing_devices() {
  std::string out;
  for (const auto& d : registry().devices) out += (out.empty() ? "" : ", ") + d.device.str();
  return out;
}

std::ptrdiff_t find_device(const Device& d) {
  const auto& devices = registry().devices;
  auto it = std::find_if(devices.begin(), devices.end(), [&](const LogicalDevice& l) { return l.device == d; });
  return it == devices.end() ? -1 : it - devices.begin();
}

}  // namespace

const std::vector<LogicalDevice>& initialise_devices(const ProcessOptions& opts) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  if (r.ready.load(std::memory_order_acquire)) {
    std::vector<std::string> diffs = option_differences(r.options, apply_environment(opts, /*warn=*/false));
    if (!diffs.empty()) {
      std::string list;
      for (const auto& d : diffs) list += (list.empty() ? "" : "; ") + d;
      raise<InvalidArgument>("devices are already initialised with other options (now vs requested: ", list,
                             "); options are process-wide: pass the same ProcessOptions to every call, "
                             "and call initialise_devices before anything uses a device");
    }
    return r.devices;
  }
  ProcessOptions effective = apply_environment(opts);
  std::unique_ptr<Platform> system;
  const Platform* platform = r.test_platform.get();
  if (!platform) {
    system = make_system_platform();
    platform = system.get();
  }
  r.devices = resolve_logical_devices(effective, *platform);
  r.options = effective;
  r.owned.clear();
  r.owned.resize(r.devices.size());
  r.allocators = std::make_unique<std::atomic<Allocator*>[]>(r.devices.size());
  for (std::size_t i = 0; i < r.devices.size(); ++i) r.allocators[i].store(nullptr);
  if (effective.log_device_placement.value_or(false)) {
    std::string mapping = "Device mapping:";
    for (const auto& d : r.devices) mapping += str("\n", d.device.full_name(), " -> ", d.description);
    log_info(mapping);
  }
  r.ready.store(true, std::memory_order_release);
  return r.devices;
}

std::vector<Device> logical_devices(const ProcessOptions& opts) {
  const auto& devices = initialise_devices(opts);
  std::vector<Device> gpus, cpus;
  for (const auto& d : devices) (d.device.is_gpu() ? gpus : cpus).push_back(d.device);
  return gpus.empty() ? cpus : gpus;
}

std::vector<Device> logical_devices() {
  ensure_initialised();
  std::vector<Device> gpus, cpus;
  for (const auto& d : registry().devices) (d.device.is_gpu() ? gpus : cpus).push_back(d.device);
  return gpus.empty() ? cpus : gpus;
}

const std::vector<LogicalDevice>& all_logical_devices() {
  ensure_initialised();
  return registry().devices;
}

const LogicalDevice& device_info(const Device& d) {
  ensure_initialised();
  std::ptrdiff_t i = find_device(d);
  if (i < 0)
    raise<NotFound>("device ", d, " does not exist; the logical devices are ", existing_devices(),
                    " (visible_device_list, virtual_devices and device_count decide which exist)");
  return registry().devices[i];
}

Allocator& device_allocator(const Device& d) {
  const LogicalDevice& info = device_info(d);
  Registry& r = registry();
  std::ptrdiff_t i = &info - r.devices.data();
  if (Allocator* a = r.allocators[i].load(std::memory_order_acquire)) return *a;
  std::lock_guard lock(r.mu);
  if (!r.owned[i]) {
    r.owned[i] = detail::make_device_allocator(info);
    r.allocators[i].store(r.owned[i].get(), std::memory_order_release);
  }
  return *r.owned[i];
}

const ProcessOptions& process_options() {
  ensure_initialised();
  return registry().options;
}

Device place(const Device& d) {
  ensure_initialised();
  Registry& r = registry();
  if (find_device(d) >= 0) return d;
  if (!r.options.allow_soft_placement.value_or(false))
    raise<NotFound>("cannot place on ", d, ": it does not exist; the logical devices are ", existing_devices(),
                    ". Use one of those, or set allow_soft_placement=true to fall back to an existing device");
  Device fallback = find_device(Device{d.kind, 0}) >= 0 ? Device{d.kind, 0} : Device::cpu(0);
  std::lock_guard lock(r.mu);
  if (r.logged_fallbacks.insert(d).second)
    log_warning(str("soft placement: ", d, " does not exist (devices: ", existing_devices(), "); using ", fallback,
                    " instead"));
  return fallback;
}

void reset_devices_for_testing() {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  r.ready.store(false, std::memory_order_release);
  r.owned.clear();
  r.allocators.reset();
  r.devices.clear();
  r.options = ProcessOptions{};
  r.test_platform.reset();
  r.logged_fallbacks.clear();
}

void set_platform_for_testing(std::unique_ptr<Platform> platform) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  r.test_platform = std::move(platform);
}

}  // namespace towerflow
