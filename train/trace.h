#pragma once
// Trace: a hook of fit() that records a timeline of steps first..last (core/trace.h) and writes it
// as Chrome Trace Event JSON when they are done (or when the run ends), then logs a per-op summary
// (total time and share per op and per kind of work).
//
//   train::Trace timeline{{.path = "trace.json", .first_step = 101, .last_step = 110}};
//   train::fit(..., {&timeline, &progress});
//   // open trace.json in ui.perfetto.dev or chrome://tracing
//
// What the timeline holds, one track per thread: the training loop (waits for batches,
// forward_backward, the optimizer step, checkpoints), each tower's thread (its forward and
// backward, each layer and op within them, the gradient reduction, per bucket under bucketed
// reduction, waits for the other towers), the loader's threads (each batch they make).
// Steps count as fit() counts them (1 is the first); steps outside first..last cost nothing.
// At the run's start, DataError when the trace's folder does not exist or the file cannot be
// written (before any step), and a warning when first..last lies outside the steps the run makes.

#include <cstdint>
#include <filesystem>
#include <string>

#include "train/hook.h"

namespace towerflow::train {

struct TraceOptions {
  std::filesystem::path path = "trace.json";
  std::int64_t first_step = 1;
  std::int64_t last_step = 10;
};

// "A:B" (steps A to B, 1-based, inclusive) or "A" (one step). InvalidArgument otherwise.
void parse_trace_steps(std::string_view spec, TraceOptions& options);

class Trace : public Hook {
 public:
  explicit Trace(TraceOptions options);
  ~Trace() override;

  void on_start(const StartInfo& start) override;
  void on_step(const StepInfo& s) override;
  void on_end(const FitResult&) override;

  // The summary table of the finished trace (empty before).
  const std::string& summary() const { return summary_; }
  bool written() const { return written_; }

 private:
  void finish(std::int64_t last_step);

  TraceOptions options_;
  bool active_ = false, written_ = false;
  std::int64_t began_at_ = 0;
  std::string summary_;
};

}  // namespace towerflow::train
