#pragma once
// Hooks: what a training run tells the code around it, and how that code stops it early.
//
//   struct PrintEvals : train::Hook {
//     void on_eval(const train::EvalRecord& e) override { std::printf("%.2f%%\n", 100 * e.test_acc); }
//   };
//   PrintEvals print;
//   train::fit(trainer, sgd, train_set, &test_set, options, {&print});
//
// Contract:
// - fit() calls every hook in the order given, on the thread that called fit(), at these points:
//     on_start      once, after the model, optimizer and position are set up (a resumed run has
//                   loaded its checkpoint) and before the first step;
//     on_step       after every optimizer step, with that step's loss and accuracy;
//     on_log        every FitOptions::log_every steps, at the last step and at the end of each
//                   epoch, with the means over the steps since the previous record;
//     on_epoch_end  after an epoch's last step (before its evaluation), and when a run stops
//                   inside an epoch;
//     on_eval       after each evaluation (of the validation set during training when there is
//                   one, and of the test set at the end; EvalRecord::set says which);
//     on_checkpoint after each checkpoint is complete on disk;
//     on_end        once, after the final evaluation and checkpoint, with the run's result.
//   Records are valid during the call only. Hooks must not step the optimizer or run the trainer.
// - stop_training(reason), from any of these calls, ends the run after the current step (or,
//   from on_eval / on_epoch_end, before the next epoch) as if it were the last one: the final
//   evaluation (unless evaluate is false), the final checkpoint and on_end follow, and FitResult
//   says why it stopped. Resuming such a run continues it to its planned end.
// - files(): the files (or directories) a hook writes for a run (a metrics file, event files, a
//   best checkpoint). A new run treats them, like checkpoints, as an earlier run's (see
//   FitOptions::start_over).
// - save_state(metadata): before each checkpoint is written, what a hook needs to go on alike in a
//   resumed run (a best value, a count); the checkpoint's metadata holds it, and a resumed run's
//   on_start finds it in StartInfo::resumed->metadata. Keys are the hook's own (prefix them).
// - save_tensors(): the same for tensors (a weight average), written to the checkpoint's
//   hook_state.safetensors (train/checkpoint.h); a resumed run's on_start finds them in
//   StartInfo::resumed_tensors. Names are the hook's own (prefix them).
// - An exception thrown by a hook leaves fit() at once (no final evaluation or checkpoint), as a
//   crash would; checkpoints already written are kept.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "train/checkpoint.h"
#include "train/records.h"

namespace towerflow::data {
class Dataset;
}
namespace towerflow::optim {
class Optimizer;
}
namespace towerflow::tower {
class Trainer;
}

namespace towerflow::train {

struct FitOptions;
struct StopRequest;

// A run's length, fixed by the data, the global batch and FitOptions.
struct Plan {
  std::int64_t steps_per_epoch = 0;
  std::int64_t total_steps = 0;
  int epochs = 0;  // epochs begun by the whole run (the last may be partial under max_steps)
};

struct StartInfo {
  tower::Trainer& trainer;
  optim::Optimizer& optimizer;
  const data::Dataset& train_set;
  const data::Dataset* test_set;  // null: no evaluation
  const data::Dataset* validation_set = nullptr;  // FitOptions::validation_set
  const FitOptions& options;
  Plan plan;
  TrainingPosition position;              // where training starts (all zero for a new run)
  std::optional<CheckpointInfo> resumed;  // the checkpoint a resumed run continues from
  std::filesystem::path resumed_from;     // its directory (empty for a new run)
  int removed_files = 0;                  // a new run: files of an earlier run deleted from train_dir
  std::filesystem::path moved_aside = {}; // a new run: where an earlier run's files were moved
  std::string run_id;                     // new for a new run, the checkpoint's for a resumed one
  std::vector<optim::NamedState> resumed_tensors = {};  // every hook's save_tensors() at the checkpoint
};

struct FitResult {
  std::int64_t steps = 0;             // optimizer steps done, over every session of the run
  double test_loss = 0;               // the final evaluation (0 without a test set)
  double test_acc = 0;
  double test_top5 = 0;
  std::int64_t test_examples = 0;
  // The last evaluation of the validation set (FitOptions::validation_set; 0 without one).
  double val_loss = 0;
  double val_acc = 0;
  double val_top5 = 0;
  std::int64_t val_examples = 0;
  double train_img_per_s = 0;         // over this call's training steps
  double wall_seconds = 0;            // this call, start to end
  std::filesystem::path last_checkpoint = {};  // the final one, on every rank; empty without a train_dir
  bool stopped_early = false;         // a hook called stop_training()
  std::string stop_reason = {};
  std::string run_id = {};            // the run's identity, kept in its checkpoints
};

class Hook {
 public:
  virtual ~Hook() = default;

  virtual void on_start(const StartInfo&) {}
  virtual void on_step(const StepInfo&) {}
  virtual void on_log(const TrainRecord&) {}
  virtual void on_epoch_end(std::int64_t epoch) {}  // the epoch just ended (0-based)
  virtual void on_eval(const EvalRecord&) {}
  virtual void on_checkpoint(const CheckpointRecord&) {}
  virtual void on_end(const FitResult&) {}

  // The files (or directories) this hook writes for a run, existing or not.
  virtual std::vector<std::filesystem::path> files() const { return {}; }
  // Adds the hook's state to a checkpoint's metadata (see the contract).
  virtual void save_state(io::Metadata& metadata) const {}
  // The hook's tensors for a checkpoint (see the contract).
  virtual std::vector<optim::NamedState> save_tensors() const { return {}; }

  // Ends the run early (see the contract). Outside fit() it does nothing.
  void stop_training(std::string reason, bool evaluate = true);

 private:
  friend class Loop;
  StopRequest* stop_ = nullptr;
};

// A hook made of functions, for the few lines a test or a script needs (Keras's LambdaCallback):
//   train::LambdaHook early;
//   early.step = [&](const train::StepInfo& s) { if (s.loss < 0.05) early.stop_training("loss < 0.05"); };
struct LambdaHook : Hook {
  std::function<void(const StartInfo&)> start;
  std::function<void(const StepInfo&)> step;
  std::function<void(const TrainRecord&)> log;
  std::function<void(std::int64_t)> epoch_end;
  std::function<void(const EvalRecord&)> eval;
  std::function<void(const CheckpointRecord&)> checkpoint;
  std::function<void(const FitResult&)> end;

  void on_start(const StartInfo& i) override { if (start) start(i); }
  void on_step(const StepInfo& i) override { if (step) step(i); }
  void on_log(const TrainRecord& r) override { if (log) log(r); }
  void on_epoch_end(std::int64_t e) override { if (epoch_end) epoch_end(e); }
  void on_eval(const EvalRecord& r) override { if (eval) eval(r); }
  void on_checkpoint(const CheckpointRecord& r) override { if (checkpoint) checkpoint(r); }
  void on_end(const FitResult& r) override { if (end) end(r); }
};

}  // namespace towerflow::train
