#pragma once
// Hooks that watch an evaluation metric: the best checkpoint, early stopping, and a learning rate
// reduced on a plateau (Keras's ModelCheckpoint(save_best_only), EarlyStopping and
// ReduceLROnPlateau).
//
//   auto [train, val] = tw::data::holdout(cifar_train, 0.1, 1);
//   tw::train::KeepBest best{{.metric = "val_acc"}, "run/best"};
//   tw::train::EarlyStopping stop{{.metric = "val_loss"}, /*patience=*/5};
//   tw::train::ReduceLrOnPlateau plateau{{.metric = "val_loss"}, {.factor = 0.1, .patience = 2}};
//   tw::train::fit(trainer, sgd, *train, &test, {.validation_set = val.get(), ...}, {&best, &stop, &plateau});
//
// Contract:
// - A metric is [val_|test_](loss|acc|top5): the loss is better lower, accuracy and top-5 higher.
//   Without a prefix it is the set evaluated during training (the validation set when fit() has
//   one, else the test set). Only evaluations of that set count; with a validation set, the test
//   set's final evaluation does not. A value improves on the best when it beats it by more than
//   min_delta; a loss that is not finite never does. InvalidArgument at on_start for a name that
//   does not parse, or a val_ metric without a validation set.
// - Each hook keeps its state (the best value, the evaluations since) in every checkpoint
//   (Hook::save_state), so a resumed run goes on as the uninterrupted one would.
// - KeepBest writes a checkpoint (train/checkpoint.h: model, optimizer, position, the run's
//   metadata, plus "best_metric" and "best_value") into its own directory at every improvement,
//   keeping the newest only: dir/ckpt-<step> is the best model so far, for cifar10_eval or
//   --init_from. On every rank that holds it (cifar10_train: rank 0).
// - EarlyStopping stops the run (Hook::stop_training, so the final evaluation and checkpoint
//   follow) after `patience` evaluations in a row without improvement.
// - ReduceLrOnPlateau multiplies the optimizer's rate by `factor` after `patience` evaluations
//   without improvement (no lower than min_lr), then waits `cooldown` evaluations before counting
//   again. It wraps the optimizer's schedule at on_start (the rate is the schedule's value times
//   the reductions so far; a fixed rate where there is none) and restores it at on_end. Every rank
//   must hold it: each rank steps its own optimizer (evaluations agree across ranks).

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "optim/schedule.h"
#include "train/hook.h"

namespace towerflow::train {

// A metric's name taken apart: "val_acc" is {Validation, "acc"}; "loss" has no set (the set
// evaluated during training). InvalidArgument for a name that is not [val_|test_](loss|acc|top5).
struct MetricName {
  std::optional<EvalSet> set;
  std::string quantity;  // loss | acc | top5
};
MetricName parse_metric(std::string_view name);

struct Watch {
  std::string metric = "loss";  // see the contract
  double min_delta = 0;         // an improvement beats the best by more than this
};

// The state every watching hook shares: which evaluations count, the best value, the count since.
class MetricWatch {
 public:
  explicit MetricWatch(Watch watch);
  // Resolves the metric against the run (InvalidArgument, see the contract) and, on resume,
  // restores the state that save() wrote under `key`.
  void start(const StartInfo& start, const std::string& key);
  // nullopt: `r` is not an evaluation of the watched set; else whether it improved on the best.
  std::optional<bool> see(const EvalRecord& r);
  void save(io::Metadata& metadata, const std::string& key) const;

  const std::string& name() const { return name_; }  // resolved: "val_acc"
  std::optional<double> best() const { return best_; }
  int since_best() const { return since_; }           // evaluations since the best
  void restart_count() { since_ = 0; }
  double value_of(const EvalRecord& r) const;

 private:
  Watch watch_;
  std::string name_;
  EvalSet set_ = EvalSet::Test;
  std::string quantity_;  // loss | acc | top5
  bool higher_is_better_ = false;
  std::optional<double> best_;
  int since_ = 0;
};

class KeepBest : public Hook {
 public:
  KeepBest(Watch watch, std::filesystem::path dir);
  void on_start(const StartInfo& s) override;
  void on_eval(const EvalRecord& r) override;
  std::vector<std::filesystem::path> files() const override { return {dir_}; }
  void save_state(io::Metadata& m) const override { watch_.save(m, "keep_best"); }

  const MetricWatch& watch() const { return watch_; }
  const std::filesystem::path& last_saved() const { return last_; }  // empty before the first

 private:
  MetricWatch watch_;
  std::filesystem::path dir_, last_;
  tower::Trainer* trainer_ = nullptr;
  optim::Optimizer* optimizer_ = nullptr;
  io::Metadata metadata_;
  std::int64_t steps_per_epoch_ = 1;
};

class EarlyStopping : public Hook {
 public:
  EarlyStopping(Watch watch, int patience);
  void on_start(const StartInfo& s) override { watch_.start(s, "early_stop"); }
  void on_eval(const EvalRecord& r) override;
  void save_state(io::Metadata& m) const override { watch_.save(m, "early_stop"); }
  const MetricWatch& watch() const { return watch_; }

 private:
  MetricWatch watch_;
  int patience_;
};

struct PlateauOptions {
  double factor = 0.1;  // each reduction multiplies the rate by this, in (0, 1)
  int patience = 10;    // evaluations without improvement before a reduction
  int cooldown = 0;     // evaluations after a reduction before counting again
  double min_lr = 0;    // the rate is never reduced below this
};

class ReduceLrOnPlateau : public Hook {
 public:
  ReduceLrOnPlateau(Watch watch, PlateauOptions options = {});
  void on_start(const StartInfo& s) override;
  void on_eval(const EvalRecord& r) override;
  void on_end(const FitResult&) override;
  void save_state(io::Metadata& m) const override;

  double scale() const { return *scale_; }  // the product of the reductions so far
  int reductions() const { return reductions_; }
  const MetricWatch& watch() const { return watch_; }

 private:
  MetricWatch watch_;
  PlateauOptions o_;
  std::shared_ptr<double> scale_ = std::make_shared<double>(1.0);  // shared with the wrapped schedule
  int reductions_ = 0, cooldown_left_ = 0;
  optim::Optimizer* optimizer_ = nullptr;
  optim::LrSchedule inner_;
};

}  // namespace towerflow::train
