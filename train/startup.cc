#include "train/startup.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "core/collectives/process_group.h"
#include "core/error.h"
#include "core/kernel_choice.h"
#include "core/platform/registry.h"
#include "core/tensor/device_ops.h"
#include "core/version.h"
#include "data/dataset.h"
#include "optim/optimizer.h"
#include "tower/split.h"
#include "tower/trainer.h"
#include "train/fit.h"
#include "train/json_line.h"

namespace towerflow::train {

using nlohmann::ordered_json;

namespace {
// Rows per tower of every process at the run's first step: the split's, or an auto split's
// shares in force then (even, or a resumed run's). InvalidArgument where the batch does not split.
std::vector<int> first_split(const StartInfo& s) {
  const auto& t = s.trainer.options();
  std::vector<Device> towers;
  for (int r = 0; r < s.trainer.processes().size(); ++r)
    towers.insert(towers.end(), s.trainer.devices().begin(), s.trainer.devices().end());
  const std::vector<double> shares = s.trainer.split_shares(s.position.step + 1);
  if (!shares.empty()) return tower::split_batch(s.options.batch, towers, tower::WeightedSplit{shares}, tower::Remainder::Spread);
  return tower::split_batch(s.options.batch, towers, t.split, t.remainder);
}
}  // namespace

void set_field(Fields& fields, const std::string& key, std::string value, const std::string& after) {
  for (auto& [k, v] : fields)
    if (k == key) {
      v = std::move(value);
      return;
    }
  auto at = fields.end();
  if (!after.empty())
    for (auto it = fields.begin(); it != fields.end(); ++it)
      if (it->first == after) at = it + 1;
  fields.insert(at, {key, std::move(value)});
}

std::string describe_augment(const data::Augment& a, const data::MixOptions& mix) {
  std::vector<std::string> parts;
  if (a.crop_padding > 0)
    parts.push_back(str("random crops of the image padded by ", a.crop_padding,
                        a.pad_mode == data::PadMode::Reflect ? " (reflected)" : ""));
  if (a.flip)
    parts.push_back(a.flip_mode == data::FlipMode::Alternating ? "horizontal flips alternating by epoch"
                                                               : "horizontal flips");
  if (a.cutout > 0) parts.push_back(str("cutout ", a.cutout, "x", a.cutout));
  if (mix.mixup_alpha > 0) parts.push_back(str("mixup alpha ", mix.mixup_alpha));
  if (mix.cutmix_alpha > 0) parts.push_back(str("CutMix alpha ", mix.cutmix_alpha));
  if (mix.mixup_alpha > 0 && mix.cutmix_alpha > 0) parts.back() += " (one of the two per batch)";
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : ", ") + p;
  return out.empty() ? "none" : out;
}

std::string describe_normalisation(const data::Augment& a) {
  auto triple = [](const std::array<float, 3>& v) { return str("(", v[0], ", ", v[1], ", ", v[2], ")"); };
  const bool cifar10 = a.mean == data::kCifar10Mean && a.std == data::kCifar10Std;
  return str("(x/255 - mean) / std per channel, mean ", triple(a.mean), ", std ", triple(a.std),
             cifar10 ? " (CIFAR-10's)" : "");
}

