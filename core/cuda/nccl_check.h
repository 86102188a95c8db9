#pragma once
// Private (includes nccl.h): TW_NCCL_CHECK(call) for the NCCL communicator, with the same message
// form as TW_CUDA_CHECK: "<call> failed on <device>: <ncclResult name> (<ncclGetErrorString>)".
// Header-only, so only the code that links NCCL pays for it.

#include <nccl.h>

#include "core/cuda/check.h"
#include "core/error.h"

namespace towerflow::gpu::detail {

inline const char* nccl_result_name(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
    default: return "ncclResult";
  }
}

inline std::string nccl_status_message(ncclResult_t r, const char* call) {
  return str(call, " failed on ", current_device_label(), ": ", nccl_result_name(r), " (",
             ncclGetErrorString(r), ")");
}

[[noreturn]] inline void raise_nccl(ncclResult_t r, const char* call) {
  throw CudaError(nccl_status_message(r, call));
}

}  // namespace towerflow::gpu::detail

#define TW_NCCL_CHECK(call)                                             \
  do {                                                                  \
    const ncclResult_t tw_status_ = (call);                             \
    if (tw_status_ != ncclSuccess) [[unlikely]]                         \
      ::towerflow::gpu::detail::raise_nccl(tw_status_, #call);          \
  } while (0)
