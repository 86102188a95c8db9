// docs/embedding.md: hooks. A hook of one's own (a class), and a LambdaHook that stops the run
// early; train::fit calls both. Usage: doc_hooks [train_dir] (default: hooks_run).
#include <algorithm>
#include <cstdio>
#include <string>

#include "core/platform/registry.h"
#include "data/data.h"
#include "models/models.h"
#include "optim/optim.h"
#include "tower/tower.h"
#include "train/train.h"

namespace tw = towerflow;

// [docs:hook]
// Prints every evaluation and remembers the best accuracy.
struct BestAccuracy : tw::train::Hook {
  double best = 0;
  void on_eval(const tw::train::EvalRecord& e) override {
    best = std::max(best, e.test_acc);
    std::printf("step %lld: test top-1 %.2f%% (best %.2f%%)\n", static_cast<long long>(e.step),
                100 * e.test_acc, 100 * best);
  }
};
// [end]

int main(int argc, char** argv) {
  const std::string train_dir = argc > 1 ? argv[1] : "hooks_run";
  auto devices = tw::logical_devices(tw::ProcessOptions{.device_count = {{"CPU", 2}}});
  tw::data::Builtin train{tw::data::Split::Train, {.train_size = 512}};
  tw::data::Builtin test{tw::data::Split::Test, {.test_size = 128}};
  tw::tower::Trainer trainer{tw::models::factory("tfcnn"), devices};
  tw::optim::Sgd sgd{trainer.parameters(), {.lr = 0.02, .momentum = 0.9}};
  // [docs:fit]
  BestAccuracy best;
  tw::train::LambdaHook early;   // plain functions; any hook may stop the run
  early.step = [&](const tw::train::StepInfo& s) {
    if (s.step == 6) early.stop_training("enough for this example");
  };
  auto result = tw::train::fit(trainer, sgd, train, &test,
                               {.batch = 64, .epochs = 3, .eval_every = 1, .train_dir = train_dir,
                                .start_over = tw::train::StartOver::Delete},
                               {&best, &early});
  // result.stopped_early, result.stop_reason, result.last_checkpoint ...
  // [end]
  std::printf("stopped after %lld steps: %s; best %.2f%%\n", static_cast<long long>(result.steps),
              result.stop_reason.c_str(), 100 * best.best);
  return result.stopped_early && result.steps == 6 ? 0 : 1;
}
