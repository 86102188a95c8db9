#pragma once
// Learning-rate schedules: the learning rate as a pure function of the step (0 for the first
// optimizer step). Each matches its PyTorch counterpart step for step (tests/fixtures/optim).
//
//   constant            lr
//   step_decay          lr * gamma^(number of milestones <= step)          (MultiStepLR)
//   cosine              min + (lr - min) * (1 + cos(pi * step / total)) / 2, min after total
//                                                                           (CosineAnnealingLR)
//   warmup              after(step) * (f + (1 - f) * step / warmup_steps) before warmup_steps,
//                       after(step) from then on: linear warm-up (LinearLR) in front of any schedule
//   one_cycle           Smith's one-cycle: cosine up from max/div to max over pct_start of the
//                       steps, cosine down to max/(div*final_div) at the last step (OneCycleLR)
//   piecewise_linear    lr * factor, the factor linear between knots (step, factor): between
//                       knots a and b, f = (step - a.step) / (b.step - a.step) and
//                       factor = a.factor * (1 - f) + b.factor * f; the first knot's factor
//                       before it, the last knot's after it (LambdaLR with that lambda)
//
// parse_schedule builds one from a command-line string (see its comment); every bad string raises
// InvalidArgument quoting it and showing the accepted forms.

#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

namespace towerflow::optim {

using LrSchedule = std::function<double(std::int64_t step)>;

LrSchedule constant_schedule(double lr);
LrSchedule step_decay_schedule(double lr, std::vector<std::int64_t> milestones, double gamma = 0.1);
LrSchedule cosine_schedule(double lr, std::int64_t total_steps, double min_lr = 0.0);
LrSchedule warmup_schedule(LrSchedule after, std::int64_t warmup_steps, double start_factor = 0.0);

struct OneCycleOptions {
  double pct_start = 0.3;           // share of the steps spent rising
  double div_factor = 25.0;         // initial lr = max_lr / div_factor
  double final_div_factor = 1e4;    // final lr = initial lr / final_div_factor
};
LrSchedule one_cycle_schedule(double max_lr, std::int64_t total_steps, OneCycleOptions options = {});

// A knot of piecewise_linear_schedule: the factor of the lr at an optimizer step.
struct LrKnot {
  std::int64_t step = 0;  // 0 for the first optimizer step
  double factor = 1.0;
};

// The step at `fraction` of total_steps, truncated as Python's int(fraction * total_steps)
// (0.23 of 476 steps is step 109). InvalidArgument for a fraction outside [0, 1] or
// total_steps <= 0.
std::int64_t step_at_fraction(double fraction, std::int64_t total_steps);

// Knots in order of step; two knots at one step make a jump (the later one holds from that step).
// InvalidArgument for no knots, a step < 0 or smaller than the knot before, a factor that is
// negative or not finite, or an invalid lr. airbench94's schedule over T steps:
//   const std::int64_t warmup = step_at_fraction(0.23, T);
//   piecewise_linear_schedule(lr, {{0, 0.2}, {warmup, 1.0}, {T, 0.07}});
// gives step < warmup: 0.2 * (1 - f) + 1.0 * f with f = step / warmup, then 1.0 * (1 - f) + 0.07 * f
// with f = (step - warmup) / (T - warmup): the same double arithmetic, so the same bits.
LrSchedule piecewise_linear_schedule(double lr, std::vector<LrKnot> knots);

// Parses "constant" | "step:M1,M2,...[:GAMMA]" | "cosine[:MIN_LR]" | "onecycle[:PCT_START]" |
// "linear:F1=X1,F2=X2,..." (piecewise linear, knot i at step_at_fraction(Fi, total_steps) with
// factor Xi: "linear:0=0.2,0.23=1,1=0.07" is airbench94's), with an optional "warmup:STEPS,"
// prefix (linear from 0), e.g. "warmup:500,cosine" or "step:32000,48000:0.1". base_lr is the
// peak learning rate; total_steps the length of training (cosine, one-cycle, linear).
LrSchedule parse_schedule(std::string_view spec, double base_lr, std::int64_t total_steps);

}  // namespace towerflow::optim
