#include "train/reporter.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include <nlohmann/json.hpp>

#include "core/collectives/process_group.h"
#include "core/error.h"
#include "core/kernel_choice.h"
#include "core/platform/registry.h"
#include "tower/trainer.h"
#include "train/fit.h"
#include "train/json_line.h"

namespace towerflow::train {
namespace {

using nlohmann::ordered_json;
using detail::json_line;
using detail::round_to;

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::Debug: return "debug";
    case LogLevel::Info: return "info";
    case LogLevel::Warning: return "warning";
    case LogLevel::Error: return "error";
  }
  return "info";
}



}  // namespace


namespace {


}  // namespace






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
    write_locked(json_line(j));
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


void Reporter::on_start(const StartInfo& start) {
  first_step_done_ = false;
  kernel_choices_before_ = kernel_choices().size();
  devices_ = start.trainer.devices();
  time_left_ = TimeLeft();
  last_step_ = start.position.step;
  steps_per_epoch_ = std::max<std::int64_t>(1, start.plan.steps_per_epoch);
  epochs_ = start.plan.epochs;
  eval_every_ = start.options.eval_every;
  evaluates_ = start.test_set != nullptr || start.validation_set != nullptr;
  Fields fields = start_fields(start);
  if (options_.describe) options_.describe(start, fields);
  if (progress_ != Progress::Json) return block("start", options_.title, fields);
  // One JSON line: the block's fields as text, as in the other modes, and the structured part.
  ordered_json j;
  j["event"] = "start";
  for (const auto& [k, v] : fields) j[k] = v;
  const ordered_json facts = ordered_json::parse(start_facts(start));
  for (const auto& [k, v] : facts.items()) j[k] = v;
  std::lock_guard lock(mu_);
  write_locked(json_line(j));
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
  summary(f, json_line(j));
}

void Reporter::on_step(const StepInfo&) {
  if (first_step_done_) return;
  first_step_done_ = true;
  if (kernel_choice() != KernelChoice::kAuto) return;
  const std::vector<KernelChoiceRecord> all = kernel_choices();
  if (all.size() <= kernel_choices_before_) return;
  const std::string cache = kernel_choice_cache();
  const std::string title = "kernels chosen in the first step (--kernel_choice auto; cache " +
                            (cache.empty() ? std::string("none") : cache) + ")";
  std::lock_guard lock(mu_);
  if (progress_ == Progress::Json) {
    ordered_json j;
    j["event"] = "kernel_choice";
    j["cache"] = cache;
    ordered_json choices = ordered_json::array();
    for (std::size_t i = kernel_choices_before_; i < all.size(); ++i) {
      const KernelChoiceRecord& r = all[i];
      ordered_json ms = ordered_json::object();
      for (const auto& [name, t] : r.ms) ms[name] = round_to(t, 3);
      choices.push_back({{"layer", r.layer}, {"pass", r.pass}, {"problem", r.problem},
                         {"operands", r.operands}, {"threads", r.threads}, {"chosen", r.chosen},
                         {"cached", r.from_cache}, {"ms", ms}});
    }
    j["choices"] = choices;
    write_locked(json_line(j));
    return;
  }
  write_locked(title);
  for (std::size_t i = kernel_choices_before_; i < all.size(); ++i)
    write_locked("  " + format_kernel_choice(all[i]));
}

void Reporter::on_log(const TrainRecord& r) {
  const std::int64_t steps = r.step - last_step_;
  time_left_.add_steps(steps, r.step_s * static_cast<double>(steps));
  last_step_ = r.step;
  const std::int64_t evals = evaluates_ ? evals_left(r.step / steps_per_epoch_, epochs_, eval_every_) : 0;
  train(r, time_left_.seconds(r.total_steps - r.step, evals));
}

void Reporter::on_eval(const EvalRecord& r) {
  time_left_.add_eval(r.seconds);
  eval(r);
}

void Reporter::train(const TrainRecord& r, double eta_s) {
  ordered_json j = ordered_json::parse(to_json(r));
  std::lock_guard lock(mu_);
  if (progress_ == Progress::Json) {
    j["eta_s"] = round_to(eta_s, 1);
    write_locked(json_line(j));
    return;
  }
  char line[256];
  std::snprintf(line, sizeof line,
                "epoch %.2f/%d  step %lld/%lld  loss %.4f  acc %5.1f%%  lr %.4g  %.0f img/s  ETA %s", r.epoch,
                r.epochs, static_cast<long long>(r.step), static_cast<long long>(r.total_steps), r.loss,
                100.0 * r.acc, r.lr, r.img_per_s, format_duration(eta_s).c_str());
  if (r.loss_scale > 0) {  // fp16
    const std::size_t used = std::strlen(line);
    std::snprintf(line + used, sizeof line - used, "  loss scale %g  skipped %lld", r.loss_scale,
                  static_cast<long long>(r.skipped_steps));
  }
  if (!r.split.empty()) {  // an auto split: "split 85/43"
    std::string rows;
    for (int v : r.split) rows += (rows.empty() ? "" : "/") + std::to_string(v);
    const std::size_t used = std::strlen(line);
    std::snprintf(line + used, sizeof line - used, "  split %s", rows.c_str());
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
  ordered_json j = ordered_json::parse(to_json(r));
  std::lock_guard lock(mu_);
  if (progress_ == Progress::Json) {
    j["eval_s"] = round_to(r.seconds, 2);
    write_locked(json_line(j));
    return;
  }
  const char* p = r.set == EvalSet::Validation ? "val" : "test";
  char line[256];
  std::snprintf(line, sizeof line,
                "eval  epoch %.2f  step %lld  %s_loss %.4f  %s_acc %.2f%%  top-5 %.2f%%  (%lld images%s, %.1f s)",
                r.epoch, static_cast<long long>(r.step), p, r.test_loss, p, 100.0 * r.test_acc, 100.0 * r.test_top5,
                static_cast<long long>(r.examples), r.views > 1 ? str(" x ", r.views, " views").c_str() : "",
                r.seconds);
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
    write_locked(json_line(j));
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
    write_locked(json_line(out));
    return;
  }
  block("summary", "summary", fields);
}

}  // namespace towerflow::train
