#pragma once
// StepWindow: the steps since the last training record. fit() adds every step to it and, every
// FitOptions::log_every steps, at an epoch's end and at the last step, closes it into a
// TrainRecord (records.h) of the window's means and per-step times, which opens the next window.

#include <cstdint>

#include "train/records.h"

namespace towerflow::train {

// Time spent so far, cumulative from the run's start (seconds): each window reports the part
// spent within it, per step.
struct StepCounters {
  double compute_s = 0;    // forward and backward, the slowest tower (tower::TrainerTimings)
  double reduction_s = 0;  // gradient reduction not hidden behind backward (the same)
  double optimizer_s = 0;  // the optimizer's update, as the loop timed it
};

class StepWindow {
 public:
  explicit StepWindow(const StepCounters& now = {}) : opened_(now) {}

  void add_data_wait(double seconds) { data_wait_s_ += seconds; }
  void add_step(double loss, double accuracy, int rows);

  std::int64_t steps() const { return steps_; }
  std::int64_t images() const { return images_; }

  // The window's record: loss, acc, img_per_s, step_s, compute_s, reduction_s, optimizer_s and
  // data_wait_s, for steps that took `seconds` of training time (checkpoint writing excluded);
  // the caller sets the rest (step, epoch, lr, ...). Opens the next window at `now`. A window
  // without steps gives zeros.
  TrainRecord close(double seconds, const StepCounters& now);

 private:
  StepCounters opened_;
  double loss_ = 0, accuracy_ = 0, data_wait_s_ = 0;
  std::int64_t steps_ = 0, images_ = 0;
};

}  // namespace towerflow::train
