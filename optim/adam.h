#pragma once
// Adam and AdamW with PyTorch's exact semantics (torch.optim.Adam, torch.optim.AdamW):
//   Adam:  g += weight_decay * p                       (L2 penalty folded into the gradient)
//   AdamW: p *= 1 - lr * weight_decay                  (decoupled weight decay)
//   m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g^2
//   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// Throws InvalidArgument for a negative lr, eps or weight decay, or a beta outside [0, 1) (in
// float too: core/tensor/optimizer_update.h's rule, the one every device's update applies).

#include "optim/optimizer.h"

namespace towerflow::optim {

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // Adam: L2 in the gradient; AdamW: decoupled
};

class Adam : public Optimizer {
 public:
  // groups: parameter groups (parameter_group.h); a group's weight decay is L2 under Adam and
  // decoupled under AdamW, as the options'.
  Adam(ParameterSet params, AdamOptions options, std::vector<ParameterGroup> groups = {});
  const AdamOptions& options() const { return options_; }
  std::string name() const override { return decoupled_ ? "AdamW" : "Adam"; }

 protected:
  Adam(ParameterSet params, AdamOptions options, bool decoupled, std::vector<ParameterGroup> groups);

 private:
  void apply(const Device& device, std::span<float> p, std::span<const float> g,
             std::span<const std::span<float>> state, const GroupStep& u) override;
  AdamOptions options_;
  bool decoupled_;
};

// AdamW takes the options as given; adamw_defaults() has PyTorch's default weight decay (1e-2).
class AdamW final : public Adam {
 public:
  AdamW(ParameterSet params, AdamOptions options, std::vector<ParameterGroup> groups = {});
};

inline AdamOptions adamw_defaults() { return {.weight_decay = 1e-2}; }

}  // namespace towerflow::optim
