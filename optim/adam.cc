#include "optim/adam.h"

#include <cmath>
#include <string_view>

#include "core/tensor/backend_impl.h"
#include "core/error.h"
#include "core/tensor/optimizer_update.h"

namespace towerflow::optim {

namespace {
AdamOptions validated(AdamOptions o, const char* who) {
  if (!(o.beta1 >= 0 && o.beta1 < 1))
    raise<InvalidArgument>(who, " beta1 ", o.beta1, " is invalid; use a value in [0, 1) (e.g. 0.9)");
  if (!(o.beta2 >= 0 && o.beta2 < 1))
    raise<InvalidArgument>(who, " beta2 ", o.beta2, " is invalid; use a value in [0, 1) (e.g. 0.999)");
  if (!(o.eps >= 0)) raise<InvalidArgument>(who, " eps ", o.eps, " is invalid; use a value >= 0 (e.g. 1e-8)");
  if (!(o.weight_decay >= 0))
    raise<InvalidArgument>(who, " weight_decay ", o.weight_decay, " is invalid; use a value >= 0");
  // The rule every backend's fused update applies (core/tensor/optimizer_update.h), checked once
  // here for every copy: a CPU copy refuses what a GPU copy would (a beta that rounds to 1 in float).
  check_adam_update({.lr = static_cast<float>(o.lr), .beta1 = static_cast<float>(o.beta1),
                     .beta2 = static_cast<float>(o.beta2), .eps = static_cast<float>(o.eps),
                     .weight_decay = static_cast<float>(o.weight_decay),
                     .decoupled_weight_decay = std::string_view(who) == "AdamW", .step = 1});
  return o;
}
}  // namespace

Adam::Adam(ParameterSet params, AdamOptions options) : Adam(std::move(params), options, false) {}

Adam::Adam(ParameterSet params, AdamOptions options, bool decoupled)
    : Optimizer(std::move(params), options.lr, {"exp_avg", "exp_avg_sq"}),
      options_(validated(options, decoupled ? "AdamW" : "Adam")),
      decoupled_(decoupled) {}

AdamW::AdamW(ParameterSet params, AdamOptions options) : Adam(std::move(params), options, true) {}

// As torch.optim.Adam's single-tensor path: the bias corrections are computed in double and the
// element-wise work in float.
void Adam::update(std::span<float> p, std::span<const float> g, std::span<const std::span<float>> state,
                  double lr_d, std::int64_t step) {
  const AdamOptions& o = options_;
  const float b1 = static_cast<float>(o.beta1), b2 = static_cast<float>(o.beta2);
  const float one_m_b1 = static_cast<float>(1 - o.beta1), one_m_b2 = static_cast<float>(1 - o.beta2);
  const double bc1 = 1 - std::pow(o.beta1, static_cast<double>(step));
  const double bc2 = 1 - std::pow(o.beta2, static_cast<double>(step));
  const float step_size = static_cast<float>(lr_d / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float eps = static_cast<float>(o.eps);
  const float wd = static_cast<float>(o.weight_decay);
  const float decay = static_cast<float>(1 - lr_d * o.weight_decay);
  float* m = state[0].data();
  float* v = state[1].data();
  for (std::size_t i = 0; i < p.size(); ++i) {
    float gi = g[i];
    if (decoupled_) {
      if (wd != 0) p[i] *= decay;
    } else if (wd != 0) {
      gi = gi + wd * p[i];
    }
    m[i] = m[i] * b1 + one_m_b1 * gi;
    v[i] = v[i] * b2 + one_m_b2 * gi * gi;
    const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
    p[i] += -step_size * (m[i] / denom);
  }
}

void Adam::update_device(Backend& backend, std::int64_t n, float* p, const float* g,
                         float* const* state, double lr, std::int64_t step) {
  const AdamOptions& o = options_;
  backend.adam_update(n, p, g, state[0], state[1],
                      {.lr = static_cast<float>(lr), .beta1 = static_cast<float>(o.beta1),
                       .beta2 = static_cast<float>(o.beta2), .eps = static_cast<float>(o.eps),
                       .weight_decay = static_cast<float>(o.weight_decay),
                       .decoupled_weight_decay = decoupled_, .step = step});
}

}  // namespace towerflow::optim
