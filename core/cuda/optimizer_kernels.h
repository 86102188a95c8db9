#pragma once
// Optimizer updates on the GPU over flat parameter buffers, with PyTorch's semantics (torch.optim
// SGD, Adam and AdamW, single-tensor "foreach=False" formulas), for the optimizers in optim/.
//
// Contract:
// - params, grads and the state buffers are device memory of n floats each, on ctx's GPU; the
//   update is queued on ctx's stream (call it on the stream that produced the gradients, or order
//   it after them with a GpuEvent). grads is read only. Buffers must not overlap.
// - The state buffers are the caller's (zero-initialised for Adam; SGD's momentum buffer is
//   written on the first step, whatever it held).
// - Hyper-parameters are validated on the host: lr < 0, momentum < 0, dampening outside [0, 1],
//   weight_decay < 0, betas outside [0, 1), eps <= 0, step < 1, nesterov with momentum == 0 or
//   dampening != 0 throw InvalidArgument naming the value (PyTorch's own rules).
// - In a build without CUDA each function raises DeviceError with kNoCudaBuildMessage.

#include <cstdint>

#include "core/cuda/context.h"

namespace towerflow::gpu {

struct SgdStep {
  float lr = 0.01f;
  float momentum = 0.0f;
  float dampening = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
  bool first_step = false;  // PyTorch starts the momentum buffer at the first gradient
};

// d = g + weight_decay * p
// momentum != 0: buf = first_step ? d : momentum * buf + (1 - dampening) * d
//                d = nesterov ? d + momentum * buf : buf
// p -= lr * d
// momentum_buf may be null only when momentum == 0.
void sgd_update(const GpuContext& ctx, std::int64_t n, float* params, const float* grads,
                float* momentum_buf, const SgdStep& step);

struct AdamStep {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool decoupled_weight_decay = false;  // false: Adam (g += wd * p); true: AdamW (p *= 1 - lr * wd)
  std::int64_t step = 1;                // 1 for the first update (bias corrections use it)
};

// m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g^2
// p -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
void adam_update(const GpuContext& ctx, std::int64_t n, float* params, const float* grads,
                 float* exp_avg, float* exp_avg_sq, const AdamStep& step);

}  // namespace towerflow::gpu
