// Optimizer updates over flat buffers, PyTorch's formulas (torch/optim/sgd.py, adam.py, adamw.py,
// single-tensor path), one fused pass per update.

#include <cmath>

#include "core/cuda/context_impl.h"
#include "core/cuda/optimizer_kernels.h"

namespace towerflow::gpu {

namespace {

__global__ void sgd_kernel(std::int64_t n, float* p, const float* g, float* buf, SgdStep s) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(blockDim.x) * gridDim.x) {
    float d = g[i];
    if (s.weight_decay != 0.0f) d += s.weight_decay * p[i];
    if (s.momentum != 0.0f) {
      const float b = s.first_step ? d : s.momentum * buf[i] + (1.0f - s.dampening) * d;
      buf[i] = b;
      d = s.nesterov ? d + s.momentum * b : b;
    }
    p[i] -= s.lr * d;
  }
}

__global__ void adam_kernel(std::int64_t n, float* p, const float* g, float* m, float* v,
                            AdamStep s, float bias1, float bias2_sqrt) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(blockDim.x) * gridDim.x) {
    float grad = g[i];
    float param = p[i];
    if (s.weight_decay != 0.0f) {
      if (s.decoupled_weight_decay)
        param *= 1.0f - s.lr * s.weight_decay;
      else
        grad += s.weight_decay * param;
    }
    // PyTorch: exp_avg.lerp_(grad, 1 - beta1); exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2)
    const float mi = m[i] + (1.0f - s.beta1) * (grad - m[i]);
    const float vi = s.beta2 * v[i] + (1.0f - s.beta2) * grad * grad;
    m[i] = mi;
    v[i] = vi;
    // step_size = lr / bias1; denom = sqrt(v) / sqrt(bias2) + eps
    const float denom = sqrtf(vi) / bias2_sqrt + s.eps;
    p[i] = param - (s.lr / bias1) * (mi / denom);
  }
}

}  // namespace

void sgd_update(const GpuContext& ctx, std::int64_t n, float* params, const float* grads,
                float* momentum_buf, const SgdStep& step) {
  if (n < 0) raise<InvalidArgument>("sgd_update: element count ", n, " is negative");
  check_sgd_update(step);
  if (step.momentum != 0.0f && momentum_buf == nullptr)
    raise<InvalidArgument>("SGD with momentum ", step.momentum,
                           " needs a momentum buffer (momentum_buf is null)");
  if (n == 0) return;
  auto scope = ctx.impl().scope();
  const Launch l = launch_for(n);
  sgd_kernel<<<l.blocks, l.threads, 0, stream_of(ctx)>>>(n, params, grads, momentum_buf, step);
  TW_CUDA_CHECK_LAUNCH("sgd_kernel");
}

void adam_update(const GpuContext& ctx, std::int64_t n, float* params, const float* grads,
                 float* exp_avg, float* exp_avg_sq, const AdamStep& step) {
  const char* name = step.decoupled_weight_decay ? "AdamW" : "Adam";
  if (n < 0) raise<InvalidArgument>(name, " update: element count ", n, " is negative");
  check_adam_update(step);
  if (n == 0) return;
  // Bias corrections in double on the host: beta^step underflows gracefully and stays exact
  // enough for any step count.
  const double t = static_cast<double>(step.step);
  const float bias1 = static_cast<float>(1.0 - std::pow(static_cast<double>(step.beta1), t));
  const float bias2_sqrt =
      static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(step.beta2), t)));
  auto scope = ctx.impl().scope();
  const Launch l = launch_for(n);
  adam_kernel<<<l.blocks, l.threads, 0, stream_of(ctx)>>>(n, params, grads, exp_avg, exp_avg_sq,
                                                          step, bias1, bias2_sqrt);
  TW_CUDA_CHECK_LAUNCH("adam_kernel");
}

}  // namespace towerflow::gpu
