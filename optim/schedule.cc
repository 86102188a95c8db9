#include "optim/schedule.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numbers>
#include <string>

#include "core/error.h"

namespace towerflow::optim {

namespace {

void require_lr(double lr, const char* who) {
  if (!std::isfinite(lr) || lr < 0)
    raise<InvalidArgument>(who, " learning rate ", lr, " is invalid; use a finite value >= 0");
}

void require_steps(std::int64_t steps, const char* who) {
  if (steps <= 0)
    raise<InvalidArgument>(who, " needs a positive number of steps, got ", steps,
                           "; pass the length of training (epochs * steps per epoch)");
}

// PyTorch's _annealing_cos: from start to end as pct goes 0 -> 1.
double annealing_cos(double start, double end, double pct) {
  return end + (start - end) / 2.0 * (std::cos(std::numbers::pi * pct) + 1);
}

}  // namespace

LrSchedule constant_schedule(double lr) {
  require_lr(lr, "constant schedule");
  return [lr](std::int64_t) { return lr; };
}

LrSchedule step_decay_schedule(double lr, std::vector<std::int64_t> milestones, double gamma) {
  require_lr(lr, "step schedule");
  if (!std::is_sorted(milestones.begin(), milestones.end()))
    raise<InvalidArgument>("step schedule milestones must increase; sort them (e.g. step:30000,60000)");
  if (!(gamma > 0) || !std::isfinite(gamma))
    raise<InvalidArgument>("step schedule gamma ", gamma, " is invalid; use a positive factor (e.g. 0.1)");
  return [lr, milestones = std::move(milestones), gamma](std::int64_t step) {
    const auto passed = std::upper_bound(milestones.begin(), milestones.end(), step) - milestones.begin();
    return lr * std::pow(gamma, static_cast<double>(passed));
  };
}

LrSchedule cosine_schedule(double lr, std::int64_t total_steps, double min_lr) {
  require_lr(lr, "cosine schedule");
  require_lr(min_lr, "cosine schedule minimum");
  require_steps(total_steps, "cosine schedule");
  return [=](std::int64_t step) {
    if (step >= total_steps) return min_lr;
    return min_lr + (lr - min_lr) *
                        (1 + std::cos(std::numbers::pi * static_cast<double>(step) / total_steps)) / 2;
  };
}

LrSchedule warmup_schedule(LrSchedule after, std::int64_t warmup_steps, double start_factor) {
  if (!after) raise<InvalidArgument>("warm-up needs a schedule to warm up into");
  if (warmup_steps < 0)
    raise<InvalidArgument>("warm-up steps ", warmup_steps, " is invalid; use a count >= 0");
  if (!(start_factor >= 0 && start_factor <= 1))
    raise<InvalidArgument>("warm-up start factor ", start_factor, " is invalid; use a value in [0, 1]");
  return [after = std::move(after), warmup_steps, start_factor](std::int64_t step) {
    if (step >= warmup_steps) return after(step);
    const double f = start_factor + (1 - start_factor) * static_cast<double>(step) / warmup_steps;
    return after(step) * f;
  };
}

LrSchedule one_cycle_schedule(double max_lr, std::int64_t total_steps, OneCycleOptions o) {
  require_lr(max_lr, "one-cycle schedule");
  require_steps(total_steps, "one-cycle schedule");
  if (!(o.pct_start > 0 && o.pct_start < 1))
    raise<InvalidArgument>("one-cycle pct_start ", o.pct_start, " is invalid; use a value in (0, 1) (e.g. 0.3)");
  if (!(o.div_factor > 0) || !(o.final_div_factor > 0))
    raise<InvalidArgument>("one-cycle div_factor and final_div_factor must be positive (got ",
                           o.div_factor, ", ", o.final_div_factor, ")");
  const double initial = max_lr / o.div_factor;
  const double final_lr = initial / o.final_div_factor;
  // PyTorch's phase ends: the rise ends at step pct_start * total - 1, the fall at total - 1.
  const double up_end = o.pct_start * static_cast<double>(total_steps) - 1;
  const double down_end = static_cast<double>(total_steps) - 1;
  return [=](std::int64_t step_i) {
    const double step = static_cast<double>(std::min(step_i, total_steps - 1));
    if (step <= up_end) return annealing_cos(initial, max_lr, up_end > 0 ? step / up_end : 1.0);
    return annealing_cos(max_lr, final_lr, (step - up_end) / (down_end - up_end));
  };
}

std::int64_t step_at_fraction(double fraction, std::int64_t total_steps) {
  require_steps(total_steps, "a knot at a fraction of training");
  if (!(fraction >= 0 && fraction <= 1))
    raise<InvalidArgument>("knot fraction ", fraction,
                           " is invalid; use a share of training in [0, 1] (e.g. 0.23)");
  // Python's int() truncates; the product is the same double as Python's fraction * total.
  return static_cast<std::int64_t>(fraction * static_cast<double>(total_steps));
}

LrSchedule piecewise_linear_schedule(double lr, std::vector<LrKnot> knots) {
  require_lr(lr, "piecewise-linear schedule");
  if (knots.empty())
    raise<InvalidArgument>("piecewise-linear schedule needs at least one knot (e.g. {{0, 0.2}, {100, 1.0}})");
  for (std::size_t i = 0; i < knots.size(); ++i) {
    const LrKnot& k = knots[i];
    if (k.step < 0 || (i > 0 && k.step < knots[i - 1].step))
      raise<InvalidArgument>("piecewise-linear schedule knot ", i + 1, " is at step ", k.step,
                             "; knots go in order of step from 0 (the knot before is at step ",
                             i > 0 ? knots[i - 1].step : 0, ")");
    if (!(k.factor >= 0) || !std::isfinite(k.factor))
      raise<InvalidArgument>("piecewise-linear schedule knot ", i + 1, " (step ", k.step, ") has factor ",
                             k.factor, "; use a finite factor >= 0 of the learning rate");
  }
  return [lr, knots = std::move(knots)](std::int64_t step) {
    // The last knot at or before the step: the segment it starts (the next knot lies after the
    // step, so the division is by a positive length).
    const auto after = std::upper_bound(knots.begin(), knots.end(), step,
                                        [](std::int64_t s, const LrKnot& k) { return s < k.step; });
    if (after == knots.begin()) return lr * knots.front().factor;
    if (after == knots.end()) return lr * knots.back().factor;
    const LrKnot& a = *(after - 1);
    const LrKnot& b = *after;
    const double f = static_cast<double>(step - a.step) / static_cast<double>(b.step - a.step);
    return lr * (a.factor * (1 - f) + b.factor * f);
  };
}

namespace {

[[noreturn]] void bad_spec(std::string_view spec, std::string_view why) {
  raise<InvalidArgument>("learning-rate schedule '", spec, "' is invalid (", why,
                         "); use constant, step:M1,M2[:GAMMA], cosine[:MIN_LR], onecycle[:PCT_START], "
                         "linear:FRACTION=FACTOR,... (e.g. linear:0=0.2,0.23=1,1=0.07), "
                         "optionally after warmup:STEPS, (e.g. warmup:500,cosine)");
}

template <typename T>
T parse_number(std::string_view spec, std::string_view text) {
  T value{};
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || text.empty()) bad_spec(spec, str("'", text, "' is not a number"));
  return value;
}

}  // namespace

