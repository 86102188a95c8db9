#pragma once
// TensorBoard: a hook of fit() that writes TensorBoard event files (io::SummaryWriter) into a
// log directory (usually the train_dir), so `tensorboard --logdir DIR` shows the run.
//
//   train::TensorBoard tb{"runs/r20", {.histogram_every = 500}};
//   train::fit(trainer, sgd, train_set, &test_set, options, {&tb, &progress});
//
// Scalars, at every on_log record (steps) and evaluation:
//   train/loss, train/accuracy, train/learning_rate, train/images_per_second,
//   step_time/total_ms, step_time/compute_ms, step_time/reduction_ms, step_time/optimizer_ms,
//   step_time/data_wait_ms (per step, averaged since the previous record),
//   test/loss, test/accuracy, test/accuracy_top5 (val/ for the validation set).
// Histograms every histogram_every steps (0: none): weights/<name> and gradients/<name> of every
// parameter of replica 0 (after the step's update; under all-reduce its gradient is the reduced
// one, under a parameter device tower 0's).
//
// Each fit() writes a new event file; a resumed run first writes SessionLog START at the step
// after its checkpoint, so TensorBoard drops what the interrupted run logged past it and shows
// one continuous curve. files() are the event files in the log directory, so a new run treats
// them as an earlier run's (fit.h, start_over).

#include <cstdint>
#include <filesystem>
#include <memory>

#include "io/summary_writer.h"
#include "train/hook.h"

namespace towerflow::train {

struct TensorBoardOptions {
  std::int64_t histogram_every = 0;  // steps between weight and gradient histograms (0: none)
};

class TensorBoard : public Hook {
 public:
  explicit TensorBoard(std::filesystem::path logdir, TensorBoardOptions options = {});

  void on_start(const StartInfo& start) override;
  void on_step(const StepInfo& s) override;
  void on_log(const TrainRecord& r) override;
  void on_eval(const EvalRecord& r) override;
  void on_checkpoint(const CheckpointRecord&) override;
  void on_end(const FitResult&) override;
  std::vector<std::filesystem::path> files() const override;

  // The event file of the run under way (empty before on_start).
  std::filesystem::path event_file() const { return writer_ ? writer_->path() : std::filesystem::path(); }

 private:
  std::filesystem::path logdir_;
  TensorBoardOptions options_;
  std::unique_ptr<io::SummaryWriter> writer_;
  tower::Trainer* trainer_ = nullptr;
};

}  // namespace towerflow::train
