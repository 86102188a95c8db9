#pragma once
// Private to core/cuda: what a GpuContext holds. Includes CUDA headers.

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "core/cuda/check.h"
#include "core/cuda/context.h"
#include "core/memory/allocator.h"

namespace towerflow::gpu {

// One convolution shape's cuDNN descriptors and chosen algorithms, made on first use.
struct ConvPlan {
  cudnnTensorDescriptor_t x_desc = nullptr;
  cudnnTensorDescriptor_t y_desc = nullptr;
  cudnnFilterDescriptor_t w_desc = nullptr;
  cudnnConvolutionDescriptor_t conv_desc = nullptr;
  bool have_fwd = false, have_bwd_data = false, have_bwd_filter = false;
  cudnnConvolutionFwdAlgo_t fwd{};
  cudnnConvolutionBwdDataAlgo_t bwd_data{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter{};
  std::size_t fwd_workspace = 0, bwd_data_workspace = 0, bwd_filter_workspace = 0;
  cudnnMathType_t base_math = CUDNN_FMA_MATH;  // the descriptor's mode: FMA, or DEFAULT with TF32
  cudnnMathType_t fwd_math = CUDNN_FMA_MATH, bwd_data_math = CUDNN_FMA_MATH,
                  bwd_filter_math = CUDNN_FMA_MATH;  // what each chosen algorithm was ranked with
  // The best-ranked supported, deterministic algorithm that needs no workspace, for when the
  // workspace cannot be allocated (Note [Choosing convolution algorithms] in conv.cc); `have_*`
  // false when cuDNN ranks none for the shape.
  bool have_fwd0 = false, have_bwd_data0 = false, have_bwd_filter0 = false;
  cudnnConvolutionFwdAlgo_t fwd0{};
  cudnnConvolutionBwdDataAlgo_t bwd_data0{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter0{};
  cudnnMathType_t fwd0_math = CUDNN_FMA_MATH, bwd_data0_math = CUDNN_FMA_MATH,
                  bwd_filter0_math = CUDNN_FMA_MATH;
  ConvPlan() = default;
  ConvPlan(const ConvPlan&) = delete;
  ConvPlan& operator=(const ConvPlan&) = delete;
  ~ConvPlan();
};

using ConvKey = std::array<int, 11>;  // the fields of Conv2dShape

struct GpuContext::Impl {
  GpuContextOptions opts;
  cudaStream_t stream = nullptr;
  cudnnHandle_t cudnn = nullptr;
  cublasHandle_t cublas = nullptr;

  std::map<ConvKey, std::unique_ptr<ConvPlan>> conv_plans;

  // Pinned staging for copies from and to pageable host memory: two buffers used in turn, each
  // with the event that says when the GPU is done with it. staging_mu guards them (and
  // next_staging) for a whole copy: besides the device's tower thread, other threads copy through
  // this context, such as a CPU tower that reads a GPU tensor (CpuBackend::copy_from_device calls
  // the GPU backend's copy_to_host) in a mixed /gpu:0,/cpu:0 run.
  static constexpr std::size_t kStagingBytes = 4 << 20;
  std::mutex staging_mu;
  std::array<void*, 2> staging{};
  std::array<cudaEvent_t, 2> staging_done{};
  int next_staging = 0;

  // Device-side report of input errors found by kernels (a class label out of range): [0] the
  // count, [1] the first bad label, [2] its row. Checked by synchronize().
  int* input_errors = nullptr;

  // cuBLAS's workspace, from the device's pool rather than a private cudaMalloc, so the pool's
  // statistics and limits cover it.
  void* cublas_workspace = nullptr;

  // Makes this context's GPU current and names it in errors for the scope.
  detail::DeviceScope scope() const { return detail::DeviceScope(opts.device, opts.ordinal); }
  void* allocate(std::size_t bytes) const { return opts.allocator->allocate(bytes); }
};

inline cudaStream_t stream_of(const GpuContext& ctx) { return ctx.impl().stream; }

// Blocks and threads for an elementwise kernel over n elements (grid-stride loops cover the rest).
struct Launch {
  unsigned blocks;
  unsigned threads;
};
inline Launch launch_for(std::int64_t n, unsigned threads = 256) {
  const std::int64_t max_blocks = 65535LL * 8;
  std::int64_t blocks = (n + threads - 1) / threads;
  if (blocks > max_blocks) blocks = max_blocks;
  if (blocks < 1) blocks = 1;
  return {static_cast<unsigned>(blocks), threads};
}

}  // namespace towerflow::gpu
