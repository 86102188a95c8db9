// Elementwise kernels: fill, roundings and conversions to bf16 and fp16, relu, gelu, add, mul, scale,
// axpy, bias_add. Grid-stride loops, so any n runs with a bounded grid; 64-bit indices, so
// tensors past 2^31 elements work.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/cuda/context_impl.h"
#include "core/cuda/kernels_impl.h"
#include "core/cuda/ops.h"

namespace towerflow::gpu {

namespace {

#define TW_GRID_STRIDE(i, n)                                                          \
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; \
       i < (n); i += static_cast<std::int64_t>(blockDim.x) * gridDim.x)

__global__ void fill_kernel(std::int64_t n, float value, float* y) {
  TW_GRID_STRIDE(i, n) y[i] = value;
}
// __float2bfloat16_rn rounds to nearest even and keeps NaN a NaN (cuda_bf16.h).
__global__ void round_to_bf16_kernel(std::int64_t n, const float* x, float* y) {
  TW_GRID_STRIDE(i, n) y[i] = __bfloat162float(__float2bfloat16_rn(x[i]));
}
__global__ void round_to_fp16_kernel(std::int64_t n, const float* x, float* y) {
  TW_GRID_STRIDE(i, n) y[i] = __half2float(__float2half_rn(x[i]));
}
// The operands and results of the tensor-core products (conv.cc, gemm.cc) in their 16-bit types.
__global__ void float_to_bf16_kernel(std::int64_t n, const float* x, __nv_bfloat16* y) {
  TW_GRID_STRIDE(i, n) y[i] = __float2bfloat16_rn(x[i]);
}
__global__ void float_to_fp16_kernel(std::int64_t n, const float* x, __half* y) {
  TW_GRID_STRIDE(i, n) y[i] = __float2half_rn(x[i]);
}
__global__ void bf16_to_float_kernel(std::int64_t n, const __nv_bfloat16* x, float* y) {
  TW_GRID_STRIDE(i, n) y[i] = __bfloat162float(x[i]);
}
__global__ void fp16_to_float_kernel(std::int64_t n, const __half* x, float* y) {
  TW_GRID_STRIDE(i, n) y[i] = __half2float(x[i]);
}
__global__ void relu_kernel(std::int64_t n, const float* x, float* y) {
  TW_GRID_STRIDE(i, n) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}
__global__ void relu_backward_kernel(std::int64_t n, const float* y, const float* dy, float* dx) {
  TW_GRID_STRIDE(i, n) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}
// GELU in the erf form of torch.nn.GELU(); erff and expf are CUDA's single-precision functions
// (within 2 ulp), against Eigen's vectorised ones on the CPU.
__global__ void gelu_kernel(std::int64_t n, const float* x, float* y) {
  TW_GRID_STRIDE(i, n) y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
}
__global__ void gelu_backward_kernel(std::int64_t n, const float* x, const float* dy, float* dx) {
  TW_GRID_STRIDE(i, n) {
    const float v = x[i];
    const float cdf = 0.5f * (1.0f + erff(v * 0.70710678118654752f));
    const float pdf = 0.39894228040143268f * expf(-0.5f * v * v);
    dx[i] = dy[i] * (cdf + v * pdf);
  }
}
__global__ void add_kernel(std::int64_t n, const float* a, const float* b, float* y) {
  TW_GRID_STRIDE(i, n) y[i] = a[i] + b[i];
}
__global__ void mul_kernel(std::int64_t n, const float* a, const float* b, float* y) {
  TW_GRID_STRIDE(i, n) y[i] = a[i] * b[i];
}
__global__ void scale_kernel(std::int64_t n, float alpha, const float* x, float* y) {
  TW_GRID_STRIDE(i, n) y[i] = alpha * x[i];
}
__global__ void axpy_kernel(std::int64_t n, float alpha, const float* x, float* y) {
  TW_GRID_STRIDE(i, n) y[i] += alpha * x[i];
}
__global__ void bias_add_kernel(std::int64_t n, int c, const float* x, const float* bias,
                                float* y) {
  TW_GRID_STRIDE(i, n) y[i] = x[i] + bias[i % c];
}
__global__ void add_relu_kernel(std::int64_t n, const float* residual, float* y) {
  TW_GRID_STRIDE(i, n) {
    const float v = residual ? y[i] + residual[i] : y[i];
    y[i] = v > 0.0f ? v : 0.0f;
  }
}

void check_n(std::int64_t n, const char* what) {
  if (n < 0) raise<InvalidArgument>(what, ": element count ", n, " is negative");
}

}  // namespace

