// Softmax cross-entropy (with label smoothing) and top-k accuracy. One warp per row: class
// counts are small (10, 100, 1000), so a warp covers a row in a few strides and the row's max and
// sums come from warp shuffles without shared memory.

#include <cmath>

#include "core/cuda/context_impl.h"
#include "core/cuda/kernels_impl.h"
#include "core/cuda/ops.h"

namespace towerflow::gpu {

namespace {

constexpr int kWarpsPerBlock = 8;

__device__ float warp_max(float v) {
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Per row r: probs[r, :] = softmax(logits[r, :]);
// row_loss[r] = (1 - s) * (lse - x[label]) + s * (lse - mean_j x[j]), which is
// sum_j -q[j] * log_softmax(x)[j] for q = (1 - s) * onehot + s / classes.
__global__ void xent_forward_kernel(std::int64_t rows, int classes, const float* logits,
                                    const std::int32_t* labels, float smoothing, float* probs,
                                    float* row_loss, int* report) {
  const std::int64_t r = blockIdx.x * static_cast<std::int64_t>(kWarpsPerBlock) + threadIdx.y;
  if (r >= rows) return;
  const int lane = threadIdx.x;
  const float* x = logits + r * classes;
  float m = -INFINITY;
  for (int j = lane; j < classes; j += 32) m = fmaxf(m, x[j]);
  m = warp_max(m);
  float s = 0.0f, sx = 0.0f;
  for (int j = lane; j < classes; j += 32) {
    s += expf(x[j] - m);
    sx += x[j];
  }
  s = warp_sum(s);
  sx = warp_sum(sx);
  const float lse = m + logf(s);
  for (int j = lane; j < classes; j += 32) probs[r * classes + j] = expf(x[j] - m) / s;
  if (lane == 0) {
    const int label = labels[r];
    if (label < 0 || label >= classes) {
      if (atomicAdd(&report[0], 1) == 0) {
        report[1] = label;
        report[2] = static_cast<int>(r);
        report[3] = classes;
      }
      row_loss[r] = NAN;
    } else {
      row_loss[r] = (1.0f - smoothing) * (lse - x[label]) + smoothing * (lse - sx / classes);
    }
  }
}

__global__ void xent_backward_kernel(std::int64_t rows, int classes, const float* probs,
                                     const std::int32_t* labels, float inv_scale, float smoothing,
                                     const float* dloss, float* dlogits) {
  const std::int64_t n = rows * classes;
  const float g = dloss[0] * inv_scale;
  const float off = smoothing / classes;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(blockDim.x) * gridDim.x) {
    const std::int64_t r = i / classes;
    const int j = static_cast<int>(i - r * classes);
    const int label = labels[r];
    if (label < 0 || label >= classes) {  // reported by the forward; keep the gradient finite
      dlogits[i] = 0.0f;
      continue;
    }
    const float q = (j == label ? 1.0f - smoothing : 0.0f) + off;
    dlogits[i] = g * (probs[i] - q);
  }
}

__global__ void top_k_kernel(std::int64_t rows, int classes, const float* logits,
                             const std::int32_t* labels, int k, std::int32_t* correct) {
  const std::int64_t r = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (r >= rows) return;
  const int label = labels[r];
  if (label < 0 || label >= classes) return;
  const float* x = logits + r * classes;
  const float v = x[label];
  // A row with a NaN or an infinity is never correct, as on the CPU (cpu_backend.cc).
  bool finite = true;
  int above = 0;
  for (int j = 0; j < classes; ++j) {
    finite = finite && isfinite(x[j]);
    above += (x[j] > v || (x[j] == v && j < label)) ? 1 : 0;
  }
  if (finite && above < k) atomicAdd(correct, 1);
}

void check_rows(std::int64_t rows, int classes, const char* what) {
  if (rows < 0) raise<InvalidArgument>(what, ": rows ", rows, " is negative");
  if (classes < 1) raise<InvalidArgument>(what, ": classes ", classes, " must be at least 1");
}

void check_loss_args(float scale, float smoothing, const char* what) {
  if (!(scale > 0.0f))
    raise<InvalidArgument>(what, ": scale ", scale,
                           " must be positive (the global batch size the loss is divided by)");
  if (!(smoothing >= 0.0f && smoothing < 1.0f))
    raise<InvalidArgument>(what, ": label smoothing ", smoothing, " must be in [0, 1)");
}

}  // namespace

void softmax_cross_entropy_forward(const GpuContext& ctx, std::int64_t rows, int classes,
                                   const float* logits, const std::int32_t* labels, float scale,
                                   float smoothing, float* loss_out, float* probs) {
  check_rows(rows, classes, "softmax_cross_entropy_forward");
  check_loss_args(scale, smoothing, "softmax_cross_entropy_forward");
  auto scope = ctx.impl().scope();
  DeviceBuffer row_loss(ctx, static_cast<std::size_t>(rows) * sizeof(float));
  if (rows > 0) {
    const unsigned blocks = static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
    xent_forward_kernel<<<blocks, dim3(32, kWarpsPerBlock), 0, stream_of(ctx)>>>(
        rows, classes, logits, labels, smoothing, probs, row_loss.as<float>(),
        detail::input_error_report(ctx));
    TW_CUDA_CHECK_LAUNCH("xent_forward_kernel");
  }
  detail::sum_scaled(ctx, rows, row_loss.as<float>(), 1.0f / scale, loss_out);
}

void softmax_cross_entropy_backward(const GpuContext& ctx, std::int64_t rows, int classes,
                                    const float* probs, const std::int32_t* labels, float scale,
                                    float smoothing, const float* dloss, float* dlogits) {
  check_rows(rows, classes, "softmax_cross_entropy_backward");
  check_loss_args(scale, smoothing, "softmax_cross_entropy_backward");
  if (rows == 0) return;
  auto scope = ctx.impl().scope();
  const Launch l = launch_for(rows * classes);
  xent_backward_kernel<<<l.blocks, l.threads, 0, stream_of(ctx)>>>(
      rows, classes, probs, labels, 1.0f / scale, smoothing, dloss, dlogits);
  TW_CUDA_CHECK_LAUNCH("xent_backward_kernel");
}

void top_k_correct(const GpuContext& ctx, std::int64_t rows, int classes, const float* logits,
                   const std::int32_t* labels, int k, std::int32_t* correct_out) {
  check_rows(rows, classes, "top_k_correct");
  if (k < 1) raise<InvalidArgument>("top_k_correct: k ", k, " must be at least 1");
  auto scope = ctx.impl().scope();
  TW_CUDA_CHECK(cudaMemsetAsync(correct_out, 0, sizeof(std::int32_t), stream_of(ctx)));
  if (rows == 0) return;
  top_k_kernel<<<static_cast<unsigned>((rows + 255) / 256), 256, 0, stream_of(ctx)>>>(
      rows, classes, logits, labels, k, correct_out);
  TW_CUDA_CHECK_LAUNCH("top_k_kernel");
}

}  // namespace towerflow::gpu
