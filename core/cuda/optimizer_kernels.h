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
// - Hyper-parameters are validated on the host by check_sgd_update / check_adam_update
//   (core/tensor/optimizer_update.h, the rules optim/ applies on the CPU too): lr < 0,
//   momentum < 0, dampening outside [0, 1], weight_decay < 0, betas outside [0, 1), eps < 0,
//   step < 1, nesterov with momentum == 0 or dampening != 0 throw InvalidArgument naming the
//   value (PyTorch's own rules; eps = 0 is allowed, as in PyTorch).
// - The tensor backend of a GPU device exposes these as Backend::sgd_update / adam_update, which
//   is how optim/ reaches them.
// - In a build without CUDA each function raises DeviceError with kNoCudaBuildMessage.

#include <cstdint>

#include "core/cuda/context.h"
#include "core/tensor/optimizer_update.h"

namespace towerflow::gpu {

using SgdStep = SgdUpdate;    // core/tensor/optimizer_update.h
using AdamStep = AdamUpdate;

// d = g + weight_decay * p
// momentum != 0: buf = first_step ? d : momentum * buf + (1 - dampening) * d
//                d = nesterov ? d + momentum * buf : buf
// p -= lr * d
// momentum_buf may be null only when momentum == 0.
void sgd_update(const GpuContext& ctx, std::int64_t n, float* params, const float* grads,
                float* momentum_buf, const SgdStep& step);

// m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g^2
// p -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
void adam_update(const GpuContext& ctx, std::int64_t n, float* params, const float* grads,
                 float* exp_avg, float* exp_avg_sq, const AdamStep& step);

}  // namespace towerflow::gpu
