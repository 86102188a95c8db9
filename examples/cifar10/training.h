#pragma once
// cifar10_train and cifar10_eval as functions, so that tests run exactly what the programs run:
// flags in, the library's run loop (train::fit) and the command line's hooks out.
//
// run_training: resolves the devices (no GPU and no device options given: two logical CPU
// devices, the host's threads split between them, so the towers are exercised), opens the
// datasets, builds a tower::Trainer and an optimizer from the options, and runs train::fit with
// the reporter (start-up block, progress, summary), train_dir/metrics.jsonl and
// train_dir/confusion.json (the newest evaluation's confusion matrix) as hooks, plus
// any `extra` hooks. Everything fit() promises holds (train/fit.h): checkpoints every save_every
// steps and at the end, --resume continuing bit for bit. A new run in a train_dir that holds an
// earlier run's files changes nothing and raises InvalidArgument (naming --resume and
// --start_over), unless --start_over says move (the files go to train_dir/earlier-<time>/) or
// delete.
//
// Errors: options that do not fit raise InvalidArgument naming the flag; a non-finite loss
// raises NumericalError after the step that produced it was discarded (the last checkpoint is the
// last good state, and the message says where it is and which flags help); out of memory raises
// OutOfMemory whose message adds every device's allocator statistics and the flags that would help.

#include <array>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/platform/options.h"
#include "data/augment.h"
#include "examples/cifar10/train_options.h"
#include "train/train.h"

namespace towerflow::cifar10 {

using train::FitResult;
using train::Reporter;
using train::ReporterOptions;

// `given`: the training options the command line set (flags or the config file). With it, --resume
// continues the run with the options its checkpoint recorded, except those given and those of one
// invocation (is_invocation_option); the start-up block ("resumed options") lists each given value
// that differs from the run's. A different --model is refused (a checkpoint holds its own model's
// weights), and different data (kind, images, classes) unless --resume_new_data. Without `given`,
// every option counts as given: they are used as they are, and those that differ from the run's
// are listed all the same. --resume_from implies --resume; --init_from loads a
// checkpoint's or a state_dict's weights into a new run and cannot be combined with --resume.
FitResult run_training(const TrainOptions& options, ProcessOptions process, Reporter& reporter,
                       const std::vector<train::Hook*>& extra = {},
                       const std::optional<std::set<std::string>>& given = std::nullopt);

struct EvalOptions {
  std::string checkpoint = "train_dir";  // a train_dir (latest checkpoint), a ckpt-<step> dir or a file
  std::string model = {};                // empty: from the checkpoint's metadata
  std::string confusion = {};            // non-empty: the confusion matrix as JSON to this file
};
// The data set (data_dir, dataset, the built-in sizes) comes from the checkpoint's recorded
// options, except the options named in `given` (set by flags or a config file); the start-up
// block says which. A test loss that is not finite raises NumericalError naming the checkpoint
// and the likely causes, after the reporter showed the evaluation.
FitResult run_evaluation(const TrainOptions& options, const EvalOptions& eval, ProcessOptions process,
                         Reporter& reporter, const std::set<std::string>& given = {});

// --image_size, --mean, --std: the model's input size and its normalisation. InvalidArgument
// naming the flag for a value that does not parse.
struct Preprocessing {
  int height = 32, width = 32;
  std::array<float, 3> mean = data::kCifar10Mean;
  std::array<float, 3> std = data::kCifar10Std;
};
Preprocessing preprocessing(const TrainOptions& options);

// The towers a run uses. Fills in the default device options (see run_training) before the
// device registry is initialised; InvalidArgument for --devices / --num_gpus that do not fit.
std::vector<Device> choose_devices(const TrainOptions& options, ProcessOptions& process);

}  // namespace towerflow::cifar10
