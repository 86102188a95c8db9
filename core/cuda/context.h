#pragma once
// GpuContext: everything one logical GPU device needs to run kernels — its CUDA ordinal, its own
// stream, cuDNN and cuBLAS handles bound to that stream, and the per-shape algorithm caches.
//
// Contract:
// - One context per logical device. Two logical devices on the same physical GPU (virtual
//   devices) get two contexts and therefore two distinct streams.
// - Every entry point of the CUDA backend that takes a context first makes the context's GPU
//   current on the calling thread (cudaSetDevice), so tower threads, loader threads and the
//   caller's thread may all use a context without setting the device themselves.
// - Work is queued on the context's stream and the call returns without waiting; results are
//   ready after synchronize(), after a GpuEvent recorded later has completed, or for work queued
//   later on the same stream. A context is used by one thread at a time (the tower's), as a
//   CpuContext is; distinct contexts run concurrently. The one exception is copy_to_device /
//   copy_to_host (copy.h), which lock the context's pinned staging buffers and may be called
//   from any thread (a CPU tower reads a GPU tensor through this context in a mixed run).
// - Device memory comes from the allocator given in the options (the logical device's BFC
//   allocator), including cuDNN workspaces. Its frees are stream-ordered: see
//   Note [Stream-ordered frees] in context.cc.
// - Failures raise CudaError (a DeviceError) naming the call, the device and the status string.
//   In a build without CUDA, constructing a context raises DeviceError with kNoCudaBuildMessage.
// - No CUDA header is included here; raw_stream() hands the cudaStream_t out as void* for code
//   that does include them.

#include <cstddef>
#include <memory>

#include "core/cuda/status.h"
#include "core/device.h"

namespace towerflow {
class Allocator;
}

namespace towerflow::gpu {

struct GpuContextOptions {
  Device device = Device::gpu(0);   // the logical device, for messages and logs
  int ordinal = 0;                  // the CUDA ordinal of its physical GPU
  Allocator* allocator = nullptr;   // device memory (required); must outlive the context
  // Lets cuDNN and cuBLAS use TF32 tensor cores for float math: faster on Ampere and later, but
  // products lose precision (about 1e-3 relative), so parity with the CPU kernels is looser.
  bool allow_tf32 = false;
};

class GpuContext {
 public:
  // Throws InvalidArgument for a null allocator or an ordinal the driver does not show (naming the
  // devices that exist), CudaError when the stream or handles cannot be created, DeviceError
  // with kNoCudaBuildMessage in a build without CUDA.
  explicit GpuContext(GpuContextOptions opts);
  // Waits for the stream, then releases the handles. Never throws.
  ~GpuContext();
  GpuContext(const GpuContext&) = delete;
  GpuContext& operator=(const GpuContext&) = delete;

  const Device& device() const;
  int ordinal() const;
  Allocator& allocator() const;
  bool allow_tf32() const;

  // cudaSetDevice(ordinal) on the calling thread.
  void make_current() const;

  // Blocks until all work queued on the stream has finished. Raises CudaError for a failure of
  // that work, and InvalidArgument for input errors the kernels found on the device (a class
  // label out of range in softmax_cross_entropy).
  void synchronize() const;

  // The cudaStream_t, as an opaque pointer.
  void* raw_stream() const;

  // The backend's own state (handles, caches, staging buffers); defined in context_impl.h.
  struct Impl;
  Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// The context of a logical GPU device's tensor backend (core/tensor's backend_for(device) makes
// it on first use): for code outside the op set that must run on the same stream as the device's
// tensor ops, such as an optimizer update over the flat gradient buffer. Throws NotFound when no
// GPU backend exists for the device yet (call backend_for(device) first), and DeviceError with
// kNoCudaBuildMessage in a build without CUDA. Thread-safe; the context lives as long as the
// backend (until the process ends).
const GpuContext& context_for(const Device& device);

// DeviceBuffer: device memory from a context's allocator, returned when the buffer dies.
// The free is stream-ordered (Note [Stream-ordered frees]): work already queued on the context's
// stream may still use the memory; work on other streams must be ordered with a GpuEvent first.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const GpuContext& ctx, std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  std::size_t size() const { return bytes_; }

 private:
  Allocator* allocator_ = nullptr;
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

// GpuEvent: a point in a context's stream, for ordering other streams after it, for the host to
// wait on, and (with timing) for measuring GPU time between two events.
class GpuEvent {
 public:
  explicit GpuEvent(const GpuContext& ctx, bool timing = false);
  ~GpuEvent();
  GpuEvent(const GpuEvent&) = delete;
  GpuEvent& operator=(const GpuEvent&) = delete;

  // Marks the current end of the context's stream.
  void record();
  // Makes `other`'s stream wait (on the GPU, the host does not block) until the recorded point
  // has been reached. Works across devices.
  void make_wait(const GpuContext& other) const;
  // Blocks the host until the recorded point has been reached.
  void synchronize() const;
  // True when the recorded point has been reached (or nothing was recorded).
  bool done() const;
  // Milliseconds of GPU time from `start` to this event; both must be timing events, recorded
  // and complete. Throws InvalidArgument otherwise.
  float elapsed_ms_since(const GpuEvent& start) const;

 private:
  const GpuContext* ctx_;
  void* event_ = nullptr;  // cudaEvent_t
  bool timing_ = false;
  bool recorded_ = false;
};

}  // namespace towerflow::gpu
