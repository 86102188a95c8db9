// Pooling, NHWC: max pooling with PyTorch's argmax (the flat h * w_in + w index of the chosen
// input within its image and channel) and average pooling with count_include_pad.
//
// Note [Native pooling kernels]
// These are native kernels rather than cuDNN's: cuDNN's max pool returns no indices, and
// cudnnPoolingBackward needs x and y for both modes, which the CPU twins' signatures (and the
// backend interface) do not carry. With indices, max-pool backward is a scatter and the tie rule
// is the CPU's (the first maximum in row, column order); average-pool backward gathers, so it is
// deterministic. Pooling is memory-bound, where cuDNN has no edge over a direct kernel.

#include <cmath>

#include "core/cuda/context_impl.h"
#include "core/cuda/ops.h"

namespace towerflow::gpu {

namespace {

struct PoolDims {
  int n, h, w, c, kh, kw, sh, sw, ph, pw, oh, ow;
};

// With Relu, y = relu(the maximum) (v < 0 ? 0 : v, NaN stays) and argmax -1 where y is not > 0,
// as the CPU twin.
template <bool Relu>
__global__ void max_pool_forward_kernel(PoolDims d, const float* x, float* y,
                                        std::int32_t* argmax) {
  const std::int64_t total = static_cast<std::int64_t>(d.n) * d.oh * d.ow * d.c;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       i < total; i += static_cast<std::int64_t>(blockDim.x) * gridDim.x) {
    const int ch = static_cast<int>(i % d.c);
    std::int64_t t = i / d.c;
    const int ox = static_cast<int>(t % d.ow);
    t /= d.ow;
    const int oy = static_cast<int>(t % d.oh);
    const std::int64_t img = t / d.oh;
    const float* xi = x + img * d.h * d.w * d.c;
    float best = -INFINITY;
    int best_index = -1;
    for (int i_ = 0; i_ < d.kh; ++i_) {
      const int iy = oy * d.sh - d.ph + i_;
      if (iy < 0 || iy >= d.h) continue;
      for (int j = 0; j < d.kw; ++j) {
        const int ix = ox * d.sw - d.pw + j;
        if (ix < 0 || ix >= d.w) continue;
        const float v = xi[(static_cast<std::int64_t>(iy) * d.w + ix) * d.c + ch];
        // NaN wins and propagates; of several NaNs the last one's index, as on the CPU and in
        // PyTorch's kernels (which take any NaN they meet).
        if (best_index < 0 || v > best || isnan(v)) {
          best = v;
          best_index = iy * d.w + ix;
        }
      }
    }
    if (Relu && !(best > 0.0f)) best_index = -1;
    y[i] = Relu && best < 0.0f ? 0.0f : best;
    if (argmax) argmax[i] = best_index;
  }
}

// An argmax of -1 (max_pool_relu_forward's, where its ReLU passes nothing) adds nothing.
__global__ void max_pool_backward_kernel(PoolDims d, const float* dy, const std::int32_t* argmax,
                                         float* dx) {
  const std::int64_t total = static_cast<std::int64_t>(d.n) * d.oh * d.ow * d.c;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       i < total; i += static_cast<std::int64_t>(blockDim.x) * gridDim.x) {
    const int ch = static_cast<int>(i % d.c);
    const std::int64_t img = i / (static_cast<std::int64_t>(d.c) * d.ow * d.oh);
    const int at = argmax[i];
    if (at < 0) continue;
    // Overlapping windows (stride < kernel) can pick the same input: add atomically.
    atomicAdd(dx + (img * d.h * d.w + at) * d.c + ch, dy[i]);
  }
}

__global__ void avg_pool_forward_kernel(PoolDims d, const float* x, float* y) {
  const std::int64_t total = static_cast<std::int64_t>(d.n) * d.oh * d.ow * d.c;
  const float inv = 1.0f / static_cast<float>(d.kh * d.kw);  // count_include_pad = true
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       i < total; i += static_cast<std::int64_t>(blockDim.x) * gridDim.x) {
    const int ch = static_cast<int>(i % d.c);
    std::int64_t t = i / d.c;
    const int ox = static_cast<int>(t % d.ow);
    t /= d.ow;
    const int oy = static_cast<int>(t % d.oh);
    const std::int64_t img = t / d.oh;
    const float* xi = x + img * d.h * d.w * d.c;
    float acc = 0.0f;
    for (int i_ = 0; i_ < d.kh; ++i_) {
      const int iy = oy * d.sh - d.ph + i_;
      if (iy < 0 || iy >= d.h) continue;
      for (int j = 0; j < d.kw; ++j) {
        const int ix = ox * d.sw - d.pw + j;
        if (ix < 0 || ix >= d.w) continue;
        acc += xi[(static_cast<std::int64_t>(iy) * d.w + ix) * d.c + ch];
      }
    }
    y[i] = acc * inv;
  }
}

