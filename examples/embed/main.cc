// A whole training run through towerflow's public API: tfcnn on the default towers (every GPU,
// or without one two CPU towers: tower/devices.h), the built-in dataset, SGD with a cosine
// schedule, evaluation every epoch, a checkpoint every 50 steps in embed_run/. Run it again with more epochs and it continues where it stopped (resume).
// Usage: embed [epochs] (default 2).
#include <cstdio>
#include <cstdlib>

#include "data/data.h"
#include "models/models.h"
#include "optim/optim.h"
#include "tower/tower.h"
#include "train/train.h"

namespace tw = towerflow;

int main(int argc, char** argv) {
  const int epochs = argc > 1 ? std::atoi(argv[1]) : 2;
  // [docs:embed]
  auto devices = tw::tower::default_towers();  // every GPU, or two CPU towers: /cpu:0, /cpu:1
  tw::data::Builtin train{tw::data::Split::Train, {.train_size = 2048}};
  tw::data::Builtin test{tw::data::Split::Test, {.test_size = 500}};
  tw::tower::Trainer trainer{tw::models::factory("tfcnn"), devices, {.reduction = tw::tower::AllReduce{}}};
  tw::optim::Sgd sgd{trainer.parameters(), {.lr = 0.02, .momentum = 0.9, .weight_decay = 5e-4}};
  tw::train::Reporter progress;                               // start-up block, progress, summary
  tw::train::MetricsFile metrics{"embed_run/metrics.jsonl"};  // one JSON line per record
  auto result = tw::train::fit(trainer, sgd, train, &test,
                               {.batch = 64, .epochs = epochs, .schedule = tw::train::schedule("cosine", 0.02),
                                .train_dir = "embed_run", .save_every = 50, .resume = true},
                               {&progress, &metrics});
  // [end]
  std::printf("test accuracy %.2f%% after %lld steps; the model is in %s\n", 100 * result.test_acc,
              static_cast<long long>(result.steps), result.last_checkpoint.c_str());
}
