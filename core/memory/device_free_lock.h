#pragma once
// device_free_mutex(): the process-wide lock held around every cudaFree of a device region (the
// CUDA sub-allocator, when a pool gives regions back: Note [Growth and back-off] in
// bfc_allocator.cc) and around every NCCL collective launch (the NCCL communicator).
//
// Why: cudaFree synchronises the device. If one thread frees while NCCL has launched a collective
// on some ranks and another thread has yet to launch its part, the free waits for a kernel that
// waits for a launch that waits behind the free: a deadlock (NCCL's troubleshooting notes and
// thread-safety page; PyTorch holds its allocator's free mutex around NCCL calls for the same
// reason). Header-only and free of CUDA, so both libraries that need it can share the one
// instance without linking each other.

#include <mutex>

namespace towerflow {

inline std::mutex& device_free_mutex() {
  static std::mutex mutex;  // one per program: inline function, one static
  return mutex;
}

}  // namespace towerflow