Fields start_fields(const StartInfo& s) {
  const FitOptions& o = s.options;
  const auto& devices = s.trainer.devices();
  Fields f{{"version", str(version(), " (commit ", commit(), ")")},
           {"model", str(s.trainer.model().num_parameters(), " parameters, ", s.train_set.num_classes(), " classes")},
           {"train data", s.train_set.describe()}};
  if (s.validation_set) f.emplace_back("validation data", s.validation_set->describe());
  if (s.test_set) f.emplace_back("test data", str(s.test_set->describe(), s.validation_set ? " (evaluated at the end)" : ""));
  f.emplace_back("augmentation", describe_augment(o.augment, o.mix));
  f.emplace_back("normalisation", describe_normalisation(o.augment));
  f.emplace_back("towers", s.trainer.describe());
  for (const auto& d : devices) f.emplace_back("device " + d.str(), device_info(d).description);
  // What each kind of device computes with, as its backend says ("cpu kernels", "gpu kernels").
  std::vector<DeviceKind> kinds;
  for (const auto& d : devices)
    if (std::find(kinds.begin(), kinds.end(), d.kind) == kinds.end()) {
      kinds.push_back(d.kind);
      std::string kernels = describe_kernels(d);
      if (d.is_cpu() && kernel_choice() == KernelChoice::kAuto)
        kernels += "; convolutions and matrix products on the fastest candidate, measured in the first step";
      f.emplace_back(str(d.is_cpu() ? "cpu" : "gpu", " kernels"), kernels);
    }
  f.emplace_back("device options", to_string(process_options()));
  const auto& t = s.trainer.options();
  std::string per_tower;
  try {
    for (int r : first_split(s))
      per_tower += (per_tower.empty() ? "" : " + ") + std::to_string(r);
  } catch (const InvalidArgument& e) {  // the first step will say so; the block shows it too
    per_tower = str("does not split: ", e.what());
  }
  const bool balanced = std::holds_alternative<tower::AutoSplit>(t.split);
  f.emplace_back("batch", str(o.batch, " global (", per_tower, per_tower.starts_with("does not") ? "" : " per tower",
                              balanced ? str(" first; ", tower::to_string(t.split), ": rebalanced by measured speed") : "", ")",
                              t.accumulation_steps > 1 ? str(", in ", t.accumulation_steps, " micro-batches") : ""));
  f.emplace_back("optimizer", str(s.optimizer.name(), ", lr ", s.optimizer.lr()));
  const Plan& p = s.plan;
  f.emplace_back("length", str(p.total_steps, " steps (", p.epochs, p.epochs == 1 ? " epoch" : " epochs", " of ",
                               p.steps_per_epoch, " steps)"));
  if (!o.train_dir.empty()) {
    const std::string when = o.save_every > 0 ? str("every ", o.save_every, " steps and at the end") : "at the end only";
    const std::string kept = o.keep_checkpoints > 0 ? str("newest ", o.keep_checkpoints, " kept") : "all kept";
    f.emplace_back("checkpoints", str(o.train_dir.string(), ", ", when, ", ", kept));
    f.emplace_back("resumed", s.resumed ? str(s.resumed_from.string(), " (step ", s.position.step, ")")
                                        : std::string("no (a new run)"));
  }
  return f;
}

// The start event's machine-readable part (JSON progress): the run's shape as numbers and lists,
// and what its checkpoints record (FitOptions::metadata; a value that is JSON, such as
// cifar10_train's options, as an object).
std::string start_facts(const StartInfo& s) {
  const FitOptions& o = s.options;
  ordered_json run;
  run["run_id"] = s.run_id;
  std::vector<Device> towers;  // of every process
  for (int r = 0; r < s.trainer.processes().size(); ++r)
    towers.insert(towers.end(), s.trainer.devices().begin(), s.trainer.devices().end());
  ordered_json names = ordered_json::array();
  for (const auto& d : towers) names.push_back(d.str());
  run["towers"] = names;
  run["processes"] = s.trainer.processes().size();
  run["global_batch"] = o.batch;
  const auto& t = s.trainer.options();
  run["split"] = tower::to_string(t.split);
  try {
    run["rows_per_tower"] = first_split(s);  // an auto split's first
  } catch (const InvalidArgument&) {
    run["rows_per_tower"] = nullptr;  // the first step says why
  }
  run["accumulation_steps"] = t.accumulation_steps;
  run["total_steps"] = s.plan.total_steps;
  run["steps_per_epoch"] = s.plan.steps_per_epoch;
  run["epochs"] = s.plan.epochs;
  run["start_step"] = s.position.step;
  run["resumed_from"] = s.resumed ? ordered_json(s.resumed_from.string()) : ordered_json(nullptr);
  run["parameters"] = s.trainer.model().num_parameters();
  run["num_classes"] = s.train_set.num_classes();
  run["train_examples"] = s.train_set.size();
  run["test_examples"] = s.test_set ? ordered_json(s.test_set->size()) : ordered_json(nullptr);
  run["val_examples"] = s.validation_set ? ordered_json(s.validation_set->size()) : ordered_json(nullptr);
  ordered_json out;
  out["towerflow"] = {{"version", version()}, {"commit", commit()}};
  out["run"] = run;
  ordered_json meta = ordered_json::object();
  for (const auto& [k, v] : o.metadata) {
    ordered_json parsed = ordered_json::parse(v, nullptr, false);
    meta[k] = !parsed.is_discarded() && parsed.is_object() ? parsed : ordered_json(v);
  }
  out["metadata"] = meta;
  return detail::json_line(out);
}

}  // namespace towerflow::train
