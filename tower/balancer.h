#pragma once
// Balancer: the share of the global batch each tower should take so that every tower finishes
// its forward and backward passes together, from each tower's measured compute time
// (Note [Auto-balanced towers] in balancer.cc). A plain function of the times it is given: the
// trainer feeds it what it measures, a test feeds it synthetic times.
//
//   Balancer b(2, {});
//   b.observe({0.10, 0.20}, {64, 64});   // tower 1 takes twice as long per row
//   b.shares();                          // {2/3, 1/3}
//
// Contract:
// - shares() sum to 1, one per tower, each at least min_share of an even share (1 / towers), so
//   a tower that stalls keeps some rows and is still measured; it starts even.
// - observe(seconds, rows): one step's compute seconds and rows per tower. The first `warmup`
//   steps are not measured. A tower's seconds per row are averaged over steps (an exponential
//   moving average with weight `smoothing` for the newest step; its first measurement is taken
//   as it is); a tower whose last 3 measurements all lie more than 20% on the same side of its
//   average has changed speed, and its average restarts from them. A tower with no rows, or a
//   time that is not positive and finite, keeps its average. Once every tower has one, the shares
//   become those that predict equal times, if that predicts a step (the slowest tower's time)
//   at least `hysteresis` shorter than the shares in force do; otherwise they stay.
// - With freeze_after = N > 0, the shares stop changing after N measured steps.
// - Rows are whole: the trainer apportions the shares by the largest-remainder rule
//   (split.h's WeightedSplit with Remainder::Spread).

#include <span>
#include <string>
#include <vector>

namespace towerflow::tower {

struct AutoSplit {
  int freeze_after = 0;     // > 0: keep the shares after this many measured steps
  int warmup = 1;           // first steps not measured (allocator and cache warm-up)
  double smoothing = 0.1;   // weight of the newest step in the average of seconds per row, (0, 1]
  double min_share = 0.1;   // of an even share, [0, 1]: every tower's floor
  double hysteresis = 0.05; // the predicted step must be this much shorter to change the shares
};

// InvalidArgument naming the field, its value and its range.
void check(const AutoSplit& options);

// The shares (summing to 1) that predict equal times when tower i takes seconds_per_row[i] per
// row: in proportion to speed, raised to floor / towers where below it (the rest re-divided
// among the others in proportion to their speed). seconds_per_row must be positive.
std::vector<double> balanced_shares(std::span<const double> seconds_per_row, double floor);

// The slowest tower's time under these shares (of one row of batch): max_i shares[i] * t[i].
double predicted_step(std::span<const double> shares, std::span<const double> seconds_per_row);

class Balancer {
 public:
  // InvalidArgument for towers < 1, bad options (check), or initial shares of the wrong length
  // or not positive (empty: even).
  Balancer(int towers, AutoSplit options, std::vector<double> initial = {});

  // One step's compute seconds and rows per tower; true when the shares changed.
  bool observe(std::span<const double> seconds, std::span<const int> rows);

  const std::vector<double>& shares() const { return shares_; }
  // Each tower's average seconds per row (0 until measured).
  const std::vector<double>& seconds_per_row() const { return seconds_per_row_; }
  int measured_steps() const { return measured_; }
  bool frozen() const { return options_.freeze_after > 0 && measured_ >= options_.freeze_after; }
  const AutoSplit& options() const { return options_; }

 private:
  struct Shift {  // measurements on one side of the average, more than 20% off
    int side = 0, count = 0;
    double sum = 0;
  };
  AutoSplit options_;
  std::vector<double> shares_, seconds_per_row_;
  std::vector<Shift> shifts_;
  int seen_ = 0, measured_ = 0;
};

// "auto" or "auto:freeze_after=200"; the options that differ from the defaults.
std::string to_string(const AutoSplit& options);

}  // namespace towerflow::tower
