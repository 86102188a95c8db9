#pragma once
// StopOnSignal: a hook of fit() that turns SIGINT (Ctrl-C) and SIGTERM (what cluster schedulers
// send before preempting a job) into a clean stop: the step under way finishes, a checkpoint is
// written, and fit() returns with FitResult::stopped_early and a reason naming the signal. The
// final evaluation is skipped (a preempted job has seconds, not minutes). A second signal ends
// the process at once, by that signal; checkpoints are written atomically (checkpoint.h), so no
// partial one is left.
//
//   train::StopOnSignal signals;            // handlers installed until it is destroyed
//   auto result = train::fit(..., {&signals, &progress});
//   if (signals.received()) return 128 + signals.received();   // the shell's convention
//
// Contract: one StopOnSignal at a time in a process (InvalidArgument for a second); the handlers
// it replaced are restored on destruction. The handler only records the signal and writes a fixed
// line to stderr (async-signal-safe); the stop happens on the training thread, after the step.

#include <csignal>

#include "train/hook.h"

namespace towerflow::train {

class StopOnSignal : public Hook {
 public:
  StopOnSignal();
  ~StopOnSignal() override;
  StopOnSignal(const StopOnSignal&) = delete;
  StopOnSignal& operator=(const StopOnSignal&) = delete;

  void on_start(const StartInfo&) override { check(); }
  void on_step(const StepInfo&) override { check(); }
  void on_eval(const EvalRecord&) override { check(); }

  // The first signal received (SIGINT or SIGTERM), 0 if none.
  int received() const;

 private:
  void check();
  struct sigaction previous_int_ {}, previous_term_ {};
};

}  // namespace towerflow::train
