#pragma once
// The hyper-parameters of one fused optimizer update over a flat buffer (Backend::sgd_update and
// Backend::adam_update, core/tensor/backend_impl.h; every backend, the CPU's included, has them),
// with PyTorch's semantics (torch.optim SGD, Adam and AdamW, single-tensor formulas), and the one
// rule that validates them for every backend and for optim/ alike, so that a value one device
// accepts is never refused by another.

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
// only with momentum > 0 and dampening 0; every value finite. Throws InvalidArgument naming the
// field, the value and a usual value. The optimizer's constructor applies it once (optim/sgd.cc);
// each backend's op applies it again for its direct callers.
inline void check_sgd_update(const SgdUpdate& u) {
  auto non_negative = [](const char* field, float v, const char* usual) {
    if (!(v >= 0.0f) || !std::isfinite(v))
      raise<InvalidArgument>("SGD ", field, " ", v, " is invalid; use a finite value >= 0 (e.g. ",
                             usual, ")");
  };
  non_negative("lr", u.lr, "0.1");
  non_negative("momentum", u.momentum, "0.9");
  non_negative("weight_decay", u.weight_decay, "5e-4");
  if (!(u.dampening >= 0.0f && u.dampening <= 1.0f))
    raise<InvalidArgument>("SGD dampening ", u.dampening, " is invalid; use a value in [0, 1] (e.g. 0)");
  if (u.nesterov && (u.momentum <= 0.0f || u.dampening != 0.0f))
    raise<InvalidArgument>("SGD with nesterov needs momentum > 0 and dampening 0 (got momentum ",
                           u.momentum, ", dampening ", u.dampening, ")");
}

// PyTorch's rules (torch.optim.Adam): lr >= 0, betas in [0, 1) (in float: a beta that rounds to
// 1 is refused), eps >= 0 (0 is allowed, as in PyTorch: a zero second moment then gives NaN, on
// every device alike), weight_decay >= 0, step >= 1; every value finite. Throws InvalidArgument
// naming the field, the value and a usual value.
inline void check_adam_update(const AdamUpdate& u) {
  const char* name = u.decoupled_weight_decay ? "AdamW" : "Adam";
  auto non_negative = [&](const char* field, float v, const char* usual) {
    if (!(v >= 0.0f) || !std::isfinite(v))
      raise<InvalidArgument>(name, " ", field, " ", v, " is invalid; use a finite value >= 0 (e.g. ",
                             usual, ")");
  };
  auto beta = [&](const char* field, float v, const char* usual) {
    if (!(v >= 0.0f && v < 1.0f))
      raise<InvalidArgument>(name, " ", field, " ", v, " is invalid; use a value in [0, 1) (e.g. ",
                             usual, ")");
  };
  non_negative("lr", u.lr, "1e-3");
  beta("beta1", u.beta1, "0.9");
  beta("beta2", u.beta2, "0.999");
  non_negative("eps", u.eps, "1e-8");
  non_negative("weight_decay", u.weight_decay, u.decoupled_weight_decay ? "1e-2" : "0");
  if (u.step < 1)
    raise<InvalidArgument>(name, " step ", u.step, " must be >= 1 (1 for the first update)");
}

}  // namespace towerflow
