#include "examples/cifar10/reporter.h"

#include <unistd.h>

#include <cmath>

#include <nlohmann/json.hpp>

namespace towerflow::cifar10 {
namespace {

using nlohmann::ordered_json;

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

}  // namespace

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  long s = std::lround(seconds);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%ld:%02ld", s / 60, s % 60);
  return buf;
}

void TimeLeft::add_steps(std::int64_t steps, double seconds) {
  if (steps <= 0) return;
  const double pace = seconds / static_cast<double>(steps);
  // Each step's weight decays by e every kPaceSteps steps, whatever the window sizes.
  const double keep = paced_ ? std::exp(-static_cast<double>(steps) / kPaceSteps) : 0.0;
  sec_per_step_ = keep * sec_per_step_ + (1 - keep) * pace;
  paced_ = true;
}

void TimeLeft::add_eval(double seconds) {
  eval_seconds_ += seconds;
  ++evals_;
}

double TimeLeft::seconds(std::int64_t steps_left, std::int64_t evals_left) const {
  const double per_eval = evals_ > 0 ? eval_seconds_ / static_cast<double>(evals_) : 0.0;
  return sec_per_step_ * static_cast<double>(steps_left) + per_eval * static_cast<double>(evals_left);
}

std::int64_t evals_left(std::int64_t epochs_done, std::int64_t epochs, int eval_every) {
  if (epochs_done >= epochs) return 0;
  if (eval_every <= 0) return 1;
  const std::int64_t on_the_way = epochs / eval_every - epochs_done / eval_every;
  return on_the_way + (epochs % eval_every != 0 ? 1 : 0);
}

Reporter::Reporter(ReporterOptions options) : options_(std::move(options)) {
  live_ = !options_.json &&
          (options_.live == 1 || (options_.live == -1 && ::isatty(::fileno(options_.out)) == 1));
  if (!options_.metrics_path.empty()) metrics_ = io::LineAppender(options_.metrics_path);
  previous_sink_ = set_log_sink([this](LogLevel level, std::string_view text) { message(level, text); });
}

Reporter::~Reporter() {
  set_log_sink(previous_sink_);
  std::lock_guard lock(mu_);
  clear_live_locked();
}

void Reporter::open_metrics(const std::filesystem::path& path) {
  io::LineAppender appender(path);
  std::lock_guard lock(mu_);
  metrics_ = std::move(appender);
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

void Reporter::block(const std::string& event, const std::string& title, const Fields& fields) {
  std::lock_guard lock(mu_);
  if (options_.json) {
    ordered_json j;
    j["event"] = event;
    for (const auto& [k, v] : fields) j[k] = v;
    write_locked(j.dump());
    return;
  }
  write_locked(title);
  std::size_t width = 0;
  for (const auto& [k, v] : fields) width = std::max(width, k.size());
  for (const auto& [k, v] : fields) write_locked("  " + k + std::string(width - k.size() + 2, ' ') + v);
}

void Reporter::train(const TrainRecord& r) {
  ordered_json j;
  j["step"] = r.step;
  j["epoch"] = round_to(r.epoch, 3);
  j["loss"] = number_or_null(round_to(r.loss, 5));
  j["acc"] = round_to(r.acc, 5);
  j["lr"] = round_to(r.lr, 8);
  j["img_per_s"] = round_to(r.img_per_s, 1);
  std::lock_guard lock(mu_);
  if (metrics_.is_open()) metrics_.append(j.dump());
  if (options_.json) {
    j["eta_s"] = round_to(r.eta_s, 1);
    write_locked(j.dump());
    return;
  }
  char line[256];
  std::snprintf(line, sizeof line,
                "epoch %.2f/%d  step %lld/%lld  loss %.4f  acc %5.1f%%  lr %.4g  %.0f img/s  ETA %s", r.epoch,
                r.epochs, static_cast<long long>(r.step), static_cast<long long>(r.total_steps), r.loss,
                100.0 * r.acc, r.lr, r.img_per_s, format_duration(r.eta_s).c_str());
  if (live_) {
    // Redraw in place: carriage return, the line, erase what an older, longer line left.
    std::fprintf(options_.out, "\r%s\033[K", line);
    std::fflush(options_.out);
    live_shown_ = true;
  } else {
    write_locked(line);
  }
}

void Reporter::eval(const EvalRecord& r) {
  ordered_json j;
  j["step"] = r.step;
  j["epoch"] = round_to(r.epoch, 3);
  j["test_loss"] = number_or_null(round_to(r.test_loss, 5));
  j["test_acc"] = round_to(r.test_acc, 5);
  j["examples"] = r.examples;
  std::lock_guard lock(mu_);
  if (metrics_.is_open()) metrics_.append(j.dump());
  if (options_.json) {
    j["eval_s"] = round_to(r.seconds, 2);
    write_locked(j.dump());
    return;
  }
  char line[256];
  std::snprintf(line, sizeof line, "eval  epoch %.2f  step %lld  test_loss %.4f  test_acc %.2f%%  (%lld images, %.1f s)",
                r.epoch, static_cast<long long>(r.step), r.test_loss, 100.0 * r.test_acc,
                static_cast<long long>(r.examples), r.seconds);
  write_locked(line);
}

void Reporter::epoch_end() {
  std::lock_guard lock(mu_);
  clear_live_locked();
}

void Reporter::message(LogLevel level, std::string_view text) {
  std::lock_guard lock(mu_);
  if (options_.json) {
    ordered_json j;
    j["event"] = level >= LogLevel::Error ? "error" : "log";
    j["level"] = level_name(level);
    j["message"] = std::string(text);
    write_locked(j.dump());
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
  if (options_.json) {
    std::lock_guard lock(mu_);
    auto j = ordered_json::parse(json_object);
    ordered_json out;
    out["event"] = "summary";
    for (auto it = j.begin(); it != j.end(); ++it) out[it.key()] = it.value();
    write_locked(out.dump());
    return;
  }
  block("summary", "summary", fields);
}

}  // namespace towerflow::cifar10
