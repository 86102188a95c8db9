// Inverted dropout with a stateless counter-based mask (dropout_hash.h), identical to the CPU's.

#include "core/cuda/context_impl.h"
#include "core/cuda/dropout_hash.h"
#include "core/cuda/ops.h"

namespace towerflow::gpu {

namespace {

// keep_scale is 1/(1-p) rounded to float once, on the host, and multiplied in: the CPU's
// arithmetic (and PyTorch's), so kept values match it bit for bit (x / (1-p) differs in the last
// bit for about 7% of elements).
__global__ void dropout_forward_kernel(std::int64_t n, float p, float keep_scale,
                                       std::uint64_t seed, std::uint64_t offset, const float* x,
                                       float* y, std::uint8_t* mask) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(blockDim.x) * gridDim.x) {
    const bool keep = detail::dropout_keep(seed, offset + static_cast<std::uint64_t>(i), p);
    mask[i] = keep ? 1 : 0;
    y[i] = keep ? x[i] * keep_scale : 0.0f;
  }
}

__global__ void dropout_backward_kernel(std::int64_t n, float keep_scale, const std::uint8_t* mask,
                                        const float* dy, float* dx) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(blockDim.x) * gridDim.x)
    dx[i] = mask[i] ? dy[i] * keep_scale : 0.0f;
}

void check_p(float p, std::int64_t n, const char* what) {
  if (!(p >= 0.0f && p < 1.0f))
    raise<InvalidArgument>(what, ": drop probability ", p, " must be in [0, 1)");
  if (n < 0) raise<InvalidArgument>(what, ": element count ", n, " is negative");
}

}  // namespace

void dropout_forward(const GpuContext& ctx, std::int64_t n, float p, std::uint64_t seed,
                     std::uint64_t offset, const float* x, float* y, std::uint8_t* mask) {
  check_p(p, n, "dropout_forward");
  if (n == 0) return;
  auto scope = ctx.impl().scope();
  const Launch l = launch_for(n);
  dropout_forward_kernel<<<l.blocks, l.threads, 0, stream_of(ctx)>>>(n, p, 1.0f / (1.0f - p),
                                                                     seed, offset, x, y, mask);
  TW_CUDA_CHECK_LAUNCH("dropout_forward_kernel");
}

void dropout_backward(const GpuContext& ctx, std::int64_t n, float p, const std::uint8_t* mask,
                      const float* dy, float* dx) {
  check_p(p, n, "dropout_backward");
  if (n == 0) return;
  auto scope = ctx.impl().scope();
  const Launch l = launch_for(n);
  dropout_backward_kernel<<<l.blocks, l.threads, 0, stream_of(ctx)>>>(n, 1.0f / (1.0f - p), mask,
                                                                      dy, dx);
  TW_CUDA_CHECK_LAUNCH("dropout_backward_kernel");
}

}  // namespace towerflow::gpu
