#pragma once
// The hyper-parameters of one fused optimizer update over a flat buffer (Backend::sgd_update and
// Backend::adam_update, core/tensor/backend_impl.h), with PyTorch's semantics (torch.optim SGD,
// Adam and AdamW, single-tensor formulas), and the one rule that validates them for every backend
// and for optim/ alike, so that a value one device accepts is never refused by another.

#include <cmath>
#include <cstdint>

#include "core/error.h"

namespace towerflow {

// d = g + weight_decay * p
// momentum != 0: buf = first_step ? d : momentum * buf + (1 - dampening) * d
//                d = nesterov ? d + momentum * buf : buf
// p -= lr * d
struct SgdUpdate {
  float lr = 0.01f;
  float momentum = 0.0f;
  float dampening = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
  bool first_step = false;  // PyTorch starts the momentum buffer at the first gradient
};

// m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g^2
// p -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
struct AdamUpdate {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool decoupled_weight_decay = false;  // false: Adam (g += wd * p); true: AdamW (p *= 1 - lr * wd)
  std::int64_t step = 1;                // 1 for the first update (bias corrections use it)
};

// PyTorch's rules: lr >= 0, momentum >= 0, dampening in [0, 1], weight_decay >= 0, nesterov
// only with momentum > 0 and dampening 0. Throws InvalidArgument naming the value.
inline void check_sgd_update(const SgdUpdate& u) {
  if (!(u.lr >= 0.0f)) raise<InvalidArgument>("SGD learning rate ", u.lr, " must be >= 0");
  if (!(u.momentum >= 0.0f)) raise<InvalidArgument>("SGD momentum ", u.momentum, " must be >= 0");
  if (!(u.dampening >= 0.0f && u.dampening <= 1.0f))
    raise<InvalidArgument>("SGD dampening ", u.dampening, " must be in [0, 1]");
  if (!(u.weight_decay >= 0.0f))
    raise<InvalidArgument>("SGD weight_decay ", u.weight_decay, " must be >= 0");
  if (u.nesterov && (u.momentum <= 0.0f || u.dampening != 0.0f))
    raise<InvalidArgument>("SGD with nesterov needs momentum > 0 and dampening 0 (got momentum ",
                           u.momentum, ", dampening ", u.dampening, ")");
}

// PyTorch's rules (torch.optim.Adam): lr >= 0, betas in [0, 1), eps >= 0 (0 is allowed, as in
// PyTorch: a zero second moment then gives NaN, on every device alike), weight_decay >= 0,
// step >= 1. Throws InvalidArgument naming the value.
inline void check_adam_update(const AdamUpdate& u) {
  const char* name = u.decoupled_weight_decay ? "AdamW" : "Adam";
  if (!(u.lr >= 0.0f)) raise<InvalidArgument>(name, " learning rate ", u.lr, " must be >= 0");
  if (!(u.beta1 >= 0.0f && u.beta1 < 1.0f))
    raise<InvalidArgument>(name, " beta1 ", u.beta1, " must be in [0, 1)");
  if (!(u.beta2 >= 0.0f && u.beta2 < 1.0f))
    raise<InvalidArgument>(name, " beta2 ", u.beta2, " must be in [0, 1)");
  if (!(u.eps >= 0.0f)) raise<InvalidArgument>(name, " eps ", u.eps, " must be >= 0 (e.g. 1e-8)");
  if (!(u.weight_decay >= 0.0f))
    raise<InvalidArgument>(name, " weight_decay ", u.weight_decay, " must be >= 0");
  if (u.step < 1)
    raise<InvalidArgument>(name, " step ", u.step, " must be >= 1 (1 for the first update)");
}

}  // namespace towerflow
