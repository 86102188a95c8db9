// Status checking: every CUDA, cuDNN and cuBLAS failure becomes a CudaError naming the call, the
// device and the library's own words for the status.

#include "core/cuda/check.h"

#include <utility>

namespace towerflow::gpu::detail {

namespace {

// The logical device of the context active on this thread (set by DeviceScope), held by value: a
// scope may be given a temporary (DeviceScope(Device::gpu(3), 0)) that dies before the scope does.
thread_local Device t_device{};
thread_local int t_ordinal = -1;  // -1: no scope is active

}  // namespace

DeviceScope::DeviceScope(const Device& device, int ordinal)
    : previous_device_(t_device), previous_ordinal_(t_ordinal) {
  t_device = device;
  t_ordinal = ordinal;
  // Every entry point goes through here, so no thread ever runs a kernel on the wrong GPU: tower
  // threads, loader threads and the caller's thread all get the right device set on first use.
  const cudaError_t status = cudaSetDevice(ordinal);
  if (status != cudaSuccess) {
    t_device = previous_device_;
    t_ordinal = previous_ordinal_;
    throw CudaError(str("cudaSetDevice(", ordinal, ") failed for ", device, " (CUDA ordinal ",
                        ordinal, "): ", cudaGetErrorName(status), " (", cudaGetErrorString(status),
                        ")"));
  }
}

DeviceScope::~DeviceScope() {
  t_device = previous_device_;
  t_ordinal = previous_ordinal_;
}

std::string current_device_label() {
  if (t_ordinal >= 0) return str(t_device, " (CUDA ordinal ", t_ordinal, ")");
  int ordinal = -1;
  if (cudaGetDevice(&ordinal) == cudaSuccess) return str("CUDA ordinal ", ordinal);
  cudaGetLastError();  // the failed query must not leave an error behind for the next call
  return "no CUDA device";
}

std::string cuda_status_message(cudaError_t status, const char* call) {
  return str(call, " failed on ", current_device_label(), ": ", cudaGetErrorName(status), " (",
             cudaGetErrorString(status), ")");
}

std::string cudnn_status_message(cudnnStatus_t status, const char* call) {
  // cuDNN 9 keeps a more specific message for the last failure on this thread; add it when there.
  char detail[512] = {0};
  cudnnGetLastErrorString(detail, sizeof detail);
  std::string message = str(call, " failed on ", current_device_label(), ": ",
                            cudnnGetErrorString(status), " (status ", static_cast<int>(status), ")");
  if (detail[0] != '\0') message += str("; cuDNN says: ", detail);
  return message;
}

std::string cublas_status_message(cublasStatus_t status, const char* call) {
  return str(call, " failed on ", current_device_label(), ": ", cublasGetStatusName(status), " (",
             cublasGetStatusString(status), ")");
}

void raise_cuda(cudaError_t status, const char* call) {
  // Clear a non-sticky error so that the next, unrelated call does not report it again.
  cudaGetLastError();
  throw CudaError(cuda_status_message(status, call));
}

void raise_cudnn(cudnnStatus_t status, const char* call) {
  throw CudaError(cudnn_status_message(status, call));
}

void raise_cublas(cublasStatus_t status, const char* call) {
  throw CudaError(cublas_status_message(status, call));
}

}  // namespace towerflow::gpu::detail