LrSchedule parse_schedule(std::string_view spec, double base_lr, std::int64_t total_steps) {
  std::string_view rest = spec;
  std::int64_t warmup = -1;
  if (rest.starts_with("warmup:")) {
    const auto comma = rest.find(',');
    if (comma == std::string_view::npos) bad_spec(spec, "warm-up needs a schedule after a comma");
    warmup = parse_number<std::int64_t>(spec, rest.substr(7, comma - 7));
    rest = rest.substr(comma + 1);
  }
  const auto colon = rest.find(':');
  const std::string_view kind = rest.substr(0, colon);
  const std::string_view args = colon == std::string_view::npos ? std::string_view{} : rest.substr(colon + 1);
  LrSchedule s;
  if (kind == "constant") {
    if (!args.empty()) bad_spec(spec, "constant takes no arguments");
    s = constant_schedule(base_lr);
  } else if (kind == "step") {
    const auto gamma_colon = args.find(':');
    std::string_view list = args.substr(0, gamma_colon);
    double gamma = 0.1;
    if (gamma_colon != std::string_view::npos) gamma = parse_number<double>(spec, args.substr(gamma_colon + 1));
    if (list.empty()) bad_spec(spec, "step needs milestones");
    std::vector<std::int64_t> milestones;
    while (!list.empty()) {
      const auto c = list.find(',');
      milestones.push_back(parse_number<std::int64_t>(spec, list.substr(0, c)));
      list = c == std::string_view::npos ? std::string_view{} : list.substr(c + 1);
    }
    s = step_decay_schedule(base_lr, std::move(milestones), gamma);
  } else if (kind == "cosine") {
    s = cosine_schedule(base_lr, total_steps, args.empty() ? 0.0 : parse_number<double>(spec, args));
  } else if (kind == "onecycle") {
    OneCycleOptions o;
    if (!args.empty()) o.pct_start = parse_number<double>(spec, args);
    s = one_cycle_schedule(base_lr, total_steps, o);
  } else if (kind == "linear") {
    if (args.empty()) bad_spec(spec, "linear needs knots FRACTION=FACTOR, e.g. linear:0=0.2,0.23=1,1=0.07");
    require_steps(total_steps, "linear schedule");
    std::vector<LrKnot> knots;
    double last = 0;
    std::string_view list = args;
    while (!list.empty()) {
      const auto c = list.find(',');
      const std::string_view knot = list.substr(0, c);
      const auto eq = knot.find('=');
      if (eq == std::string_view::npos) bad_spec(spec, str("knot '", knot, "' is not FRACTION=FACTOR"));
      const double fraction = parse_number<double>(spec, knot.substr(0, eq));
      const double factor = parse_number<double>(spec, knot.substr(eq + 1));
      if (!(fraction >= 0 && fraction <= 1))
        bad_spec(spec, str("knot fraction ", fraction, " lies outside [0, 1]"));
      if (fraction < last) bad_spec(spec, "knot fractions must not decrease");
      if (!(factor >= 0) || !std::isfinite(factor))
        bad_spec(spec, str("knot factor ", factor, " is not a finite value >= 0"));
      knots.push_back({.step = step_at_fraction(fraction, total_steps), .factor = factor});
      last = fraction;
      list = c == std::string_view::npos ? std::string_view{} : list.substr(c + 1);
    }
    s = piecewise_linear_schedule(base_lr, std::move(knots));
  } else {
    bad_spec(spec, str("unknown kind '", kind, "'"));
  }
  if (warmup >= 0) s = warmup_schedule(std::move(s), warmup, 0.0);
  return s;
}

}  // namespace towerflow::optim
