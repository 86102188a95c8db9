#include "train/time_left.h"

#include <cmath>

namespace towerflow::train {

void TimeLeft::add_steps(std::int64_t steps, double seconds) {
  if (steps <= 0) return;
  const double pace = seconds / static_cast<double>(steps);
  // Each step's weight decays by e every kPaceSteps steps, whatever the window sizes.
  const double keep = paced_ ? std::exp(-static_cast<double>(steps) / kPaceSteps) : 0.0;
  sec_per_step_ = keep * sec_per_step_ + (1 - keep) * pace;
  paced_ = true;
}

void TimeLeft::add_eval(double seconds) {
  eval_seconds_ += seconds;
  ++evals_;
}

double TimeLeft::seconds(std::int64_t steps_left, std::int64_t evals_left) const {
  const double per_eval = evals_ > 0 ? eval_seconds_ / static_cast<double>(evals_) : 0.0;
  return sec_per_step_ * static_cast<double>(steps_left) + per_eval * static_cast<double>(evals_left);
}

std::int64_t evals_left(std::int64_t epochs_done, std::int64_t epochs, int eval_every) {
  if (epochs_done >= epochs) return 0;
  if (eval_every <= 0) return 1;
  const std::int64_t on_the_way = epochs / eval_every - epochs_done / eval_every;
  return on_the_way + (epochs % eval_every != 0 ? 1 : 0);
}

}  // namespace towerflow::train
