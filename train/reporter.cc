#include "train/reporter.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include <nlohmann/json.hpp>

#include "core/cpu/isa.h"
#include "core/collectives/process_group.h"
#include "core/error.h"
#include "core/platform/registry.h"
#include "core/version.h"
#include "data/dataset.h"
#include "optim/optimizer.h"
#include "tower/trainer.h"
#include "train/fit.h"

namespace towerflow::train {
namespace {

using nlohmann::ordered_json;

// One JSON line. Names and paths come from the user's files and may not be UTF-8: such bytes
// become U+FFFD instead of an exception in the middle of a run.
std::string text_of(const ordered_json& j) { return j.dump(-1, ' ', false, ordered_json::error_handler_t::replace); }

// Short numbers in JSON: 0.4321 rather than 0.43210000000000004.
double round_to(double x, int digits) {
  if (!std::isfinite(x)) return x;
  double scale = std::pow(10.0, digits);
  return std::round(x * scale) / scale;
}

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::Debug: return "debug";
    case LogLevel::Info: return "info";
    case LogLevel::Warning: return "warning";
    case LogLevel::Error: return "error";
  }
  return "info";
}

ordered_json number_or_null(double x) { return std::isfinite(x) ? ordered_json(x) : ordered_json(nullptr); }

ordered_json json_of(const TrainRecord& r) {
  ordered_json j;
  j["step"] = r.step;
  j["epoch"] = round_to(r.epoch, 3);
  j["loss"] = number_or_null(round_to(r.loss, 5));
  j["acc"] = round_to(r.acc, 5);
  j["lr"] = round_to(r.lr, 8);
  j["img_per_s"] = round_to(r.img_per_s, 1);
  if (r.loss_scale > 0) {  // fp16
    j["loss_scale"] = r.loss_scale;
    j["skipped_steps"] = r.skipped_steps;
  }
  return j;
}

}  // namespace

std::vector<std::optional<double>> class_accuracy(int classes, const std::vector<std::int64_t>& confusion) {
  std::vector<std::optional<double>> out(static_cast<std::size_t>(std::max(classes, 0)));
  if (confusion.size() != out.size() * out.size()) return out;
  for (std::size_t t = 0; t < out.size(); ++t) {
    std::int64_t rows = 0;
    for (std::size_t p = 0; p < out.size(); ++p) rows += confusion[t * out.size() + p];
    if (rows > 0) out[t] = static_cast<double>(confusion[t * out.size() + t]) / static_cast<double>(rows);
  }
  return out;
}

namespace {

ordered_json json_of(const EvalRecord& r) {
  ordered_json j;
  j["step"] = r.step;
  j["epoch"] = round_to(r.epoch, 3);
  const std::string p(metric_prefix(r.set));
  j[p + "_loss"] = number_or_null(round_to(r.test_loss, 5));
  j[p + "_acc"] = round_to(r.test_acc, 5);
  j[p + "_top5"] = round_to(r.test_top5, 5);
  if (r.classes > 0) {
    ordered_json per_class = ordered_json::array();
    for (const auto& a : class_accuracy(r.classes, r.confusion))
      per_class.push_back(a ? ordered_json(round_to(*a, 5)) : ordered_json(nullptr));
    j[p + "_class_acc"] = per_class;
  }
  j["examples"] = r.examples;
  return j;
}

}  // namespace

