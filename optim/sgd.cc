#include "optim/sgd.h"

#include "core/tensor/device_ops.h"
#include "core/tensor/optimizer_update.h"

namespace towerflow::optim {

namespace {
std::vector<std::string> sgd_state(const SgdOptions& o) {
  if (o.momentum == 0) return {};
  return {"momentum_buffer"};
}

SgdUpdate as_update(const SgdOptions& o, double lr, double weight_decay, std::int64_t step) {
  return {.lr = static_cast<float>(lr), .momentum = static_cast<float>(o.momentum),
          .dampening = static_cast<float>(o.dampening),
          .weight_decay = static_cast<float>(weight_decay), .nesterov = o.nesterov,
          .first_step = step == 1};
}
}  // namespace

// The one rule (core/tensor/optimizer_update.h), checked here for every copy on any device.
Sgd::Sgd(ParameterSet params, SgdOptions options, std::vector<ParameterGroup> groups)
    : Optimizer(std::move(params), options.lr, options.weight_decay, sgd_state(options), std::move(groups)),
      options_(options) {
  check_sgd_update(as_update(options, options.lr, options.weight_decay, 1));
}

std::string Sgd::name() const { return options_.nesterov ? "SGD (Nesterov)" : "SGD"; }

void Sgd::apply(const Device& device, std::span<float> p, std::span<const float> g,
                std::span<const std::span<float>> state, const GroupStep& u) {
  sgd_update_(device, p, g, options_.momentum != 0 ? state[0] : std::span<float>(),
              as_update(options_, u.lr, u.weight_decay, u.step));
}

}  // namespace towerflow::optim
