#pragma once
// fit(): a whole training run of a tower::Trainer -- epochs, evaluation, checkpoints, resume,
// and hooks for everything a user watches. What cifar10_train runs, for any model and dataset.
//
//   tw::tower::Trainer trainer{my_model_factory, devices};
//   tw::optim::Sgd sgd{trainer.parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-4}};
//   tw::train::Reporter progress{{}};                       // progress lines, start-up block, summary
//   tw::train::MetricsFile metrics{"run/metrics.jsonl"};    // one JSON line per record
//   auto result = tw::train::fit(trainer, sgd, train_set, &test_set,
//                                {.batch = 128, .epochs = 30, .schedule = tw::train::schedule("cosine", 0.1),
//                                 .train_dir = "run", .save_every = 1000, .resume = true},
//                                {&progress, &metrics});
//
// Contract:
// - The data: a data::Loader over train_set with FitOptions' batch (the global batch, split over
//   the towers by the trainer), augmentation and seed, shuffled, the last partial batch dropped.
//   The order of samples and every random choice of augmentation are pure functions of (seed,
//   epoch, index), so a run is determined by its options and the initial model.
// - Length: max_steps if > 0, else epochs * steps_per_epoch. The schedule factory, if given, is
//   called once with the run's Plan and its schedule set on the optimizer.
// - Each step: trainer.forward_backward(batch); a loss that is not finite raises NumericalError
//   before the optimizer applies that step (naming the step, the learning rate and the last good
//   checkpoint), so parameters and checkpoints keep the last good state; else optimizer.step().
// - Evaluation: every eval_every epochs (0: only at the end) and at the end, of the validation set
//   (FitOptions::validation_set) when there is one, else of test_set; the test set is then
//   evaluated once, at the end (also when a hook stops the run early). Every image is used (the
//   last partial batch kept), in evaluation mode, normalised with augment's mean and std and not
//   augmented. A loss that is not finite raises NumericalError (naming the loss, the step and the
//   last checkpoint) after the hooks' on_eval saw it, before any further step or checkpoint.
// - Checkpoints (when train_dir is set): every save_every steps (0: none on the way) and at the
//   end, train_dir/ckpt-<step> written atomically (checkpoint.h), the newest keep_checkpoints kept
//   (0: all); one due at an epoch's last step is written after that epoch's evaluation. Their
//   metadata holds FitOptions::metadata plus the position, the seed and the hooks' state
//   (Hook::save_state).
// - Resume: with resume, the newest intact checkpoint in train_dir (read whole, every tensor's
//   checksum verified; checkpoint.h) is loaded into replica 0 and the optimizer (all or nothing;
//   DataError naming the tensor or field otherwise), broadcast to every replica, and training
//   continues at its step, epoch and batch: with the same options and devices the run ends with
//   the same parameters, bit for bit, as one never interrupted. Newer damaged checkpoints are
//   passed over with a warning naming each and why (and replaced as the run reaches their steps);
//   when every checkpoint there is damaged, DataError listing them. No checkpoint there: a new
//   run (logged). resume_from names the checkpoint instead (FitOptions).
// - An earlier run is never lost silently. A new run (no resume, or nothing to resume) in a
//   train_dir that holds checkpoints or the hooks' files (Hook::files) of an earlier run raises
//   TrainDirInUse before anything is touched, naming what is there, unless start_over says to
//   move those files aside (into train_dir/earlier-<UTC time>/) or to delete them (with resume
//   but no checkpoint to resume, they are moved aside unless start_over says more). Each run has
//   an id (metadata "run_id", kept on resume); rotation (keep_checkpoints) deletes only
//   checkpoints of the running run.
// - One run per train_dir: rank 0 holds io::TrainDirLock (train_dir/.lock) from before it reads
//   or writes anything there until fit() returns; another run on that train_dir, in this process
//   or another, raises io::TrainDirLocked (naming the holder's pid, host and start time) before
//   anything is touched. A lock left by a killed run on this host is taken over (logged).
// - FitResult::last_checkpoint is train_dir/ckpt-<final step> on every rank (rank 0 wrote it).
// - A checkpoint that cannot be written (a full disk, permissions) raises DataError naming the
//   path and the reason, leaves the earlier checkpoints as they were and no partial one; with
//   checkpoint_errors = Continue a periodic checkpoint's failure is logged and training goes on
//   (the final checkpoint's still raises).
// - Out of memory (in a step, an evaluation or a checkpoint) raises OutOfMemory whose message adds
//   every tower device's allocator statistics and what would make the run fit.
// - Hooks: see hook.h. fit() adds no output of its own beyond log messages (core/log.h).
// - Thread-safety: as the trainer's: one thread drives fit(). The datasets must not change.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "data/augment.h"
#include "data/views.h"
#include "io/safetensors.h"
#include "optim/schedule.h"
#include "train/hook.h"

namespace towerflow::tower {
struct EvalResult;
}