void fill(const GpuContext& ctx, std::int64_t n, float value, float* y) {
  check_n(n, "fill");
  if (n == 0) return;
  auto scope = ctx.impl().scope();
  const Launch l = launch_for(n);
  fill_kernel<<<l.blocks, l.threads, 0, stream_of(ctx)>>>(n, value, y);
  TW_CUDA_CHECK_LAUNCH("fill_kernel");
}

void round_to_bf16(const GpuContext& ctx, std::int64_t n, const float* x, float* y) {
  check_n(n, "round_to_bf16");
  if (n == 0) return;
  auto scope = ctx.impl().scope();
  const Launch l = launch_for(n);
  round_to_bf16_kernel<<<l.blocks, l.threads, 0, stream_of(ctx)>>>(n, x, y);
  TW_CUDA_CHECK_LAUNCH("round_to_bf16_kernel");
}

void round_to_fp16(const GpuContext& ctx, std::int64_t n, const float* x, float* y) {
  check_n(n, "round_to_fp16");
  if (n == 0) return;
  auto scope = ctx.impl().scope();
  const Launch l = launch_for(n);
  round_to_fp16_kernel<<<l.blocks, l.threads, 0, stream_of(ctx)>>>(n, x, y);
  TW_CUDA_CHECK_LAUNCH("round_to_fp16_kernel");
}

void float_to_half(const GpuContext& ctx, Half t, std::int64_t n, const float* x, void* y) {
  check_n(n, "float_to_half");
  if (n == 0) return;
  auto scope = ctx.impl().scope();
  const Launch l = launch_for(n);
  if (t == Half::Bf16) {
    float_to_bf16_kernel<<<l.blocks, l.threads, 0, stream_of(ctx)>>>(
        n, x, static_cast<__nv_bfloat16*>(y));
    TW_CUDA_CHECK_LAUNCH("float_to_bf16_kernel");
  } else {
    float_to_fp16_kernel<<<l.blocks, l.threads, 0, stream_of(ctx)>>>(n, x, static_cast<__half*>(y));
    TW_CUDA_CHECK_LAUNCH("float_to_fp16_kernel");
  }
}

void half_to_float(const GpuContext& ctx, Half t, std::int64_t n, const void* x, float* y) {
  check_n(n, "half_to_float");
  if (n == 0) return;
  auto scope = ctx.impl().scope();
  const Launch l = launch_for(n);
  if (t == Half::Bf16) {
    bf16_to_float_kernel<<<l.blocks, l.threads, 0, stream_of(ctx)>>>(
        n, static_cast<const __nv_bfloat16*>(x), y);
    TW_CUDA_CHECK_LAUNCH("bf16_to_float_kernel");
  } else {
    fp16_to_float_kernel<<<l.blocks, l.threads, 0, stream_of(ctx)>>>(
        n, static_cast<const __half*>(x), y);
    TW_CUDA_CHECK_LAUNCH("fp16_to_float_kernel");
  }
}

void relu_forward(const GpuContext& ctx, std::int64_t n, const float* x, float* y) {
  check_n(n, "relu_forward");
  if (n == 0) return;
  auto scope = ctx.impl().scope();
  const Launch l = launch_for(n);
  relu_kernel<<<l.blocks, l.threads, 0, stream_of(ctx)>>>(n, x, y);
  TW_CUDA_CHECK_LAUNCH("relu_kernel");
}

void relu_backward(const GpuContext& ctx, std::int64_t n, const float* y, const float* dy,
                   float* dx) {
  check_n(n, "relu_backward");
  if (n == 0) return;
  auto scope = ctx.impl().scope();
  const Launch l = launch_for(n);
  relu_backward_kernel<<<l.blocks, l.threads, 0, stream_of(ctx)>>>(n, y, dy, dx);
  TW_CUDA_CHECK_LAUNCH("relu_backward_kernel");
}

