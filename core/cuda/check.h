#pragma once
// Private to core/cuda (includes CUDA headers): status checking for CUDA, cuDNN and cuBLAS.
//
// TW_CUDA_CHECK(call), TW_CUDNN_CHECK(call), TW_CUBLAS_CHECK(call) evaluate the call once and,
// on failure, throw gpu::CudaError: "<call text> failed on <device>: <status name> (<status text>)".
// The device is the logical device whose context is active on this thread (DeviceScope), or the
// CUDA ordinal current on this thread when no context is. NCCL's twin is in nccl_check.h.

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <string>

#include "core/cuda/status.h"
#include "core/device.h"

namespace towerflow::gpu::detail {

[[noreturn]] void raise_cuda(cudaError_t status, const char* call);
[[noreturn]] void raise_cudnn(cudnnStatus_t status, const char* call);
[[noreturn]] void raise_cublas(cublasStatus_t status, const char* call);

// The message raise_* would use, for tests and for code that reports without throwing.
std::string cuda_status_message(cudaError_t status, const char* call);
std::string cudnn_status_message(cudnnStatus_t status, const char* call);
std::string cublas_status_message(cublasStatus_t status, const char* call);

// "/gpu:1 (CUDA ordinal 0)" while a DeviceScope is active on this thread, else "CUDA ordinal 0"
// (or "no CUDA device" when the runtime cannot say).
std::string current_device_label();

// Makes a GPU current on this thread for the scope's lifetime (cudaSetDevice) and names it in
// error messages. The previous label is restored on exit; the CUDA device is left set, which is
// what every later call on this thread wants anyway (a thread works for one tower).
class DeviceScope {
 public:
  DeviceScope(const Device& device, int ordinal);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  Device previous_device_;
  int previous_ordinal_;
};

}  // namespace towerflow::gpu::detail

#define TW_CUDA_CHECK(call)                                             \
  do {                                                                  \
    const cudaError_t tw_status_ = (call);                              \
    if (tw_status_ != cudaSuccess) [[unlikely]]                         \
      ::towerflow::gpu::detail::raise_cuda(tw_status_, #call);          \
  } while (0)

#define TW_CUDNN_CHECK(call)                                            \
  do {                                                                  \
    const cudnnStatus_t tw_status_ = (call);                            \
    if (tw_status_ != CUDNN_STATUS_SUCCESS) [[unlikely]]                \
      ::towerflow::gpu::detail::raise_cudnn(tw_status_, #call);         \
  } while (0)

#define TW_CUBLAS_CHECK(call)                                           \
  do {                                                                  \
    const cublasStatus_t tw_status_ = (call);                           \
    if (tw_status_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]               \
      ::towerflow::gpu::detail::raise_cublas(tw_status_, #call);        \
  } while (0)

// After a kernel launch: a bad launch configuration surfaces here, naming the kernel.
#define TW_CUDA_CHECK_LAUNCH(kernel_name)                                       \
  do {                                                                          \
    const cudaError_t tw_status_ = cudaGetLastError();                          \
    if (tw_status_ != cudaSuccess) [[unlikely]]                                 \
      ::towerflow::gpu::detail::raise_cuda(tw_status_, "launch of " kernel_name); \
  } while (0)
