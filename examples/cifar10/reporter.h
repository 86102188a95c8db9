#pragma once
// Reporter: everything the trainer tells its user, in one of three forms.
//
// - On a terminal: a live progress line (epoch, step, loss, accuracy, images/s, ETA) redrawn in
//   place, kept as a normal line at the end of each epoch; other lines go above it.
// - Not a terminal (a pipe, a log file): the same progress as plain lines, one per report.
// - With json: one JSON object per line on the output, nothing else; training lines carry
//   "step", "epoch", "loss", "acc", "lr", "img_per_s", evaluation lines "test_loss", "test_acc";
//   start-up, summary and log lines carry "event": "start" | "summary" | "log" | "error".
// Independently, every training and evaluation record is appended to metrics.jsonl (when a
// path is given) as one JSON object per line (io::LineAppender: whole lines even if killed).
//
// While a Reporter lives, library log messages (core/log.h) are routed through it, so they do not
// tear the live line and are JSON in json mode; the previous sink is restored on destruction.
// Thread-safety: calls are serialised internally (log messages may come from tower threads).

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/log.h"
#include "io/atomic_file.h"

namespace towerflow::cifar10 {

struct TrainRecord {
  std::int64_t step = 0;        // steps done (1 after the first)
  std::int64_t total_steps = 0;
  double epoch = 0;             // fractional: 2.5 is half-way through the third epoch
  int epochs = 0;
  double loss = 0;              // mean over the steps since the last record
  double acc = 0;               // training top-1 over the same steps, in [0, 1]
  double lr = 0;
  double img_per_s = 0;
  double eta_s = 0;
};

struct EvalRecord {
  std::int64_t step = 0;
  double epoch = 0;
  double test_loss = 0;
  double test_acc = 0;          // top-1 in [0, 1]
  std::int64_t examples = 0;
  double seconds = 0;
};

struct ReporterOptions {
  bool json = false;
  int live = -1;                          // -1: when `out` is a terminal; 0: never; 1: always
  std::FILE* out = stdout;
  std::filesystem::path metrics_path = {};  // empty: no metrics file
};

class Reporter {
 public:
  explicit Reporter(ReporterOptions options);
  ~Reporter();
  Reporter(const Reporter&) = delete;
  Reporter& operator=(const Reporter&) = delete;

  // A titled block of key/value lines (start-up, summary). JSON: one object with "event".
  using Fields = std::vector<std::pair<std::string, std::string>>;
  void block(const std::string& event, const std::string& title, const Fields& fields);
  void train(const TrainRecord& r);
  void eval(const EvalRecord& r);
  void epoch_end();                   // keeps the live line as a normal line
  void message(LogLevel level, std::string_view text);
  // JSON mode: {"event": "summary", ...} is built from these; text mode prints block() lines.
  void summary(const Fields& fields, const std::string& json_object);

  // Starts appending records to a metrics file (replacing any set before).
  void open_metrics(const std::filesystem::path& path);

  bool live() const { return live_; }

 private:
  void clear_live_locked();
  void write_locked(const std::string& line);  // a whole line

  ReporterOptions options_;
  bool live_ = false;
  bool live_shown_ = false;
  std::mutex mu_;
  io::LineAppender metrics_;
  LogSink previous_sink_;
};

std::string format_duration(double seconds);  // "1:02:03", "4:05"

// The time a run has left: training steps at their recent pace plus the evaluations still to come
// at their measured cost. The pace is an average over roughly the last kPaceSteps steps, so a slow
// start (caches, a busy machine) fades from the estimate instead of weighing on it to the end.
class TimeLeft {
 public:
  static constexpr double kPaceSteps = 500;
  void add_steps(std::int64_t steps, double seconds);  // a window of training steps
  void add_eval(double seconds);
  // Before any evaluation was timed, evaluations count as free.
  double seconds(std::int64_t steps_left, std::int64_t evals_left) const;

 private:
  double sec_per_step_ = 0;
  bool paced_ = false;
  double eval_seconds_ = 0;
  std::int64_t evals_ = 0;
};

// Evaluations a run still makes after `epochs_done` whole epochs of `epochs`: one every
// `eval_every` epochs (0: none on the way) and one at the end.
std::int64_t evals_left(std::int64_t epochs_done, std::int64_t epochs, int eval_every);

}  // namespace towerflow::cifar10
