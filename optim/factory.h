#pragma once
// Optimizers by name, for command lines and config files.
//
//   auto opt = optim::make_optimizer(trainer.parameters(), {.name = "sgd", .lr = 0.1, .momentum = 0.9});
//
// Names: "sgd", "nesterov" (SGD with Nesterov momentum), "adam", "adamw". An unknown name throws
// InvalidArgument listing the known ones; option values are checked by each optimizer.

#include <memory>
#include <string>
#include <vector>

#include "optim/optimizer.h"

namespace towerflow::optim {

struct OptimizerConfig {
  std::string name = "sgd";
  double lr = 0.1;
  double momentum = 0.9;       // sgd, nesterov
  double weight_decay = 0.0;   // L2 (sgd, nesterov, adam) or decoupled (adamw)
  double beta1 = 0.9;          // adam, adamw
  double beta2 = 0.999;
  double eps = 1e-8;
};

std::unique_ptr<Optimizer> make_optimizer(ParameterSet params, const OptimizerConfig& config);
std::vector<std::string> optimizer_names();

}  // namespace towerflow::optim
