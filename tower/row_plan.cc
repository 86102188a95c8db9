#include "tower/row_plan.h"

#include <algorithm>

#include "core/error.h"

namespace towerflow::tower {

RowPlan::RowPlan(std::vector<Device> global_devices, int rank, int towers, SplitPolicy split,
                 Remainder remainder, int micro_batches, bool every_tower_needs_rows)
    : global_devices_(std::move(global_devices)), rank_(rank), towers_(towers), split_(std::move(split)),
      remainder_(remainder), micro_batches_(micro_batches), every_tower_needs_rows_(every_tower_needs_rows) {
  if (std::holds_alternative<AutoSplit>(split_))
    schedule_[0] = std::vector<double>(global_devices_.size(), 1.0 / static_cast<double>(global_devices_.size()));
}

void RowPlan::set_shares(std::int64_t from, std::vector<double> shares) {
  TW_CHECK(std::holds_alternative<AutoSplit>(split_) && shares.size() == global_devices_.size(), "shares of ",
           shares.size(), " towers for ", global_devices_.size(), " under split ", to_string(split_));
  std::lock_guard lock(mu_);
  schedule_.erase(schedule_.lower_bound(from), schedule_.end());
  schedule_[from] = std::move(shares);
}

void RowPlan::forget_before(std::int64_t step) {
  std::lock_guard lock(mu_);
  auto in_force = schedule_.upper_bound(step);
  if (in_force != schedule_.begin()) schedule_.erase(schedule_.begin(), std::prev(in_force));
}

std::vector<double> RowPlan::shares_at(std::int64_t step) const {
  std::lock_guard lock(mu_);
  if (schedule_.empty()) return {};
  auto it = schedule_.upper_bound(step);
  return it == schedule_.begin() ? it->second : std::prev(it)->second;  // before the first kept: the first
}

SplitPolicy RowPlan::policy_at(std::int64_t step) const {
  if (!std::holds_alternative<AutoSplit>(split_)) return split_;
  return WeightedSplit{shares_at(step)};
}

std::vector<std::vector<int>> RowPlan::split(int global_n, std::int64_t step) const {
  const int k = micro_batches_;
  const std::vector<int> micro =
      split_batch(global_n, std::vector<Device>(k, Device::cpu(0)), EvenSplit{}, Remainder::Spread);
  const SplitPolicy policy = policy_at(step);
  const Remainder remainder = std::holds_alternative<AutoSplit>(split_) ? Remainder::Spread : remainder_;
  const bool balanced = std::holds_alternative<AutoSplit>(split_);
  std::vector<std::vector<int>> rows;
  for (int m = 0; m < k; ++m) {
    rows.push_back(split_batch(micro[m], global_devices_, policy, remainder));
    // An auto split under synchronised batch norm gives every tower a row where the micro-batch
    // has one for each, taken from the tower with the most (its floor alone may round to 0).
    if (balanced && every_tower_needs_rows_ && micro[m] >= static_cast<int>(global_devices_.size()))
      for (int& r : rows.back())
        if (r == 0) {
          r = 1;
          *std::max_element(rows.back().begin(), rows.back().end()) -= 1;
        }
  }
  return rows;
}

std::vector<std::pair<int, int>> RowPlan::shard(int global_n, std::int64_t step) const {
  if (global_n < 1) raise<InvalidArgument>("a global batch of ", global_n, " rows has no shard; give at least one row");
  std::vector<std::pair<int, int>> ranges;
  int base = 0;
  for (const std::vector<int>& g : split(global_n, step)) {
    int begin = base;
    for (int t = 0; t < rank_ * towers_; ++t) begin += g[static_cast<std::size_t>(t)];
    int end = begin;
    for (int i = 0; i < towers_; ++i) end += g[static_cast<std::size_t>(rank_ * towers_ + i)];
    for (int v : g) base += v;
    if (end == begin) continue;
    if (!ranges.empty() && ranges.back().second == begin) ranges.back().second = end;
    else ranges.emplace_back(begin, end);
  }
  return ranges;
}

StepRows RowPlan::step(int global_n, int process_rows, std::int64_t step) const {
  const int k = micro_batches_, n = towers_;
  const int G = static_cast<int>(global_devices_.size());
  const bool across = G > n;
  if (global_n < 1) raise<InvalidArgument>("forward_backward got an empty batch; give at least one row");
  if (global_n < k)
    raise<InvalidArgument>("batch ", global_n, " cannot be cut into ", k,
                           " micro-batches (accumulation_steps); use a batch of at least ", k);
  const std::vector<std::vector<int>> global_rows = split(global_n, step);
  StepRows s{.global_n = global_n, .rows = std::vector<std::vector<int>>(k),
             .offset = std::vector<std::vector<int>>(k), .total = std::vector<int>(n, 0),
             .global_total = std::vector<int>(global_rows.front().size(), 0)};
  int base = 0;
  for (int m = 0; m < k; ++m) {
    for (std::size_t g = 0; g < global_rows[m].size(); ++g) s.global_total[g] += global_rows[m][g];
    for (int i = 0; i < n; ++i) {
      s.rows[m].push_back(global_rows[m][static_cast<std::size_t>(rank_ * n + i)]);
      s.offset[m].push_back(base);
      base += s.rows[m][i];
      s.total[i] += s.rows[m][i];
    }
  }
  if (base != process_rows)
    raise<InvalidArgument>(across ? str("process rank ", rank_, " got ") : std::string("got "), process_rows,
                           " rows, but the split of the global batch of ", global_n, " over ", G,
                           " towers gives this process's towers ", base, "; ",
                           across ? "load each process's rows with Trainer::shard() (train::fit does)"
                                  : "give the whole batch");
  if (every_tower_needs_rows_) {
    for (int m = 0; m < k; ++m)
      for (int g = 0; g < G; ++g)
        if (global_rows[m][static_cast<std::size_t>(g)] == 0)
          raise<InvalidArgument>(
              "batch ", global_n, (k > 1 ? str(" (micro-batch ", m, ")") : ""), " gives tower ", g, " (",
              global_devices_[static_cast<std::size_t>(g)],
              across ? str(" of rank ", g / n) : std::string(), ") no rows; synchronised batch norm needs "
              "every tower in every ", k > 1 ? "micro-batch" : "step", ": use a batch of at least ",
              G * k, " (or per-tower batch norm)");
  }
  return s;
}

}  // namespace towerflow::tower
