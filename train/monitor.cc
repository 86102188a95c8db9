#include "train/monitor.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <iomanip>

#include "core/error.h"
#include "core/log.h"
#include "io/checkpoint_dir.h"
#include "optim/optimizer.h"
#include "tower/trainer.h"
#include "train/checkpoint.h"
#include "train/fit.h"

namespace towerflow::train {
namespace {

std::string number(double x) { return str(std::setprecision(17), x); }

std::optional<double> parse_double(const io::Metadata& m, const std::string& key) {
  auto it = m.find(key);
  if (it == m.end()) return std::nullopt;
  double v = 0;
  auto [end, ec] = std::from_chars(it->second.data(), it->second.data() + it->second.size(), v);
  if (ec != std::errc() || end != it->second.data() + it->second.size()) return std::nullopt;
  return v;
}

}  // namespace

MetricName parse_metric(std::string_view name) {
  MetricName out;
  std::string_view m = name;
  if (m.starts_with("val_")) out.set = EvalSet::Validation, m.remove_prefix(4);
  else if (m.starts_with("test_")) out.set = EvalSet::Test, m.remove_prefix(5);
  if (m != "loss" && m != "acc" && m != "top5")
    raise<InvalidArgument>("metric \"", name, "\" is not known; use loss, acc or top5, optionally prefixed "
                           "val_ (the validation set) or test_ (the test set), e.g. val_acc");
  out.quantity = std::string(m);
  return out;
}

MetricWatch::MetricWatch(Watch watch) : watch_(std::move(watch)) {
  if (!(watch_.min_delta >= 0) || !std::isfinite(watch_.min_delta))
    raise<InvalidArgument>("min_delta ", watch_.min_delta, " for metric ", watch_.metric, " must be finite and >= 0");
}

void MetricWatch::start(const StartInfo& s, const std::string& key) {
  const MetricName parsed = parse_metric(watch_.metric);
  const std::string& m = parsed.quantity;
  std::optional<EvalSet> set = parsed.set;
  if (!set) set = s.validation_set ? EvalSet::Validation : EvalSet::Test;
  if (*set == EvalSet::Validation && !s.validation_set)
    raise<InvalidArgument>("metric ", watch_.metric, " watches the validation set, and this run has none; give it one "
                           "(a validation_set: a held-out part of the training set, or a set of its own) or watch test_",
                           m);
  if (*set == EvalSet::Test && !s.test_set)
    raise<InvalidArgument>("metric ", watch_.metric, " watches the test set, and this run has none");
  set_ = *set;
  quantity_ = std::string(m);
  name_ = str(metric_prefix(set_), "_", quantity_);
  higher_is_better_ = quantity_ != "loss";
  best_.reset();
  since_ = 0;
  if (!s.resumed) return;
  const io::Metadata& meta = s.resumed->metadata;
  auto recorded = meta.find(key + ".metric");
  if (recorded == meta.end() || recorded->second != name_) return;  // the run watched something else
  best_ = parse_double(meta, key + ".best");
  since_ = static_cast<int>(parse_double(meta, key + ".since").value_or(0));
}

double MetricWatch::value_of(const EvalRecord& r) const {
  return quantity_ == "loss" ? r.test_loss : quantity_ == "acc" ? r.test_acc : r.test_top5;
}

std::optional<bool> MetricWatch::see(const EvalRecord& r) {
  if (r.set != set_ || name_.empty()) return std::nullopt;
  const double v = value_of(r);
  const bool improved = std::isfinite(v) && (!best_ || (higher_is_better_ ? v > *best_ + watch_.min_delta
                                                                           : v < *best_ - watch_.min_delta));
  if (improved) {
    best_ = v;
    since_ = 0;
  } else {
    ++since_;
  }
  return improved;
}

void MetricWatch::save(io::Metadata& m, const std::string& key) const {
  m[key + ".metric"] = name_;
  if (best_) m[key + ".best"] = number(*best_);
  else m.erase(key + ".best");
  m[key + ".since"] = std::to_string(since_);
}

// ---- KeepBest -------------------------------------------------------------------------------

KeepBest::KeepBest(Watch watch, std::filesystem::path dir) : watch_(std::move(watch)), dir_(std::move(dir)) {
  if (dir_.empty()) raise<InvalidArgument>("KeepBest needs a directory for the best checkpoint");
}

void KeepBest::on_start(const StartInfo& s) {
  watch_.start(s, "keep_best");
  trainer_ = &s.trainer;
  optimizer_ = &s.optimizer;
  metadata_ = s.options.metadata;
  metadata_["run_id"] = s.run_id;
  metadata_["seed"] = std::to_string(s.options.seed);
  steps_per_epoch_ = std::max<std::int64_t>(1, s.plan.steps_per_epoch);
}

void KeepBest::on_eval(const EvalRecord& r) {
  if (watch_.see(r) != true) return;
  io::Metadata meta = metadata_;
  meta["best_metric"] = watch_.name();
  meta["best_value"] = number(*watch_.best());
  watch_.save(meta, "keep_best");
  trainer_->sync();
  io::CheckpointDir dir(dir_);
  last_ = save_checkpoint(dir, trainer_->model(), *optimizer_,
                          {r.step, r.step / steps_per_epoch_, r.step % steps_per_epoch_}, meta, 1,
                          trainer_->loss_scaler());
  log_info(str("best ", watch_.name(), " ", *watch_.best(), " at step ", r.step, ": saved ", last_.string()));
}

// ---- EarlyStopping --------------------------------------------------------------------------

EarlyStopping::EarlyStopping(Watch watch, int patience) : watch_(std::move(watch)), patience_(patience) {
  if (patience < 1) raise<InvalidArgument>("early stopping patience ", patience, " must be at least 1 evaluation");
}

void EarlyStopping::on_eval(const EvalRecord& r) {
  if (watch_.see(r) != false || watch_.since_best() < patience_) return;
  stop_training(str("early stopping: no improvement of ", watch_.name(), " on its best (", *watch_.best(), ") in ",
                    watch_.since_best(), watch_.since_best() == 1 ? " evaluation" : " evaluations"));
}

// ---- ReduceLrOnPlateau ----------------------------------------------------------------------

ReduceLrOnPlateau::ReduceLrOnPlateau(Watch watch, PlateauOptions options)
    : watch_(std::move(watch)), o_(options) {
  if (!(o_.factor > 0 && o_.factor < 1))
    raise<InvalidArgument>("plateau factor ", o_.factor, " must be in (0, 1), e.g. 0.1");
  if (o_.patience < 1) raise<InvalidArgument>("plateau patience ", o_.patience, " must be at least 1 evaluation");
  if (o_.cooldown < 0) raise<InvalidArgument>("plateau cooldown ", o_.cooldown, " must be >= 0");
  if (!(o_.min_lr >= 0) || !std::isfinite(o_.min_lr))
    raise<InvalidArgument>("plateau min_lr ", o_.min_lr, " must be finite and >= 0");
}

void ReduceLrOnPlateau::on_start(const StartInfo& s) {
  watch_.start(s, "plateau");
  *scale_ = 1.0;
  reductions_ = cooldown_left_ = 0;
  if (s.resumed) {
    const io::Metadata& meta = s.resumed->metadata;
    if (auto m = meta.find("plateau.metric"); m != meta.end() && m->second == watch_.name()) {
      *scale_ = parse_double(meta, "plateau.scale").value_or(1.0);
      reductions_ = static_cast<int>(parse_double(meta, "plateau.reductions").value_or(0));
      cooldown_left_ = static_cast<int>(parse_double(meta, "plateau.cooldown_left").value_or(0));
    }
  }
  optimizer_ = &s.optimizer;
  inner_ = s.optimizer.schedule();
  const double fixed = s.optimizer.lr();
  s.optimizer.set_schedule([inner = inner_, fixed, scale = scale_](std::int64_t step) {
    return (inner ? inner(step) : fixed) * *scale;
  });
}

void ReduceLrOnPlateau::on_eval(const EvalRecord& r) {
  if (!watch_.see(r).has_value()) return;
  if (cooldown_left_ > 0) {  // evaluations in the cooldown do not count towards the patience
    --cooldown_left_;
    watch_.restart_count();
    return;
  }
  if (watch_.since_best() < o_.patience) return;
  const double now = optimizer_->lr();
  const double next = std::max(now * o_.factor, o_.min_lr);
  if (now - next <= 1e-12 * std::max(1.0, now)) return;  // at min_lr already
  *scale_ *= next / now;
  ++reductions_;
  cooldown_left_ = o_.cooldown;
  watch_.restart_count();
  log_info(str("no improvement of ", watch_.name(), " in ", o_.patience,
               o_.patience == 1 ? " evaluation" : " evaluations", ": learning rate ", now, " -> ", next));
}

void ReduceLrOnPlateau::on_end(const FitResult&) {
  if (optimizer_) optimizer_->set_schedule(inner_);
  optimizer_ = nullptr;
}

void ReduceLrOnPlateau::save_state(io::Metadata& m) const {
  watch_.save(m, "plateau");
  m["plateau.scale"] = number(*scale_);
  m["plateau.reductions"] = std::to_string(reductions_);
  m["plateau.cooldown_left"] = std::to_string(cooldown_left_);
}

}  // namespace towerflow::train
