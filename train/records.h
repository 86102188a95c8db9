#pragma once
// The records a run produces (train/hook.h passes them to hooks): a step, a window of steps
// (TrainRecord), an evaluation, a checkpoint; and their JSON lines, as metrics.jsonl stores them
// and the reporter's json progress prints them (with its own estimate of the time left).

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "train/checkpoint.h"

namespace towerflow::train {

struct StepInfo {
  std::int64_t step = 0;            // optimizer steps done (1 after the first)
  std::int64_t epoch = 0;           // the step's epoch (0-based)
  std::int64_t index_in_epoch = 0;  // the step's batch within its epoch (0-based)
  float loss = 0;                   // global-batch mean
  double accuracy = 0;              // top-1 over the global batch, in training mode
  int rows = 0;
  double lr = 0;                    // the rate this step applied
};

struct TrainRecord {
  std::int64_t step = 0;        // steps done (1 after the first)
  std::int64_t total_steps = 0;
  double epoch = 0;             // fractional: 2.5 is half-way through the third epoch
  int epochs = 0;
  double loss = 0;              // mean over the steps since the last record
  double acc = 0;               // training top-1 over the same steps, in [0, 1]
  double lr = 0;
  double img_per_s = 0;         // over the same steps, checkpoint writing excluded
  // Where a step's time went, per step over the same steps (seconds).
  double step_s = 0;            // from one batch to the next: data wait, step, optimizer, hooks
  double compute_s = 0;         // forward and backward (the slowest tower)
  double reduction_s = 0;       // gradient reduction not hidden behind backward
  double optimizer_s = 0;       // the optimizer's update
  double data_wait_s = 0;       // waiting for the loader's next batch
  // fp16 only (0 otherwise): the loss scale after the record's last step, and the steps skipped
  // for overflowing gradients since the run began (tower/loss_scale.h).
  double loss_scale = 0;
  std::int64_t skipped_steps = 0;
  // An auto split (tower::AutoSplit) only, else empty: the rows of every tower of every process
  // (global tower order) at the record's last step.
  std::vector<int> split = {};
};

// Which set an evaluation measured: "val" or "test" in metric names (val_acc, test_loss).
enum class EvalSet { Validation, Test };
std::string_view metric_prefix(EvalSet set);

struct EvalRecord {
  std::int64_t step = 0;
  double epoch = 0;
  EvalSet set = EvalSet::Test;
  // The set's loss and accuracy (the names are the test set's; `set` says which was measured).
  double test_loss = 0;
  double test_acc = 0;          // top-1 in [0, 1]
  std::int64_t examples = 0;
  double seconds = 0;
  double test_top5 = 0;         // top-5 in [0, 1] (top-k with k = the classes, where fewer than 5)
  // [true label][top-1 prediction] counts, classes x classes, row-major (tower::EvalResult).
  int classes = 0;
  std::vector<std::int64_t> confusion = {};
  int views = 1;                // test-time views per image (FitOptions::final_views)
};

struct CheckpointRecord {
  std::filesystem::path path;   // the checkpoint's directory
  TrainingPosition position;
  double seconds = 0;           // time taken to write it
};

// Each class's top-1 accuracy from a [true][predicted] confusion matrix (EvalRecord): nullopt for
// a class with no rows; all nullopt when the matrix is not classes x classes.
std::vector<std::optional<double>> class_accuracy(int classes, const std::vector<std::int64_t>& confusion);

// One JSON object each, short numbers (0.4321 rather than 0.43210000000000004), a non-finite loss
// as null: TrainRecord as "step", "epoch", "loss", "acc", "lr", "img_per_s" (and fp16's
// "loss_scale", "skipped_steps", an auto split's "split"); EvalRecord as "step", "epoch", "<set>_loss", "<set>_acc",
// "<set>_top5", "<set>_class_acc", "examples" (<set>: metric_prefix(set)).
std::string to_json(const TrainRecord& r);
std::string to_json(const EvalRecord& r);

}  // namespace towerflow::train
