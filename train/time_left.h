#pragma once
// The time a run has left, the reporter's estimate (train/reporter.h): it feeds it each record's
// window of steps and each evaluation's time.

#include <cstdint>

namespace towerflow::train {

// The time a run has left: training steps at their recent pace plus the evaluations still to come
// at their measured cost. The pace is an average over roughly the last kPaceSteps steps, so a slow
// start (caches, a busy machine) fades from the estimate instead of weighing on it to the end.
class TimeLeft {
 public:
  static constexpr double kPaceSteps = 500;
  void add_steps(std::int64_t steps, double seconds);  // a window of training steps
  void add_eval(double seconds);
  // Before any evaluation was timed, evaluations count as free.
  double seconds(std::int64_t steps_left, std::int64_t evals_left) const;

 private:
  double sec_per_step_ = 0;
  bool paced_ = false;
  double eval_seconds_ = 0;
  std::int64_t evals_ = 0;
};

// Evaluations a run still makes after `epochs_done` whole epochs of `epochs`: one every
// `eval_every` epochs (0: none on the way) and one at the end.
std::int64_t evals_left(std::int64_t epochs_done, std::int64_t epochs, int eval_every);

}  // namespace towerflow::train
