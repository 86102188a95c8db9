#include "optim/factory.h"

#include "core/error.h"
#include "optim/adam.h"
#include "optim/sgd.h"

namespace towerflow::optim {

std::vector<std::string> optimizer_names() { return {"sgd", "nesterov", "adam", "adamw"}; }

std::unique_ptr<Optimizer> make_optimizer(ParameterSet params, const OptimizerConfig& c) {
  if (c.name == "sgd" || c.name == "nesterov")
    return std::make_unique<Sgd>(std::move(params), SgdOptions{.lr = c.lr, .momentum = c.momentum,
                                                               .weight_decay = c.weight_decay,
                                                               .nesterov = c.name == "nesterov"});
  const AdamOptions a{.lr = c.lr, .beta1 = c.beta1, .beta2 = c.beta2, .eps = c.eps,
                      .weight_decay = c.weight_decay};
  if (c.name == "adam") return std::make_unique<Adam>(std::move(params), a);
  if (c.name == "adamw") return std::make_unique<AdamW>(std::move(params), a);
  raise<InvalidArgument>("optimizer '", c.name, "' is unknown; use one of sgd, nesterov, adam, adamw");
}

}  // namespace towerflow::optim
