#pragma once
// RowPlan (private to tower/): which rows of a global batch each tower of each process takes.
//
// Contract:
// - A global batch of B rows is cut into k micro-batches (accumulation_steps; sizes differ by at
//   most a row), and each micro-batch is split over every process's towers, global tower
//   g = rank * towers + i (split.h: SplitPolicy and Remainder).
// - A process holds only its towers' rows, micro-batch 0's first, then micro-batch 1's, ...
//   (shard(B) as [begin, end) ranges of the global batch, merged where contiguous).
// - step(B, n) gives the rows and offsets (into this process's n rows) of every micro-batch and
//   tower, or raises InvalidArgument when B cannot be cut into k micro-batches, when the split
//   does (Remainder::Error), or when n is not this process's share; with
//   every_tower_needs_rows, also when a micro-batch leaves a tower without rows (synchronised
//   batch norm: a tower without rows cannot join the layers' exchanges).
// - AutoSplit: the split follows a schedule of shares (set_shares: in force from a step on,
//   starting even from step 0), apportioned with Remainder::Spread; every other policy ignores
//   the step. shard() may be called from a loader's threads while the trainer sets shares.

#include <cstdint>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "core/device.h"
#include "tower/split.h"

namespace towerflow::tower {

struct StepRows {
  int global_n = 0;                    // B
  std::vector<std::vector<int>> rows;  // [micro-batch][tower of this process]
  std::vector<std::vector<int>> offset;  // first row in this process's batch, same indexing
  std::vector<int> total;              // rows per tower of this process, over all micro-batches
  std::vector<int> global_total;       // rows per tower of every process, over all micro-batches
};

class RowPlan {
 public:
  RowPlan(std::vector<Device> global_devices, int rank, int towers, SplitPolicy split,
          Remainder remainder, int micro_batches, bool every_tower_needs_rows);

  // Rows per micro-batch and global tower, at run step `step` (AutoSplit).
  std::vector<std::vector<int>> split(int global_n, std::int64_t step = 0) const;
  std::vector<std::pair<int, int>> shard(int global_n, std::int64_t step = 0) const;
  StepRows step(int global_n, int process_rows, std::int64_t step = 0) const;

  // AutoSplit: the shares of every global tower from run step `from` on (entries from `from` on
  // are replaced); forget_before(s) drops the entries no step from s on uses (a step before the
  // first entry kept gets that entry's shares).
  void set_shares(std::int64_t from, std::vector<double> shares);
  void forget_before(std::int64_t step);
  std::vector<double> shares_at(std::int64_t step) const;

 private:
  SplitPolicy policy_at(std::int64_t step) const;

  std::vector<Device> global_devices_;
  int rank_, towers_;
  SplitPolicy split_;
  Remainder remainder_;
  int micro_batches_;
  bool every_tower_needs_rows_;
  mutable std::mutex mu_;
  std::map<std::int64_t, std::vector<double>> schedule_;  // AutoSplit, under mu_
};

}  // namespace towerflow::tower