// Each input element gathers the outputs whose windows cover it: no atomics, deterministic.
__global__ void avg_pool_backward_kernel(PoolDims d, const float* dy, float* dx) {
  const std::int64_t total = static_cast<std::int64_t>(d.n) * d.h * d.w * d.c;
  const float inv = 1.0f / static_cast<float>(d.kh * d.kw);
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       i < total; i += static_cast<std::int64_t>(blockDim.x) * gridDim.x) {
    const int ch = static_cast<int>(i % d.c);
    std::int64_t t = i / d.c;
    const int ix = static_cast<int>(t % d.w);
    t /= d.w;
    const int iy = static_cast<int>(t % d.h);
    const std::int64_t img = t / d.h;
    // Outputs oy with oy*sh - ph <= iy < oy*sh - ph + kh.
    const int py = iy + d.ph, px = ix + d.pw;
    const int oy_lo = py < d.kh ? 0 : (py - d.kh) / d.sh + 1;
    const int oy_hi = min(py / d.sh, d.oh - 1);
    const int ox_lo = px < d.kw ? 0 : (px - d.kw) / d.sw + 1;
    const int ox_hi = min(px / d.sw, d.ow - 1);
    float acc = 0.0f;
    for (int oy = oy_lo; oy <= oy_hi; ++oy)
      for (int ox = ox_lo; ox <= ox_hi; ++ox)
        acc += dy[((img * d.oh + oy) * d.ow + ox) * d.c + ch];
    dx[i] = acc * inv;
  }
}

PoolDims dims_of(const Pool2dShape& s) {
  s.validate();
  return {s.n, s.h, s.w, s.c, s.kh, s.kw, s.stride_h, s.stride_w, s.pad_h, s.pad_w, s.out_h(),
          s.out_w()};
}

void launch_max_pool_forward(const GpuContext& ctx, const Pool2dShape& s, const float* x, float* y,
                             std::int32_t* argmax, bool relu) {
  const PoolDims d = dims_of(s);
  auto scope = ctx.impl().scope();
  const Launch l = launch_for(static_cast<std::int64_t>(d.n) * d.oh * d.ow * d.c);
  if (relu)
    max_pool_forward_kernel<true><<<l.blocks, l.threads, 0, stream_of(ctx)>>>(d, x, y, argmax);
  else
    max_pool_forward_kernel<false><<<l.blocks, l.threads, 0, stream_of(ctx)>>>(d, x, y, argmax);
  TW_CUDA_CHECK_LAUNCH("max_pool_forward_kernel");
}

}  // namespace

void max_pool_forward(const GpuContext& ctx, const Pool2dShape& s, const float* x, float* y,
                      std::int32_t* argmax) {
  launch_max_pool_forward(ctx, s, x, y, argmax, false);
}

void max_pool_relu_forward(const GpuContext& ctx, const Pool2dShape& s, const float* x, float* y,
                           std::int32_t* argmax) {
  launch_max_pool_forward(ctx, s, x, y, argmax, true);
}

void max_pool_backward(const GpuContext& ctx, const Pool2dShape& s, const float* dy,
                       const std::int32_t* argmax, float* dx) {
  const PoolDims d = dims_of(s);
  auto scope = ctx.impl().scope();
  TW_CUDA_CHECK(cudaMemsetAsync(dx, 0,
                                static_cast<std::size_t>(d.n) * d.h * d.w * d.c * sizeof(float),
                                stream_of(ctx)));
  const Launch l = launch_for(static_cast<std::int64_t>(d.n) * d.oh * d.ow * d.c);
  max_pool_backward_kernel<<<l.blocks, l.threads, 0, stream_of(ctx)>>>(d, dy, argmax, dx);
  TW_CUDA_CHECK_LAUNCH("max_pool_backward_kernel");
}

void avg_pool_forward(const GpuContext& ctx, const Pool2dShape& s, const float* x, float* y) {
  const PoolDims d = dims_of(s);
  auto scope = ctx.impl().scope();
  const Launch l = launch_for(static_cast<std::int64_t>(d.n) * d.oh * d.ow * d.c);
  avg_pool_forward_kernel<<<l.blocks, l.threads, 0, stream_of(ctx)>>>(d, x, y);
  TW_CUDA_CHECK_LAUNCH("avg_pool_forward_kernel");
}

void avg_pool_backward(const GpuContext& ctx, const Pool2dShape& s, const float* dy, float* dx) {
  const PoolDims d = dims_of(s);
  auto scope = ctx.impl().scope();
  const Launch l = launch_for(static_cast<std::int64_t>(d.n) * d.h * d.w * d.c);
  avg_pool_backward_kernel<<<l.blocks, l.threads, 0, stream_of(ctx)>>>(d, dy, dx);
  TW_CUDA_CHECK_LAUNCH("avg_pool_backward_kernel");
}

}  // namespace towerflow::gpu
