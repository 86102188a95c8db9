// The CUDA sub-allocators: device memory from cudaMalloc, pinned host memory from cudaHostAlloc.
//
// A refused region is not an error here: alloc() returns nullptr and the BFC pool above backs off
// (see Note [Growth and back-off] in core/memory/bfc_allocator.cc). The (non-sticky) CUDA error
// that a failed cudaMalloc leaves behind is cleared so that the next, smaller attempt and
// unrelated kernels on this thread do not see it.

#include <cuda_runtime.h>

#include <new>

#include "core/cuda/module_loading.h"
#include "core/error.h"
#include "core/log.h"
#include "core/memory/device_free_lock.h"
#include "core/memory/sub_allocators.h"

namespace towerflow {
namespace {

// Makes `ordinal` the calling thread's current device for one scope and restores the previous
// one afterwards: allocators are called from tower threads that have their own current device.
// The throwing form is for alloc(); free() runs in destructors, also while the process exits and
// the CUDA runtime is unloading, and uses the non-throwing form (ok() says whether it held).
class DeviceScope {
 public:
  explicit DeviceScope(int ordinal) {
    if (const cudaError_t err = enter(ordinal); err != cudaSuccess)
      raise<DeviceError>("cudaSetDevice(", ordinal, ") failed: ", cudaGetErrorString(err));
  }
  DeviceScope(int ordinal, std::nothrow_t) : status_(enter(ordinal)) {}
  ~DeviceScope() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

  bool ok() const { return status_ == cudaSuccess; }
  cudaError_t status() const { return status_; }

 private:
  cudaError_t enter(int ordinal) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ == ordinal) {
      previous_ = -1;  // nothing to restore
      return cudaSuccess;
    }
    const cudaError_t err = cudaSetDevice(ordinal);
    if (err != cudaSuccess) {
      cudaGetLastError();
      previous_ = -1;
    }
    return err;
  }

  int previous_ = -1;
  cudaError_t status_ = cudaSuccess;
};

class CudaSubAllocator final : public SubAllocator {
 public:
  explicit CudaSubAllocator(int ordinal) : ordinal_(ordinal) {}

  void* alloc(std::size_t bytes) override {
    DeviceScope scope(ordinal_);
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess) {
      cudaGetLastError();  // clear the error: a refused region is expected and handled above
      return nullptr;
    }
    return p;
  }
  void free(void* ptr, std::size_t bytes) override {
    if (ptr == nullptr) return;
    DeviceScope scope(ordinal_, std::nothrow);
    if (!scope.ok()) {
      // At exit, after the runtime has begun to unload, the driver reclaims the memory itself.
      if (scope.status() != cudaErrorCudartUnloading)
        log_warning(str("cannot free a ", bytes, "-byte region on CUDA device ", ordinal_, ": cudaSetDevice failed: ",
                        cudaGetErrorString(scope.status())));
      return;
    }
    // Never while a round of NCCL launches is half done: see device_free_lock.h.
    std::lock_guard lock(device_free_lock());
    const cudaError_t err = cudaFree(ptr);
    if (err != cudaSuccess) {
      cudaGetLastError();
      if (err == cudaErrorCudartUnloading) return;  // the process is exiting: see above
      // Called from destructors and release paths: report rather than throw.
      log_warning(str("cudaFree of a ", bytes, "-byte region on CUDA device ", ordinal_,
                      " failed: ", cudaGetErrorString(err)));
    }
  }
  std::string name() const override { return "cudaMalloc"; }

 private:
  int ordinal_;
};

class PinnedHostSubAllocator final : public SubAllocator {
 public:
  void* alloc(std::size_t bytes) override {
    void* p = nullptr;
    const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    if (err != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    return p;
  }
  void free(void* ptr, std::size_t bytes) override {
    if (ptr == nullptr) return;
    std::lock_guard lock(device_free_lock());  // cudaFreeHost synchronises too
    const cudaError_t err = cudaFreeHost(ptr);
    if (err != cudaSuccess) {
      cudaGetLastError();
      log_warning(str("cudaFreeHost of a ", bytes, "-byte pinned region failed: ", cudaGetErrorString(err)));
    }
  }
  std::string name() const override { return "cudaHostAlloc"; }
};

}  // namespace

std::unique_ptr<SubAllocator> make_cuda_sub_allocator(int cuda_ordinal) {
  if (cuda_ordinal < 0) raise<InvalidArgument>("CUDA device ordinal ", cuda_ordinal, " is negative; use 0 or above");
  gpu::load_cuda_modules_eagerly();  // may be the first CUDA call: Note [Eager CUDA module loading]
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    raise<DeviceError>("cannot allocate memory on CUDA device ", cuda_ordinal, ": cudaGetDeviceCount failed: ",
                       cudaGetErrorString(err));
  }
  if (cuda_ordinal >= count)
    raise<InvalidArgument>("CUDA device ordinal ", cuda_ordinal, " does not exist: the driver shows ", count,
                           count == 1 ? " device" : " devices", " (check CUDA_VISIBLE_DEVICES)");
  return std::make_unique<CudaSubAllocator>(cuda_ordinal);
}

std::unique_ptr<SubAllocator> make_pinned_host_sub_allocator() {
  gpu::load_cuda_modules_eagerly();  // may be the first CUDA call: Note [Eager CUDA module loading]
  return std::make_unique<PinnedHostSubAllocator>();
}

}  // namespace towerflow
