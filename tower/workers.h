#pragma once
// DeviceWorkers: one long-lived worker thread per device, the towers' threads.
//
// run(fn) calls fn(i) on worker i for every device at once and returns when every worker has
// finished. If any fn throws, run() waits for all of them to stop, then rethrows the *first*
// exception on the caller's thread (the one that happened first in time); the others are
// dropped. on_error (if set) is called, on the failing worker's thread, as soon as a worker
// fails, so that a caller can release towers blocked in a collective (Communicator::abort).
// Errors that are mere consequences of another's (CollectiveAborted) never count as "first":
// the original failure is what the caller sees.
//
// Each worker thread is bound to its device for its whole life: bind(device) runs on it once,
// first (e.g. select a CUDA device); the work of a CPU device runs through that device's
// CpuContext, so the workers add no threads that compete with the kernels.
//
// run() is not reentrant and is called from one thread at a time.

#include <exception>
#include <functional>
#include <memory>
#include <vector>

#include "core/device.h"

namespace towerflow::tower {

class DeviceWorkers {
 public:
  using Bind = std::function<void(const Device&)>;
  explicit DeviceWorkers(std::vector<Device> devices, Bind bind = {});
  ~DeviceWorkers();
  DeviceWorkers(const DeviceWorkers&) = delete;
  DeviceWorkers& operator=(const DeviceWorkers&) = delete;

  int size() const { return static_cast<int>(devices_.size()); }
  const std::vector<Device>& devices() const { return devices_; }

  void run(const std::function<void(int)>& fn,
           const std::function<void(int, std::exception_ptr)>& on_error = {});

 private:
  struct Impl;
  std::vector<Device> devices_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace towerflow::tower
