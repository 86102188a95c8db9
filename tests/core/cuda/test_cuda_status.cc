// Status checking (CUDA builds only; no GPU needed): every failed CUDA, cuDNN, cuBLAS and NCCL
// status becomes a CudaError (a DeviceError) naming the call, the device and the status string.

#include <catch2/catch.hpp>

#include "test_skip.h"

#include "core/cuda/check.h"
#include "core/cuda/nccl_check.h"
#include "core/cuda/status.h"

namespace tw = towerflow;
namespace gpu = towerflow::gpu;
using Catch::Matchers::Contains;

namespace {
cudaError_t fake_cuda(cudaError_t s) { return s; }
cudnnStatus_t fake_cudnn(cudnnStatus_t s) { return s; }
cublasStatus_t fake_cublas(cublasStatus_t s) { return s; }
ncclResult_t fake_nccl(ncclResult_t s) { return s; }
}  // namespace

TEST_CASE("a failed CUDA call names the call, the device and the status", "[cuda-nogpu]") {
  REQUIRE_THROWS_AS([&] { TW_CUDA_CHECK(fake_cuda(cudaErrorMemoryAllocation)); }(), gpu::CudaError);
  REQUIRE_THROWS_AS([&] { TW_CUDA_CHECK(fake_cuda(cudaErrorMemoryAllocation)); }(), tw::DeviceError);
  REQUIRE_THROWS_WITH([&] { TW_CUDA_CHECK(fake_cuda(cudaErrorMemoryAllocation)); }(),
                      Contains("fake_cuda(cudaErrorMemoryAllocation) failed on ") &&
                          Contains("cudaErrorMemoryAllocation (out of memory)"));
  CHECK_NOTHROW([&] { TW_CUDA_CHECK(fake_cuda(cudaSuccess)); }());
}

TEST_CASE("the device in a status message is the active context's", "[cuda-nogpu]") {
  // Without a GPU, DeviceScope itself fails (cudaSetDevice) and says which device it wanted.
  const gpu::CudaAvailability a = gpu::cuda_availability();
  if (a.usable()) {
    gpu::detail::DeviceScope scope(tw::Device::gpu(3), 0);
    REQUIRE_THROWS_WITH([&] { TW_CUDA_CHECK(fake_cuda(cudaErrorInvalidValue)); }(),
                        Contains("on /gpu:3 (CUDA ordinal 0)"));
  } else {
    REQUIRE_THROWS_AS(gpu::detail::DeviceScope(tw::Device::gpu(3), 0), gpu::CudaError);
    REQUIRE_THROWS_WITH(gpu::detail::DeviceScope(tw::Device::gpu(3), 0),
                        Contains("cudaSetDevice(0) failed for /gpu:3 (CUDA ordinal 0)"));
    // Outside any scope the label says what the runtime knows.
    REQUIRE_THROWS_WITH([&] { TW_CUDA_CHECK(fake_cuda(cudaErrorInvalidValue)); }(),
                        Contains("failed on ") && Contains("cudaErrorInvalidValue"));
  }
}

TEST_CASE("a real CUDA call failing without a driver is a CudaError, not a crash",
          "[cuda-nogpu]") {
  if (gpu::cuda_availability().usable()) TW_SKIP("a usable GPU is here: no driver failure to provoke");
  void* p = nullptr;
  REQUIRE_THROWS_AS([&] { TW_CUDA_CHECK(cudaMalloc(&p, 1024)); }(), gpu::CudaError);
  REQUIRE_THROWS_WITH([&] { TW_CUDA_CHECK(cudaMalloc(&p, 1024)); }(), Contains("cudaMalloc(&p, 1024) failed on"));
  // The error does not stick: a later, unrelated check of success still passes.
  CHECK_NOTHROW([&] { TW_CUDA_CHECK(fake_cuda(cudaSuccess)); }());
}

TEST_CASE("cuDNN, cuBLAS and NCCL statuses become CudaError with their own words", "[cuda-nogpu]") {
  REQUIRE_THROWS_AS([&] { TW_CUDNN_CHECK(fake_cudnn(CUDNN_STATUS_BAD_PARAM)); }(), gpu::CudaError);
  REQUIRE_THROWS_WITH([&] { TW_CUDNN_CHECK(fake_cudnn(CUDNN_STATUS_BAD_PARAM)); }(),
                      Contains("fake_cudnn(CUDNN_STATUS_BAD_PARAM) failed on") &&
                          Contains("CUDNN_STATUS_BAD_PARAM"));
  REQUIRE_THROWS_AS([&] { TW_CUBLAS_CHECK(fake_cublas(CUBLAS_STATUS_NOT_INITIALIZED)); }(), gpu::CudaError);
  REQUIRE_THROWS_WITH([&] { TW_CUBLAS_CHECK(fake_cublas(CUBLAS_STATUS_NOT_INITIALIZED)); }(),
                      Contains("fake_cublas(CUBLAS_STATUS_NOT_INITIALIZED) failed on") &&
                          Contains("CUBLAS_STATUS_NOT_INITIALIZED"));
  REQUIRE_THROWS_AS([&] { TW_NCCL_CHECK(fake_nccl(ncclInvalidUsage)); }(), gpu::CudaError);
  REQUIRE_THROWS_WITH([&] { TW_NCCL_CHECK(fake_nccl(ncclInvalidUsage)); }(),
                      Contains("fake_nccl(ncclInvalidUsage) failed on") &&
                          Contains("ncclInvalidUsage (") );
  CHECK_NOTHROW([&] { TW_CUDNN_CHECK(fake_cudnn(CUDNN_STATUS_SUCCESS)); }());
  CHECK_NOTHROW([&] { TW_CUBLAS_CHECK(fake_cublas(CUBLAS_STATUS_SUCCESS)); }());
  CHECK_NOTHROW([&] { TW_NCCL_CHECK(fake_nccl(ncclSuccess)); }());
}
