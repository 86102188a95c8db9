#pragma once
// device_free_lock(): the process-wide gate between freeing device memory and launching NCCL
// collectives. The CUDA sub-allocator holds it (as a BasicLockable: std::lock_guard) around every
// cudaFree / cudaFreeHost of a region (Note [Growth and back-off] in bfc_allocator.cc); the NCCL
// communicator announces each round of launches to it.
//
// Note [Device frees and NCCL launches]
// cudaFree synchronises the device. If one thread frees while a collective has been launched on
// some ranks of this process and another rank has yet to be launched, the free waits for a kernel
// that waits for a launch that may wait behind the free (the driver serialises them): a deadlock
// (NCCL's "Using multiple NCCL communicators concurrently"; PyTorch holds its allocator's free
// mutex around NCCL launches for the same reason). What must never happen is a free that
// *starts* while a round is half launched. So the gate is not a lock that a launching thread
// holds (a launch may wait for peer ranks, and a lock held there would make every other rank's
// launch wait behind it), but a count of launches owed:
// - launches_begin(n), when a round's participants have met on the host (never blocks): n
//   launches are owed. launch_done() by each participant once its launch has been enqueued (or
//   has failed): one fewer.
// - lock() (a free) waits until nothing is owed, then holds the gate; unlock() releases it.
//   A free that is waiting is served the moment the count reaches zero, before a later round's
//   launches may start, so back-to-back rounds cannot starve it.
// - A launcher calls wait_launch_allowed_for() before launching: it returns false while a free
//   holds the gate (the free started before the round was announced, so it waits only for fully
//   launched work and ends). The launcher polls it with its own abort and deadline checks.
// No thread ever holds the gate while it waits for a peer rank: a free holds it only across the
// cudaFree, and nothing a cudaFree waits for needs the gate.
// Header-only and free of CUDA, so both libraries that need it share the one instance without
// linking each other.

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace towerflow {

class DeviceFreeLock {
 public:
  // Free side (BasicLockable): waits until no collective round of this process is half launched,
  // and keeps new launches waiting until unlock().
  void lock() {
    std::unique_lock l(mu_);
    ++frees_waiting_;
    cv_.wait(l, [&] { return handoffs_ > 0 || (owed_ == 0 && !free_running_); });
    --frees_waiting_;
    if (handoffs_ > 0)
      --handoffs_;  // launch_done() already marked the gate taken for this free
    else
      free_running_ = true;
  }
  void unlock() {
    {
      std::lock_guard l(mu_);
      free_running_ = false;
    }
    cv_.notify_all();
  }

  // Launch side: see Note [Device frees and NCCL launches].
  void launches_begin(int n) {
    std::lock_guard l(mu_);
    owed_ += n;
  }
  void launch_done() {
    bool wake = false;
    {
      std::lock_guard l(mu_);
      --owed_;
      if (owed_ == 0 && frees_waiting_ > 0 && !free_running_) {
        free_running_ = true;  // taken for a waiting free before a later round may launch
        ++handoffs_;
        wake = true;
      }
    }
    if (wake) cv_.notify_all();
  }
  // True once no free holds the gate; false after `timeout` if one still does.
  bool wait_launch_allowed_for(std::chrono::microseconds timeout) {
    std::unique_lock l(mu_);
    return cv_.wait_for(l, timeout, [&] { return !free_running_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int owed_ = 0;           // launches announced and not yet enqueued (or failed)
  int frees_waiting_ = 0;  // frees blocked in lock()
  int handoffs_ = 0;       // gates taken by launch_done() for a waiting free, not yet claimed
  bool free_running_ = false;
};

inline DeviceFreeLock& device_free_lock() {
  static DeviceFreeLock gate;  // one per program: inline function, one static
  return gate;
}

}  // namespace towerflow
