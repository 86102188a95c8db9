#pragma once
// Lookahead weight averaging as a run-loop hook (airbench94's; Zhang et al. 2019's Lookahead with
// an exponential moving average as the slow weights): every `every` steps the average moves
// towards the current weights and the weights are set to it,
//   average = decay * average + (1 - decay) * weights;   weights = average,
// over every parameter and buffer of the model (batch-norm running statistics included), with
// decay(step, total) growing over the run. After the run's last step the weights are set to the
// average (decay 1) and the evaluation sees them.
//
//   train::Lookahead lookahead({.every = 5, .decay = train::airbench_lookahead_decay});
//   train::fit(trainer, sgd, train_set, &test_set, options, {&lookahead});
//
// Contract:
// - on_start takes the average from the model as it starts (or, resuming, from the checkpoint's
//   hook tensors, "lookahead.<name>"), so a resumed run goes on exactly as an uninterrupted one.
// - The weights are changed on replica 0 and copied to every replica (Trainer::
//   broadcast_from_replica0); every process does the same arithmetic on the same values, so
//   replicas and processes stay identical.
// - InvalidArgument (at construction) for every < 1 or no decay; (at a step) for a decay outside
//   [0, 1]; DataError at on_start for a resumed checkpoint whose averages do not match the model.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "train/hook.h"

namespace towerflow::train {

// airbench94's: 0.95^5 * (step / total)^3: the average barely lags early in the run and carries
// more weight towards its end.
double airbench_lookahead_decay(std::int64_t step, std::int64_t total);

struct LookaheadOptions {
  int every = 5;
  std::function<double(std::int64_t step, std::int64_t total)> decay = airbench_lookahead_decay;
  bool final_copy = true;  // at the last step of the run, the weights become the average
};

class Lookahead : public Hook {
 public:
  explicit Lookahead(LookaheadOptions options = {});

  void on_start(const StartInfo& info) override;
  void on_step(const StepInfo& step) override;
  std::vector<optim::NamedState> save_tensors() const override;

  // The averages, by parameter or buffer name (for tests and inspection).
  const std::vector<optim::NamedState>& average() const { return average_; }

 private:
  void update(double decay);
  LookaheadOptions options_;
  tower::Trainer* trainer_ = nullptr;
  std::int64_t total_steps_ = 0;
  std::vector<optim::NamedState> average_;  // parameters, then buffers, in the model's order
};

}  // namespace towerflow::train