void gelu_forward(const GpuContext& ctx, std::int64_t n, const float* x, float* y) {
  check_n(n, "gelu_forward");
  if (n == 0) return;
  auto scope = ctx.impl().scope();
  const Launch l = launch_for(n);
  gelu_kernel<<<l.blocks, l.threads, 0, stream_of(ctx)>>>(n, x, y);
  TW_CUDA_CHECK_LAUNCH("gelu_kernel");
}

void gelu_backward(const GpuContext& ctx, std::int64_t n, const float* x, const float* dy,
                   float* dx) {
  check_n(n, "gelu_backward");
  if (n == 0) return;
  auto scope = ctx.impl().scope();
  const Launch l = launch_for(n);
  gelu_backward_kernel<<<l.blocks, l.threads, 0, stream_of(ctx)>>>(n, x, dy, dx);
  TW_CUDA_CHECK_LAUNCH("gelu_backward_kernel");
}

void add(const GpuContext& ctx, std::int64_t n, const float* a, const float* b, float* y) {
  check_n(n, "add");
  if (n == 0) return;
  auto scope = ctx.impl().scope();
  const Launch l = launch_for(n);
  add_kernel<<<l.blocks, l.threads, 0, stream_of(ctx)>>>(n, a, b, y);
  TW_CUDA_CHECK_LAUNCH("add_kernel");
}

void mul(const GpuContext& ctx, std::int64_t n, const float* a, const float* b, float* y) {
  check_n(n, "mul");
  if (n == 0) return;
  auto scope = ctx.impl().scope();
  const Launch l = launch_for(n);
  mul_kernel<<<l.blocks, l.threads, 0, stream_of(ctx)>>>(n, a, b, y);
  TW_CUDA_CHECK_LAUNCH("mul_kernel");
}

void scale(const GpuContext& ctx, std::int64_t n, float alpha, const float* x, float* y) {
  check_n(n, "scale");
  if (n == 0) return;
  auto scope = ctx.impl().scope();
  const Launch l = launch_for(n);
  scale_kernel<<<l.blocks, l.threads, 0, stream_of(ctx)>>>(n, alpha, x, y);
  TW_CUDA_CHECK_LAUNCH("scale_kernel");
}

void axpy(const GpuContext& ctx, std::int64_t n, float alpha, const float* x, float* y) {
  check_n(n, "axpy");
  if (n == 0) return;
  auto scope = ctx.impl().scope();
  const Launch l = launch_for(n);
  axpy_kernel<<<l.blocks, l.threads, 0, stream_of(ctx)>>>(n, alpha, x, y);
  TW_CUDA_CHECK_LAUNCH("axpy_kernel");
}

void bias_add(const GpuContext& ctx, std::int64_t rows, int c, const float* x, const float* bias,
              float* y) {
  check_n(rows, "bias_add");
  if (c < 1) raise<InvalidArgument>("bias_add: channel count ", c, " must be at least 1");
  if (rows == 0) return;
  auto scope = ctx.impl().scope();
  const std::int64_t n = rows * c;
  const Launch l = launch_for(n);
  bias_add_kernel<<<l.blocks, l.threads, 0, stream_of(ctx)>>>(n, c, x, bias, y);
  TW_CUDA_CHECK_LAUNCH("bias_add_kernel");
}

namespace detail {

void add_relu_inplace(const GpuContext& ctx, std::int64_t n, const float* residual, float* y) {
  if (n == 0) return;
  auto scope = ctx.impl().scope();
  const Launch l = launch_for(n);
  add_relu_kernel<<<l.blocks, l.threads, 0, stream_of(ctx)>>>(n, residual, y);
  TW_CUDA_CHECK_LAUNCH("add_relu_kernel");
}

void relu_mask(const GpuContext& ctx, std::int64_t n, const float* y, const float* dy,
               float* out) {
  relu_backward(ctx, n, y, dy, out);
}

int* input_error_report(const GpuContext& ctx) { return ctx.impl().input_errors; }

}  // namespace detail

}  // namespace towerflow::gpu
