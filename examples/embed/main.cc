// Training through towerflow's public API: two CPU towers, the built-in dataset, SGD.
// Usage: embed [steps] (default 100). Prints the loss every 10 steps, then saves the model in
// safetensors format (readable with safetensors.torch.load_file).
#include <cstdio>
#include <cstdlib>

#include "core/platform/registry.h"
#include "data/data.h"
#include "io/model_state.h"
#include "models/models.h"
#include "optim/optim.h"
#include "tower/tower.h"

namespace tw = towerflow;

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 100;
  auto devices = tw::logical_devices(tw::ProcessOptions{.device_count = {{"CPU", 2}}});  // /cpu:0, /cpu:1
  tw::data::Builtin train{tw::data::Split::Train, {.train_size = 2048}};
  tw::data::Loader loader{train, {.batch = 64, .seed = 1}};
  tw::tower::Trainer trainer{tw::models::factory("tfcnn"), devices, {.reduction = tw::tower::AllReduce{}}};
  tw::optim::Sgd sgd{trainer.parameters(), {.lr = 0.02, .momentum = 0.9, .weight_decay = 5e-4}};
  for (int step = 0; step < steps;)
    for (const auto& batch : loader) {
      float loss = trainer.forward_backward(batch);  // split over the towers, all-reduce the gradients
      sgd.step();
      if (++step % 10 == 0) std::printf("step %d  loss %.4f  acc %.3f\n", step, loss, trainer.last_step().accuracy);
      if (step == steps) break;
    }
  tw::io::save_module(trainer.model(), "embed_model.safetensors");
  std::printf("%s\nsaved embed_model.safetensors\n", trainer.describe().c_str());
}