namespace towerflow::train {

// A new run would mix with an earlier run's files (see the contract); nothing was changed.
class TrainDirInUse : public InvalidArgument {
 public:
  TrainDirInUse(std::string message, std::filesystem::path dir, std::string found)
      : InvalidArgument(std::move(message)), dir(std::move(dir)), found(std::move(found)) {}
  std::filesystem::path dir;
  std::string found;  // "3 checkpoints (the latest ckpt-0000000117, step 117, written ...) and metrics.jsonl"
};

enum class StartOver {
  Refuse,     // raise TrainDirInUse
  MoveAside,  // move the earlier run's files into train_dir/earlier-<UTC time>/
  Delete,     // delete them
};

enum class CheckpointErrors {
  Stop,      // a checkpoint that cannot be written ends the run (DataError)
  Continue,  // a periodic one's failure is logged and training goes on
};

// Builds the learning-rate schedule once the run's length is known.
using ScheduleFactory = std::function<optim::LrSchedule(const Plan&)>;

// optim::parse_schedule's spec ("cosine", "step:32000,48000[:0.1]", "onecycle", "constant") over
// the run's length, after warmup_epochs of linear warm-up from 0 (rounded to whole steps).
// InvalidArgument for a spec that does not parse, or a warm-up not shorter than the run (the
// rate would never reach lr), when the factory is called.
ScheduleFactory schedule(std::string spec, double lr, double warmup_epochs = 0);

struct FitOptions {
  // the data
  int batch = 128;                 // global batch, over all towers
  data::Augment augment = {};      // training images (default: normalisation only)
  data::MixOptions mix = {};       // mixup / CutMix of training batches (data/augment.h)
  std::uint64_t seed = 1;          // data order and augmentation
  int loader_threads = 1;          // background threads preparing batches (0: on this thread)
  // the length
  int epochs = 1;
  std::int64_t max_steps = 0;      // > 0: this many steps, whatever epochs says
  ScheduleFactory schedule = {};   // empty: the optimizer's own lr or schedule
  // evaluation and records
  int eval_every = 1;              // epochs between evaluations (0: only at the end)
  // Evaluated during training instead of the test set (data/subset.h's holdout makes one from
  // the training set); must outlive fit(). Null: the test set is evaluated during training.
  const data::Dataset* validation_set = nullptr;
  int eval_batch = 0;              // 0: batch
  // Test-time augmentation of the final evaluation of the test set (data/views.h; test_views(2)
  // is airbench94's): each row's logits summed over these views. Evaluations during training
  // stay plain. Empty: plain.
  std::vector<data::TestView> final_views = {};
  int log_every = 10;              // steps between on_log records
  // checkpoints
  std::filesystem::path train_dir = {};  // empty: no checkpoints and no resume
  std::int64_t save_every = 0;     // steps between checkpoints (0: only at the end)
  int keep_checkpoints = 5;        // newest N kept (0: all)
  bool resume = false;
  // With resume: this checkpoint of train_dir (find_checkpoint's forms: ckpt-200, 200, a path)
  // instead of the newest intact one; read whole, and a damaged one is an error. Newer
  // checkpoints there are moved into train_dir/earlier-<UTC time>/ first (logged), not replaced.
  std::filesystem::path resume_from = {};
  StartOver start_over = StartOver::Refuse;  // a new run where an earlier one left its files
  CheckpointErrors checkpoint_errors = CheckpointErrors::Stop;
  io::Metadata metadata = {};      // added to every checkpoint's train_state metadata
};

// The run's length for these options on this training set, without running anything.
// InvalidArgument when the batch is larger than the set (no step would be made).
Plan plan(const data::Dataset& train_set, const FitOptions& options);

FitResult fit(tower::Trainer& trainer, optim::Optimizer& optimizer, const data::Dataset& train_set,
              const data::Dataset* test_set, const FitOptions& options, const std::vector<Hook*>& hooks = {});

// Loss and top-1 accuracy of the trainer's model over every image of `set` (the final partial
// batch kept), in batches of `batch` split over the towers, each image through `transform`
// (normalisation only by default; fit() passes its augment's mean and std), and, with views, each
// row's logits summed over its test-time views (Trainer::evaluate).
tower::EvalResult evaluate(tower::Trainer& trainer, const data::Dataset& set, int batch, int loader_threads = 1,
                           const data::Augment& transform = data::eval_transform(),
                           const std::vector<data::TestView>& views = {});

// `e` with every device's allocator report and what would make the run fit (a smaller
// FitOptions::batch, GPU pool options, a larger ProcessOptions::memory_limit_mb), as fit() throws
// it; for an application whose out-of-memory happens before fit(), while building the model.
OutOfMemory explain_out_of_memory(const OutOfMemory& e, const std::vector<Device>& devices, int global_batch);

// Every device's allocator statistics as lines "  /cpu:0: in use ..., peak ..., limit ...", for
// out-of-memory reports.
std::string allocator_report(const std::vector<Device>& devices);

}  // namespace towerflow::train
