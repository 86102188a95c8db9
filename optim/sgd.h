#pragma once
// SGD with momentum, dampening, Nesterov momentum and L2 weight decay, with PyTorch's exact
// semantics (torch.optim.SGD):
//   d = g + weight_decay * p
//   buf = d on the first step, then momentum * buf + (1 - dampening) * d
//   d = nesterov ? d + momentum * buf : buf          (when momentum != 0)
//   p -= lr * d
// Throws InvalidArgument for a negative lr, momentum or weight decay, a dampening outside [0, 1],
// and for Nesterov without momentum or with dampening (core/tensor/optimizer_update.h's rule, the
// one every device's update applies).

#include "optim/optimizer.h"

namespace towerflow::optim {

struct SgdOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

class Sgd final : public Optimizer {
 public:
  // groups: parameter groups (parameter_group.h); none: every slot takes the options' lr and
  // weight decay.
  Sgd(ParameterSet params, SgdOptions options, std::vector<ParameterGroup> groups = {});
  const SgdOptions& options() const { return options_; }
  std::string name() const override;

 private:
  void apply(const Device& device, std::span<float> p, std::span<const float> g,
             std::span<const std::span<float>> state, const GroupStep& u) override;
  SgdOptions options_;
};

}  // namespace towerflow::optim
