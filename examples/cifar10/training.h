#pragma once
// The trainer and the evaluator behind cifar10_train and cifar10_eval, as functions, so that
// tests run exactly what the programs run.
//
// run_training: resolves the devices (no GPU and no device options given: two logical CPU
// devices, the host's threads split between them, so the towers are exercised), opens the
// datasets, builds a tower::Trainer and an optimizer, resumes from the latest checkpoint in
// train_dir with --resume (a fresh run removes the checkpoints and metrics of an earlier run
// there, as the TensorFlow tutorial's trainer does), trains, evaluates every eval_every epochs
// and at the end, saves checkpoints every save_every steps and at the end, and reports through
// the Reporter.
//
// Errors: options that do not fit raise InvalidArgument naming the flag; a non-finite loss
// raises NumericalError after the step that produced it was discarded (the last checkpoint is the
// last good state, and the message says where it is); out of memory raises OutOfMemory whose
// message adds every device's allocator statistics and the flags that would help.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/platform/options.h"
#include "examples/cifar10/reporter.h"
#include "examples/cifar10/train_options.h"

namespace towerflow::cifar10 {

struct RunHooks {
  // Called after every optimizer step with the steps done; true ends the run on the spot, as a
  // crash would (no evaluation, no final checkpoint). For tests of resuming.
  std::function<bool(std::int64_t step)> abort_after_step = {};
};

struct RunResult {
  std::int64_t steps = 0;
  double test_loss = 0;
  double test_acc = 0;
  double train_img_per_s = 0;
  std::filesystem::path last_checkpoint = {};
  bool aborted = false;
};

RunResult run_training(const TrainOptions& options, ProcessOptions process, Reporter& reporter,
                       const RunHooks& hooks = {});

struct EvalOptions {
  std::string checkpoint = "train_dir";  // a train_dir (latest checkpoint), a ckpt-<step> dir or a file
  std::string model = {};                // empty: from the checkpoint's metadata
};
RunResult run_evaluation(const TrainOptions& options, const EvalOptions& eval, ProcessOptions process,
                         Reporter& reporter);

// The towers a run uses. Fills in the default device options (see run_training) before the
// device registry is initialised; InvalidArgument for --devices / --num_gpus that do not fit.
std::vector<Device> choose_devices(const TrainOptions& options, ProcessOptions& process);

}  // namespace towerflow::cifar10
