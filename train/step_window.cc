#include "train/step_window.h"

namespace towerflow::train {

void StepWindow::add_step(double loss, double accuracy, int rows) {
  loss_ += loss;
  accuracy_ += accuracy;
  images_ += rows;
  ++steps_;
}

TrainRecord StepWindow::close(double seconds, const StepCounters& now) {
  TrainRecord r;
  if (steps_ > 0) {
    const double n = static_cast<double>(steps_);
    r.loss = loss_ / n;
    r.acc = accuracy_ / n;
    r.img_per_s = seconds > 0 ? static_cast<double>(images_) / seconds : 0;
    r.step_s = seconds > 0 ? seconds / n : 0;
    r.compute_s = (now.compute_s - opened_.compute_s) / n;
    r.reduction_s = (now.reduction_s - opened_.reduction_s) / n;
    r.optimizer_s = (now.optimizer_s - opened_.optimizer_s) / n;
    r.data_wait_s = data_wait_s_ / n;
  }
  *this = StepWindow(now);
  return r;
}

}  // namespace towerflow::train
