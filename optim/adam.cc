#include "optim/adam.h"

#include "core/tensor/device_ops.h"
#include "core/tensor/optimizer_update.h"

namespace towerflow::optim {

namespace {
AdamUpdate as_update(const AdamOptions& o, bool decoupled, double lr, double weight_decay,
                      std::int64_t step) {
  return {.lr = static_cast<float>(lr), .beta1 = static_cast<float>(o.beta1),
          .beta2 = static_cast<float>(o.beta2), .eps = static_cast<float>(o.eps),
          .weight_decay = static_cast<float>(weight_decay), .decoupled_weight_decay = decoupled,
          .step = step};
}
}  // namespace

Adam::Adam(ParameterSet params, AdamOptions options, std::vector<ParameterGroup> groups)
    : Adam(std::move(params), options, false, std::move(groups)) {}

// The one rule (core/tensor/optimizer_update.h), checked here for every copy on any device.
Adam::Adam(ParameterSet params, AdamOptions options, bool decoupled, std::vector<ParameterGroup> groups)
    : Optimizer(std::move(params), options.lr, options.weight_decay, {"exp_avg", "exp_avg_sq"},
                std::move(groups)),
      options_(options),
      decoupled_(decoupled) {
  check_adam_update(as_update(options, decoupled, options.lr, options.weight_decay, 1));
}

AdamW::AdamW(ParameterSet params, AdamOptions options, std::vector<ParameterGroup> groups)
    : Adam(std::move(params), options, true, std::move(groups)) {}

void Adam::apply(const Device& device, std::span<float> p, std::span<const float> g,
                 std::span<const std::span<float>> state, const GroupStep& u) {
  adam_update_(device, p, g, state[0], state[1],
               as_update(options_, decoupled_, u.lr, u.weight_decay, u.step));
}

}  // namespace towerflow::optim
