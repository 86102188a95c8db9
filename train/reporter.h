#pragma once
// Reporter: everything a training run tells its user, in one of three forms (ReporterOptions::
// progress), as a hook of fit().
//
// - Live: a progress line (epoch, step, loss, accuracy, images/s, ETA) redrawn in place with a
//   carriage return and ESC[K, kept as a normal line at the end of each epoch; other lines go
//   above it.
// - Plain: the same progress as plain lines, one per report; no carriage returns, no escape codes.
// - Json: one JSON object per line on the output, nothing else; training lines carry
//   "step", "epoch", "loss", "acc", "lr", "img_per_s", "eta_s", evaluation lines "test_loss",
//   "test_acc", "test_top5", "test_class_acc" (each class's top-1, null for a class without
//   rows), "examples", "eval_s" (val_ in place of test_ for the validation set); start-up, summary and log lines carry "event": "start" |
//   "summary" | "log" | "error". The start line also holds the block's facts as values:
//   "towerflow" {version, commit}, "run" {run_id, towers, processes, global_batch,
//   rows_per_tower, accumulation_steps, total_steps, steps_per_epoch, epochs, start_step,
//   resumed_from, parameters, num_classes, train_examples, test_examples, val_examples} and "metadata" (what the
//   checkpoints record; a JSON value, such as cifar10_train's options, as an object).
// As a hook it prints the start-up block (the model, data, towers, devices, batch split,
// optimizer, length, checkpoints; ReporterOptions::describe edits it), each on_log record, each
// evaluation, and a summary at the end (test accuracy, throughput, every device's peak memory).
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
#include "data/augment.h"
#include "train/hook.h"

namespace towerflow::train {

// A titled block's key/value lines (start-up, summary), in order.
using Fields = std::vector<std::pair<std::string, std::string>>;
// Sets `key` to `value`: in place if present, else inserted after `after` (or at the end).
void set_field(Fields& fields, const std::string& key, std::string value, const std::string& after = {});

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

// The start-up block's fields for a run.
Fields start_fields(const StartInfo& start);
// "random crops of the image padded by 4, horizontal flips, cutout 12x12", or "none".
std::string describe_augment(const data::Augment& a, const data::MixOptions& mix = {});
// "(x/255 - mean) / std per channel, mean (0.4914, 0.4822, 0.4465), std (...) (CIFAR-10's)".
std::string describe_normalisation(const data::Augment& a);
// Each class's top-1 accuracy from a [true][predicted] confusion matrix (EvalRecord): nullopt for
// a class with no rows; all nullopt when the matrix is not classes x classes.
std::vector<std::optional<double>> class_accuracy(int classes, const std::vector<std::int64_t>& confusion);

class Reporter : public Hook {
 public:
  explicit Reporter(ReporterOptions options = {});
  ~Reporter() override;
  Reporter(const Reporter&) = delete;
  Reporter& operator=(const Reporter&) = delete;

  // The hook (see above).
  void on_start(const StartInfo& start) override;
  void on_log(const TrainRecord& r) override { train(r); }
  void on_epoch_end(std::int64_t) override { epoch_end(); }
  void on_eval(const EvalRecord& r) override { eval(r); }
  void on_end(const FitResult& result) override;

  // A titled block of key/value lines. JSON: one object with "event".
  void block(const std::string& event, const std::string& title, const Fields& fields);
  void train(const TrainRecord& r);
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
};

std::string format_duration(double seconds);  // "1:02:03", "4:05"

// The JSON objects of the records, as metrics.jsonl and the json mode write them (short numbers;
// a non-finite loss is null).
std::string to_json(const TrainRecord& r);
std::string to_json(const EvalRecord& r);

}  // namespace towerflow::train