std::string to_json(const TrainRecord& r) { return text_of(json_of(r)); }
std::string to_json(const EvalRecord& r) { return text_of(json_of(r)); }

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
  if (a.crop_padding > 0) parts.push_back(str("random crops of the image padded by ", a.crop_padding));
  if (a.flip) parts.push_back("horizontal flips");
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
  if (std::any_of(devices.begin(), devices.end(), [](const Device& d) { return d.is_cpu(); }))
    f.emplace_back("cpu kernels", cpu::describe_active_isa());
  f.emplace_back("device options", to_string(process_options()));
  const auto& t = s.trainer.options();
  std::string per_tower;
  try {
    std::vector<Device> towers;  // of every process
    for (int r = 0; r < s.trainer.processes().size(); ++r) towers.insert(towers.end(), devices.begin(), devices.end());
    for (int r : tower::split_batch(o.batch, towers, t.split, t.remainder))
      per_tower += (per_tower.empty() ? "" : " + ") + std::to_string(r);
  } catch (const InvalidArgument& e) {  // the first step will say so; the block shows it too
    per_tower = str("does not split: ", e.what());
  }
  f.emplace_back("batch", str(o.batch, " global (", per_tower, per_tower.starts_with("does not") ? "" : " per tower", ")",
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

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  long s = std::lround(seconds);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%ld:%02ld", s / 60, s % 60);
  return buf;
}


Progress parse_progress(std::string_view text) {
  for (Progress p : {Progress::Auto, Progress::Plain, Progress::Live, Progress::Json})
    if (text == to_string(p)) return p;
  raise<InvalidArgument>("progress \"", text, "\" is not one of auto, plain, live, json; write e.g. plain");
}

std::string_view to_string(Progress progress) {
  switch (progress) {
    case Progress::Auto: return "auto";
    case Progress::Plain: return "plain";
    case Progress::Live: return "live";
    case Progress::Json: return "json";
  }
  return "auto";
}

// Note [Plain lines under a launcher]
// A terminal on `out` is not enough to draw the live line. Open MPI's mpirun gives the local
// ranks' stdout a pseudo-terminal (so that their output is line-buffered), whatever mpirun's own
// output is (Open MPI 4.1.4: `mpirun -n 1 python3 -c 'import os; print(os.isatty(1))' > f`
// writes True), so a log file of `mpirun ... > train.log` filled with carriage returns and ESC[K,
// one redraw per report. Under a launcher the output is almost always collected somewhere (a
// file, a scheduler's log), so Auto prints plain lines there; `--progress live` (Progress::Live)
// still draws the line for someone watching mpirun on a terminal.
Progress resolve_progress(Progress progress, std::FILE* out) {
  if (progress != Progress::Auto) return progress;
  const bool terminal = out != nullptr && ::isatty(::fileno(out)) == 1;
  return terminal && !collectives::launched_by_mpi() ? Progress::Live : Progress::Plain;
}

Reporter::Reporter(ReporterOptions options)
    : options_(std::move(options)), progress_(resolve_progress(options_.progress, options_.out)) {
  previous_sink_ = set_log_sink([this](LogLevel level, std::string_view text) { message(level, text); });
}

Reporter::~Reporter() {
  set_log_sink(previous_sink_);
  std::lock_guard lock(mu_);
  clear_live_locked();
}

void Reporter::clear_live_locked() {
  if (live_shown_) {
    std::fputs("\n", options_.out);
    std::fflush(options_.out);
    live_shown_ = false;
  }
}

void Reporter::write_locked(const std::string& line) {
  clear_live_locked();
  std::fputs(line.c_str(), options_.out);
  std::fputc('\n', options_.out);
  std::fflush(options_.out);
}

void Reporter::line(const std::string& text) {
  std::lock_guard lock(mu_);
  write_locked(text);
}

void Reporter::block(const std::string& event, const std::string& title, const Fields& fields) {
  std::lock_guard lock(mu_);
  if (progress_ == Progress::Json) {
    ordered_json j;
    j["event"] = event;
    for (const auto& [k, v] : fields) j[k] = v;
    write_locked(text_of(j));
    return;
  }
  write_locked(title);
  std::size_t width = 0;
  for (const auto& [k, v] : fields) width = std::max(width, k.size());
  for (const auto& [k, v] : fields) write_locked("  " + k + std::string(width - k.size() + 2, ' ') + v);
}

void Reporter::set_start_block(std::string title, std::function<void(const StartInfo&, Fields&)> describe) {
  options_.title = std::move(title);
  options_.describe = std::move(describe);
}

// The start event's machine-readable part (JSON progress): the run's shape as numbers and lists,
// and what its checkpoints record (FitOptions::metadata; a value that is JSON, such as
// cifar10_train's options, as an object).
namespace {
ordered_json structured_start(const StartInfo& s) {
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
  try {
    run["rows_per_tower"] = tower::split_batch(o.batch, towers, t.split, t.remainder);
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
  return out;
}
}  // namespace

void Reporter::on_start(const StartInfo& start) {
  devices_ = start.trainer.devices();
  Fields fields = start_fields(start);
  if (options_.describe) options_.describe(start, fields);
  if (progress_ != Progress::Json) return block("start", options_.title, fields);
  // One JSON line: the block's fields as text, as in the other modes, and the structured part.
  ordered_json j;
  j["event"] = "start";
  for (const auto& [k, v] : fields) j[k] = v;
  const ordered_json facts = structured_start(start);
  for (const auto& [k, v] : facts.items()) j[k] = v;
  std::lock_guard lock(mu_);
  write_locked(text_of(j));
}

void Reporter::on_end(const FitResult& r) {
  nlohmann::ordered_json j;
  if (r.val_examples > 0) {
    j["val_acc"] = r.val_acc;
    j["val_top5"] = r.val_top5;
    j["val_loss"] = r.val_loss;
  }
  if (r.test_examples > 0) {
    j["test_acc"] = r.test_acc;
    j["test_top5"] = r.test_top5;
    j["test_loss"] = r.test_loss;
  }
  j["steps"] = r.steps;
  j["img_per_s"] = round_to(r.train_img_per_s, 1);
  j["wall_s"] = round_to(r.wall_seconds, 1);
  if (r.stopped_early) j["stopped"] = r.stop_reason;
  if (!r.last_checkpoint.empty()) j["checkpoint"] = r.last_checkpoint.string();
  nlohmann::ordered_json peaks;
  std::string peak_text;
  for (const auto& d : devices_) {
    auto s = device_allocator(d).stats();
    peaks[d.str()] = s.peak_bytes_in_use;
    peak_text += (peak_text.empty() ? "" : ", ") + d.str() + " " + format_byte_size(s.peak_bytes_in_use);
  }
  j["peak_bytes"] = peaks;
  Fields f;
  if (r.val_examples > 0) {
    f.emplace_back("validation accuracy", str(std::round(r.val_acc * 10000) / 100, "% top-1, ",
                                              std::round(r.val_top5 * 10000) / 100, "% top-5 (", r.val_examples, " images)"));
    f.emplace_back("validation loss", str(r.val_loss));
  }
  if (r.test_examples > 0) {
    f.emplace_back("test accuracy", str(std::round(r.test_acc * 10000) / 100, "% top-1, ",
                                        std::round(r.test_top5 * 10000) / 100, "% top-5 (", r.test_examples, " images)"));
    f.emplace_back("test loss", str(r.test_loss));
  }
  f.emplace_back("throughput", str(std::lround(r.train_img_per_s), " images/s (training steps only)"));
  f.emplace_back("steps", str(r.steps, " in ", format_duration(r.wall_seconds), " wall-clock"));
  if (r.stopped_early) f.emplace_back("stopped early", r.stop_reason);
  if (!devices_.empty()) f.emplace_back("peak memory", peak_text);
  if (!r.last_checkpoint.empty()) f.emplace_back("checkpoint", r.last_checkpoint.string());
  summary(f, text_of(j));
}

void Reporter::train(const TrainRecord& r) {
  ordered_json j = json_of(r);
  std::lock_guard lock(mu_);
  if (progress_ == Progress::Json) {
    j["eta_s"] = round_to(r.eta_s, 1);
    write_locked(text_of(j));
    return;
  }
  char line[256];
  std::snprintf(line, sizeof line,
                "epoch %.2f/%d  step %lld/%lld  loss %.4f  acc %5.1f%%  lr %.4g  %.0f img/s  ETA %s", r.epoch,
                r.epochs, static_cast<long long>(r.step), static_cast<long long>(r.total_steps), r.loss,
                100.0 * r.acc, r.lr, r.img_per_s, format_duration(r.eta_s).c_str());
  if (r.loss_scale > 0) {  // fp16
    const std::size_t used = std::strlen(line);
    std::snprintf(line + used, sizeof line - used, "  loss scale %g  skipped %lld", r.loss_scale,
                  static_cast<long long>(r.skipped_steps));
  }
  if (progress_ == Progress::Live) {
    // Redraw in place: carriage return, the line, erase what an older, longer line left.
    std::fprintf(options_.out, "\r%s\033[K", line);
    std::fflush(options_.out);
    live_shown_ = true;
  } else {
    write_locked(line);
  }
}

void Reporter::eval(const EvalRecord& r) {
  ordered_json j = json_of(r);
  std::lock_guard lock(mu_);
  if (progress_ == Progress::Json) {
    j["eval_s"] = round_to(r.seconds, 2);
    write_locked(text_of(j));
    return;
  }
  const char* p = r.set == EvalSet::Validation ? "val" : "test";
  char line[256];
  std::snprintf(line, sizeof line,
                "eval  epoch %.2f  step %lld  %s_loss %.4f  %s_acc %.2f%%  top-5 %.2f%%  (%lld images, %.1f s)",
                r.epoch, static_cast<long long>(r.step), p, r.test_loss, p, 100.0 * r.test_acc, 100.0 * r.test_top5,
                static_cast<long long>(r.examples), r.seconds);
  write_locked(line);
}

void Reporter::epoch_end() {
  std::lock_guard lock(mu_);
  clear_live_locked();
}

void Reporter::message(LogLevel level, std::string_view text) {
  std::lock_guard lock(mu_);
  if (progress_ == Progress::Json) {
    ordered_json j;
    j["event"] = level >= LogLevel::Error ? "error" : "log";
    j["level"] = level_name(level);
    j["message"] = std::string(text);
    write_locked(text_of(j));
    return;
  }
  clear_live_locked();
  const char* prefix = level == LogLevel::Warning ? "warning: " : level == LogLevel::Error ? "error: " : "";
  std::string line = std::string(prefix) + std::string(text);
  // Warnings and errors go to stderr like any program's; the rest follows the progress.
  std::FILE* stream = level >= LogLevel::Warning ? stderr : options_.out;
  std::fputs(line.c_str(), stream);
  std::fputc('\n', stream);
  std::fflush(stream);
}

void Reporter::summary(const Fields& fields, const std::string& json_object) {
  if (progress_ == Progress::Json) {
    std::lock_guard lock(mu_);
    auto j = ordered_json::parse(json_object);
    ordered_json out;
    out["event"] = "summary";
    for (auto it = j.begin(); it != j.end(); ++it) out[it.key()] = it.value();
    write_locked(text_of(out));
    return;
  }
  block("summary", "summary", fields);
}

}  // namespace towerflow::train
