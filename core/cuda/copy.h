#pragma once
// Moving bytes between the host and GPUs, and between GPUs.
//
// Contract:
// - Every function makes the context's GPU current first and queues its copy on the context's
//   stream, so a copy is ordered after the kernels queued before it on that stream and before the
//   ones queued after it.
// - copy_to_device() returns as soon as `src` may be reused: the bytes are staged through the
//   context's pinned buffers (two buffers of 4 MiB, so staging the next piece overlaps the
//   transfer of the previous one). It does not wait for the copy itself, but before refilling a
//   staging buffer it waits until the stream has passed that buffer's previous transfer, which
//   was queued behind everything before it: so a copy may block until work queued before the
//   previous copy (two copies back for small ones) has finished, and a copy of more than 8 MiB
//   waits for its own first pieces. For a copy that never blocks, use copy_to_device_async
//   from a PinnedBuffer.
// - copy_to_device() and copy_to_host() may be called from several threads on one context (a
//   CPU tower reading a GPU tensor): the staging buffers are locked for the whole copy.
// - copy_to_host() returns when the bytes are in `dst` (it waits for the work queued before it).
// - The *_async variants need pinned host memory (a PinnedBuffer) and return at once; the host
//   memory must stay alive and untouched until the stream has passed the copy (synchronize() or
//   a GpuEvent recorded after it).
// - copy_between_devices() copies directly between two GPUs when the driver allows peer access
//   (enabled once per pair on first use), otherwise through pinned host memory. It runs on the
//   destination's stream after everything queued so far on the source's stream, and the source's
//   stream waits for it to finish: see Note [Copies order both streams] in copy.cc.
// - Zero bytes is a no-op. Failures raise CudaError naming the call and the device; a build
//   without CUDA raises DeviceError with kNoCudaBuildMessage.

#include <cstddef>

#include "core/cuda/context.h"

namespace towerflow::gpu {

void copy_to_device(const GpuContext& ctx, void* dst, const void* src, std::size_t bytes);
void copy_to_host(const GpuContext& ctx, void* dst, const void* src, std::size_t bytes);
void copy_device_to_device(const GpuContext& ctx, void* dst, const void* src, std::size_t bytes);
void copy_between_devices(const GpuContext& dst_ctx, void* dst, const GpuContext& src_ctx,
                          const void* src, std::size_t bytes);

void copy_to_device_async(const GpuContext& ctx, void* dst, const void* pinned_src,
                          std::size_t bytes);
void copy_to_host_async(const GpuContext& ctx, void* pinned_dst, const void* src,
                        std::size_t bytes);

// Sets `bytes` bytes at dst to `value` (asynchronously, on the stream).
void memset_device(const GpuContext& ctx, void* dst, int value, std::size_t bytes);

// True when GPUs a and b (CUDA ordinals) can read each other's memory directly.
bool can_access_peer(int ordinal_a, int ordinal_b);

// Page-locked host memory (cudaHostAlloc, portable to every GPU). Moves, does not copy.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(std::size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void* data() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  std::size_t size() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace towerflow::gpu
