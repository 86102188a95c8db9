#pragma once
// Private to core/cuda: what a GpuContext holds. Includes CUDA headers.

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "core/cuda/candidates.h"
#include "core/cuda/check.h"
#include "core/cuda/context.h"
#include "core/memory/allocator.h"

namespace towerflow::gpu {

// One cuDNN algorithm of a ConvChoice, kept as int (each direction has its own cuDNN enum).
struct ConvAlgo {
  int algo = 0;
  cudnnMathType_t math = CUDNN_FMA_MATH;  // what the algorithm was ranked with
  std::size_t workspace = 0;              // cudnnGetConvolution*WorkspaceSize for algo and math
};

// One direction's choice (forward, backward-data or backward-filter) of a ConvPlan, ranked on
// first use: Note [Choosing convolution algorithms] in conv.cc.
struct ConvChoice {
  bool ranked = false;
  // The ranking's usable algorithms, best first; the one that last ran is where calls start.
  Candidates<ConvAlgo> candidates;
  // The best-ranked one that needs no workspace, for when the workspace cannot be allocated.
  bool have_zero = false;
  ConvAlgo zero;
  bool found() const { return !candidates.empty(); }
};

// One convolution shape's cuDNN descriptors in one data type (float, or bf16 / fp16 with float
// accumulation), and its chosen algorithms, made on first use.
struct ConvPlan {
  cudnnTensorDescriptor_t x_desc = nullptr;
  cudnnTensorDescriptor_t y_desc = nullptr;
  cudnnFilterDescriptor_t w_desc = nullptr;
  cudnnConvolutionDescriptor_t conv_desc = nullptr;
  cudnnDataType_t data_type = CUDNN_DATA_FLOAT;
  // The descriptor's mode: FMA for float, DEFAULT with TF32, TENSOR_OP for 16-bit data.
  cudnnMathType_t base_math = CUDNN_FMA_MATH;
  bool tensor_ops = false;  // whether algorithms ranked with tensor-op math may be chosen
  ConvChoice fwd, bwd_data, bwd_filter;
  ConvPlan() = default;
  ConvPlan(const ConvPlan&) = delete;
  ConvPlan& operator=(const ConvPlan&) = delete;
  ~ConvPlan();
};

using ConvKey = std::array<int, 12>;  // the fields of Conv2dShape and the data type

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
