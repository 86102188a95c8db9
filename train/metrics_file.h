#pragma once
// MetricsFile: a hook of fit() that appends every training record (on_log) and evaluation to a
// JSON-lines file, one object per line, as the reporter's json mode prints them (without the
// ETA and timing fields): {"step", "epoch", "loss", "acc", "lr", "img_per_s"} and
// {"step", "epoch", "test_loss", "test_acc", "examples"}.
//
//   train::MetricsFile metrics{"run/metrics.jsonl"};
//   train::fit(trainer, sgd, train_set, &test_set, options, {&metrics});
//
// Contract: lines are whole even if the process is killed mid-write (io::LineAppender). The file
// reads as one run: a new run (StartInfo::position.step == 0) starts it empty; a resumed run
// drops the records of steps after its checkpoint (the interrupted run's, which it repeats) and a
// line cut short, then appends. DataError naming the path if it cannot be written.

#include <filesystem>

#include "io/atomic_file.h"
#include "train/hook.h"

namespace towerflow::train {

class MetricsFile : public Hook {
 public:
  explicit MetricsFile(std::filesystem::path path) : path_(std::move(path)) {}

  void on_start(const StartInfo& start) override;
  void on_log(const TrainRecord& r) override;
  void on_eval(const EvalRecord& r) override;
  std::vector<std::filesystem::path> files() const override { return {path_}; }

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  io::LineAppender out_;
};

}  // namespace towerflow::train
