#include "optim/sgd.h"

#include <cmath>

#include "core/tensor/backend_impl.h"
#include "core/error.h"
#include "core/tensor/optimizer_update.h"

namespace towerflow::optim {

namespace {
std::vector<std::string> sgd_state(const SgdOptions& o) {
  if (o.momentum == 0) return {};
  return {"momentum_buffer"};
}
}  // namespace

Sgd::Sgd(ParameterSet params, SgdOptions options)
    : Optimizer(std::move(params), options.lr, sgd_state(options)), options_(options) {
  if (!(options.momentum >= 0) || !std::isfinite(options.momentum))
    raise<InvalidArgument>("SGD momentum ", options.momentum, " is invalid; use a value >= 0 (e.g. 0.9)");
  if (!(options.weight_decay >= 0) || !std::isfinite(options.weight_decay))
    raise<InvalidArgument>("SGD weight_decay ", options.weight_decay,
                           " is invalid; use a value >= 0 (e.g. 5e-4)");
  if (options.nesterov && (options.momentum <= 0 || options.dampening != 0))
    raise<InvalidArgument>("SGD with nesterov = true needs momentum > 0 and dampening = 0 (got momentum ",
                           options.momentum, ", dampening ", options.dampening, ")");
  // The rule every backend's fused update applies (core/tensor/optimizer_update.h), checked once
  // here for every copy: a CPU copy refuses what a GPU copy would (dampening outside [0, 1]).
  check_sgd_update({.lr = static_cast<float>(options.lr), .momentum = static_cast<float>(options.momentum),
                    .dampening = static_cast<float>(options.dampening),
                    .weight_decay = static_cast<float>(options.weight_decay), .nesterov = options.nesterov});
}

std::string Sgd::name() const { return options_.nesterov ? "SGD (Nesterov)" : "SGD"; }

// The arithmetic is float, term for term as PyTorch's CPU kernels evaluate it (scalars rounded to
// float first), so updates agree with torch.optim.SGD to the last bit or two.
void Sgd::update(std::span<float> p, std::span<const float> g, std::span<const std::span<float>> state,
                 double lr_d, std::int64_t step) {
  const float lr = static_cast<float>(lr_d);
  const float wd = static_cast<float>(options_.weight_decay);
  const float mu = static_cast<float>(options_.momentum);
  const float keep = static_cast<float>(1.0 - options_.dampening);
  const std::size_t n = p.size();
  if (options_.momentum == 0) {
    for (std::size_t i = 0; i < n; ++i) {
      const float d = wd != 0 ? g[i] + wd * p[i] : g[i];
      p[i] -= lr * d;
    }
    return;
  }
  float* buf = state[0].data();
  const bool first = step == 1;
  for (std::size_t i = 0; i < n; ++i) {
    const float d = wd != 0 ? g[i] + wd * p[i] : g[i];
    const float b = first ? d : buf[i] * mu + keep * d;
    buf[i] = b;
    const float u = options_.nesterov ? d + mu * b : b;
    p[i] -= lr * u;
  }
}

void Sgd::update_device(Backend& backend, std::int64_t n, float* p, const float* g,
                        float* const* state, double lr, std::int64_t step) {
  backend.sgd_update(n, p, g, options_.momentum != 0 ? state[0] : nullptr,
                     {.lr = static_cast<float>(lr),
                      .momentum = static_cast<float>(options_.momentum),
                      .dampening = static_cast<float>(options_.dampening),
                      .weight_decay = static_cast<float>(options_.weight_decay),
                      .nesterov = options_.nesterov, .first_step = step == 1});
}

}  // namespace towerflow::optim
