// A process that writes checkpoints in a loop until it is killed: train/checkpoint.h's writer with
// the files of a real model and optimizer state, for the fault test that kills it at random points.
// Usage: checkpoint_writer DIR
#include <cstdio>
#include <span>
#include <vector>

#include "io/checkpoint_dir.h"
#include "models/models.h"
#include "optim/optim.h"
#include "train/checkpoint.h"

namespace tw = towerflow;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: checkpoint_writer DIR\n");
    return 2;
  }
  auto model = tw::models::make_model("tfcnn", tw::Device::cpu(0), {.num_classes = 10, .seed = 1});
  auto params = model->flat_parameters().to_host();
  tw::optim::Sgd sgd(tw::optim::ParameterSet::single(std::span<float>(params), std::span<const float>(params)),
                     {.lr = 0.1, .momentum = 0.9});
  tw::io::CheckpointDir dir(argv[1]);
  auto latest = dir.latest();
  for (std::int64_t step = latest ? latest->step + 1 : 1;; ++step)
    tw::train::save_checkpoint(dir, *model, sgd, {.step = step, .epoch = 0, .step_in_epoch = step}, {{"model", "tfcnn"}}, 3);
}
