#pragma once
// Reporter: everything a training run tells its user, in one of three forms (ReporterOptions::
// progress), as a hook of fit().
//
// - Live: a progress line (epoch, step, loss, accuracy, images/s, ETA) redrawn in place with a
//   carriage return and ESC[K, kept as a normal line at the end of each epoch; other lines go
//   above it.
// - Plain: the same progress as plain lines, one per report; no carriage returns, no escape codes.
// - Json: one JSON object per line on the output, nothing else: the records' JSON (records.h),
//   training lines with "eta_s" and evaluation lines with "eval_s" added; start-up, summary and
//   log lines carry "event": "start" | "summary" | "log" | "error". The start line also holds
//   the run's facts as values (start_facts(), startup.h).
// As a hook it prints the start-up block (startup.h; ReporterOptions::describe edits it), each
// on_log record with its estimate of the time left, each evaluation, and a summary at the end
// (test accuracy, throughput, every device's peak memory).
//
// The estimate (ETA, "eta_s") is the reporter's own (train/time_left.h): the training steps left
// at the pace of the recent records, plus the evaluations still to come at the measured cost of
// those it has seen.
//
// While a Reporter lives, library log messages (core/log.h) are routed through it, so they do not
// tear the live line and are JSON in json mode; the previous sink is restored on destruction.
// Thread-safety: calls are serialised internally (log messages may come from tower threads).

#include <cstdint>
#include <cstdio>
#include <functional>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/device.h"
#include "core/log.h"
#include "train/hook.h"
#include "train/startup.h"
#include "train/time_left.h"

namespace towerflow::train {

// How progress is shown (see the top of this file).
enum class Progress {
  Auto,   // Live when `out` is a terminal and no launcher started the process, else Plain
  Plain,
  Live,
  Json,
};
// "auto" | "plain" | "live" | "json"; anything else raises InvalidArgument naming the values.
Progress parse_progress(std::string_view text);
std::string_view to_string(Progress progress);
// What `progress` is for output to `out` in this process: Auto becomes Live only when `out` is a
// terminal and no MPI launcher started the process (collectives::launched_by_mpi(): mpirun,
// mpiexec, srun with PMI); else Plain. Note [Plain lines under a launcher] in reporter.cc says why
// a terminal is not enough.
Progress resolve_progress(Progress progress, std::FILE* out);

struct ReporterOptions {
  Progress progress = Progress::Auto;
  std::FILE* out = stdout;
  std::string title = "towerflow";        // the start-up block's title
  // Edits the start-up block's fields (start_fields()) before it is printed.
  std::function<void(const StartInfo&, Fields&)> describe = {};
};

class Reporter : public Hook {
 public:
  explicit Reporter(ReporterOptions options = {});
  ~Reporter() override;
  Reporter(const Reporter&) = delete;
  Reporter& operator=(const Reporter&) = delete;

  // The hook (see above).
  void on_start(const StartInfo& start) override;
  void on_log(const TrainRecord& r) override;
  void on_step(const StepInfo&) override;  // after the run's first step: the kernels chosen in it
  void on_epoch_end(std::int64_t) override { epoch_end(); }
  void on_eval(const EvalRecord& r) override;
  void on_end(const FitResult& result) override;

  // A titled block of key/value lines. JSON: one object with "event".
  void block(const std::string& event, const std::string& title, const Fields& fields);
  // A training record with the time left (eta_s: seconds), an evaluation.
  void train(const TrainRecord& r, double eta_s);
  void eval(const EvalRecord& r);
  void epoch_end();                   // keeps the live line as a normal line
  void message(LogLevel level, std::string_view text);
  // A line of the application's own, such as a prediction (in JSON mode, a JSON object).
  void line(const std::string& text);
  // JSON mode: {"event": "summary", ...} is built from these; text mode prints block() lines.
  void summary(const Fields& fields, const std::string& json_object);

  // The form chosen (Plain, Live or Json: never Auto).
  Progress progress() const { return progress_; }
  bool live() const { return progress_ == Progress::Live; }
  // Sets ReporterOptions::title and ::describe, for an application that learns them after the
  // reporter was made.
  void set_start_block(std::string title, std::function<void(const StartInfo&, Fields&)> describe);

 private:
  void clear_live_locked();
  void write_locked(const std::string& line);  // a whole line

  ReporterOptions options_;
  Progress progress_ = Progress::Plain;  // resolved
  bool live_shown_ = false;
  std::mutex mu_;
  LogSink previous_sink_;
  std::vector<Device> devices_;  // of the run being reported, for the summary's peak memory
  // The estimate of the time left (on_start sets the run's shape).
  TimeLeft time_left_;
  std::int64_t last_step_ = 0;            // of the previous record
  std::int64_t steps_per_epoch_ = 1;
  int epochs_ = 0, eval_every_ = 0;
  bool evaluates_ = false;                // the run has a validation or test set
  bool first_step_done_ = false;
  std::size_t kernel_choices_before_ = 0;  // of the process, when the run started
};

std::string format_duration(double seconds);  // "1:02:03", "4:05"

}  // namespace towerflow::train
