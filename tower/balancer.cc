#include "tower/balancer.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace towerflow::tower {

// Note [Auto-balanced towers]: a synchronous step lasts as long as its slowest tower, so the
// split that minimises it gives every tower rows in proportion to its speed (rows per second):
// then all finish together. Speeds are measured, not assumed: each step the trainer times every
// tower's forward and backward passes (not its waits for the others, the data or the reduction)
// and divides by its rows. One step's time is noisy (a shared machine, a page fault), so the
// balancer averages seconds per row over steps and changes the split only when the average
// predicts a step at least `hysteresis` shorter: noise then leaves the split alone. A long
// average follows a real change slowly, so a change is detected apart: three measurements in a
// row more than 20% on one side of the average (noise of +-10% never is) restart it from them,
// and a tower that turns twice as slow moves the split within 4 steps. A floor keeps every tower measured: a
// tower given no rows would never show that it has recovered. The time per row ignores a step's
// fixed cost (launching, the reduction's set-up), which is small next to a batch's rows on the
// devices this is for; it makes the balancer give a slow tower slightly too many rows, never
// too few.

namespace {
constexpr int kShiftSteps = 3;  // measurements in a row beyond 20% that restart an average
}  // namespace

void check(const AutoSplit& o) {
  if (o.freeze_after < 0)
    raise<InvalidArgument>("AutoSplit::freeze_after is ", o.freeze_after, "; use 0 (never freeze) or a number of steps");
  if (o.warmup < 0) raise<InvalidArgument>("AutoSplit::warmup is ", o.warmup, "; use 0 or more steps (1 by default)");
  if (!(o.smoothing > 0 && o.smoothing <= 1))
    raise<InvalidArgument>("AutoSplit::smoothing is ", o.smoothing, "; use a weight in (0, 1] (0.1 by default)");
  if (!(o.min_share >= 0 && o.min_share <= 1))
    raise<InvalidArgument>("AutoSplit::min_share is ", o.min_share,
                           "; use a fraction of an even share in [0, 1] (0.1 by default)");
  if (!(o.hysteresis >= 0 && o.hysteresis < 1))
    raise<InvalidArgument>("AutoSplit::hysteresis is ", o.hysteresis, "; use a fraction in [0, 1) (0.05 by default)");
}

std::vector<double> balanced_shares(std::span<const double> seconds_per_row, double floor) {
  const std::size_t n = seconds_per_row.size();
  TW_CHECK(n > 0 && floor >= 0 && floor * static_cast<double>(n) <= 1 + 1e-12, "shares of ", n, " towers with floor ", floor);
  for (double t : seconds_per_row) TW_CHECK(t > 0 && std::isfinite(t), "seconds per row ", t);
  std::vector<double> shares(n, 0.0);
  std::vector<bool> at_floor(n, false);
  for (bool changed = true; changed;) {  // at most n rounds: each raises another tower to the floor
    changed = false;
    double rest = 1, speed = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (at_floor[i]) rest -= floor;
      else speed += 1 / seconds_per_row[i];
    }
    for (std::size_t i = 0; i < n; ++i) {
      if (at_floor[i]) {
        shares[i] = floor;
        continue;
      }
      shares[i] = rest * (1 / seconds_per_row[i]) / speed;
      if (shares[i] < floor) at_floor[i] = changed = true;
    }
  }
  return shares;
}

double predicted_step(std::span<const double> shares, std::span<const double> seconds_per_row) {
  double slowest = 0;
  for (std::size_t i = 0; i < shares.size(); ++i) slowest = std::max(slowest, shares[i] * seconds_per_row[i]);
  return slowest;
}

Balancer::Balancer(int towers, AutoSplit options, std::vector<double> initial)
    : options_(options),
      shares_(std::move(initial)),
      seconds_per_row_(static_cast<std::size_t>(std::max(towers, 0)), 0.0),
      shifts_(static_cast<std::size_t>(std::max(towers, 0))) {
  if (towers < 1) raise<InvalidArgument>("a balancer needs at least one tower; got ", towers);
  check(options_);
  if (shares_.empty()) shares_.assign(static_cast<std::size_t>(towers), 1.0 / towers);
  if (shares_.size() != static_cast<std::size_t>(towers))
    raise<InvalidArgument>("a balancer of ", towers, " towers got ", shares_.size(), " initial shares; give one per tower");
  double sum = 0;
  for (double s : shares_) {
    if (!(s > 0 && std::isfinite(s)))
      raise<InvalidArgument>("initial share ", s, " is not a positive number; give the split in force, e.g. 0.6,0.4");
    sum += s;
  }
  for (double& s : shares_) s /= sum;
}

bool Balancer::observe(std::span<const double> seconds, std::span<const int> rows) {
  const std::size_t n = shares_.size();
  if (seconds.size() != n || rows.size() != n)
    raise<InvalidArgument>("a balancer of ", n, " towers got ", seconds.size(), " times and ", rows.size(),
                           " row counts; give one of each per tower");
  if (++seen_ <= options_.warmup || frozen()) return false;
  for (std::size_t i = 0; i < n; ++i) {
    if (rows[i] <= 0 || !(seconds[i] > 0) || !std::isfinite(seconds[i])) continue;
    const double x = seconds[i] / rows[i];
    double& average = seconds_per_row_[i];
    if (average == 0) {
      average = x;
      continue;
    }
    Shift& shift = shifts_[i];
    const int side = x > 1.2 * average ? 1 : x < average / 1.2 ? -1 : 0;
    if (side != 0 && side == shift.side) {
      shift.count += 1;
      shift.sum += x;
    } else {
      shift = {.side = side, .count = side != 0 ? 1 : 0, .sum = side != 0 ? x : 0};
    }
    if (shift.count == kShiftSteps) {
      average = shift.sum / kShiftSteps;
      shift = {};
    } else {
      average = (1 - options_.smoothing) * average + options_.smoothing * x;
    }
  }
  ++measured_;
  if (std::find(seconds_per_row_.begin(), seconds_per_row_.end(), 0.0) != seconds_per_row_.end()) return false;
  std::vector<double> target = balanced_shares(seconds_per_row_, options_.min_share / static_cast<double>(n));
  if (predicted_step(target, seconds_per_row_) > (1 - options_.hysteresis) * predicted_step(shares_, seconds_per_row_))
    return false;
  shares_ = std::move(target);
  return true;
}

std::string to_string(const AutoSplit& o) {
  const AutoSplit d;
  std::string s = "auto";
  const auto add = [&](const char* name, auto value, auto fallback) {
    if (value != fallback) s += str(s == "auto" ? ":" : ",", name, "=", value);
  };
  add("freeze_after", o.freeze_after, d.freeze_after);
  add("warmup", o.warmup, d.warmup);
  add("smoothing", o.smoothing, d.smoothing);
  add("min_share", o.min_share, d.min_share);
  add("hysteresis", o.hysteresis, d.hysteresis);
  return s;
}

}  // namespace towerflow::tower
