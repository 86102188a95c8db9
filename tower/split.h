#pragma once
// Batch splitting: how many rows of a global batch each tower gets.
//
//   EvenSplit        B / n rows each. A B that n does not divide is an error naming the batch, the
//                    devices and the nearest batches that work, unless remainder = Spread.
//   WeightedSplit    rows in proportion to the weights (MXNet's work_load_list), for unequal
//                    devices: weights 3,1 give 96 and 32 of 128. A B that does not split exactly
//                    is an error as above, unless remainder = Spread.
//   PerTowerBatch    TensorFlow 1.x's tutorial style: the configured batch is each tower's, so the
//                    global batch is n times it (global_batch() says how much to load).
//   AutoSplit        rows in proportion to each tower's measured speed, so that all finish their
//                    step together (balancer.h; the trainer measures and re-splits). It starts
//                    even and always spreads the remainder; split_batch gives its first split.
//
// With remainder = Spread the rows are apportioned by the largest-remainder method (Hamilton's):
// floor shares first, the rows left over one each to the towers with the largest fractional
// parts, ties to the lower tower index. A tower may get 0 rows then; it still takes part in the
// reduction with a zero gradient.
//
// However the batch is split, every tower scales its loss by the global batch, so the reduced
// gradient is the global-batch mean (Note [Why towers scale loss by B] in trainer.cc).

#include <string>
#include <string_view>
#include <variant>
#include <utility>
#include <vector>

#include "core/device.h"
#include "tower/balancer.h"

namespace towerflow::tower {

struct EvenSplit {};
struct WeightedSplit {
  std::vector<double> weights;  // one per tower, positive
};
struct PerTowerBatch {};
using SplitPolicy = std::variant<EvenSplit, WeightedSplit, PerTowerBatch, AutoSplit>;

enum class Remainder {
  Error,   // a batch that does not split exactly is an InvalidArgument
  Spread,  // largest-remainder apportionment
};

// "even" | "weights:3,1" | "per_tower" | "auto" | "auto:freeze_after=200,min_share=0.2" (any
// AutoSplit field by name). InvalidArgument quoting the string and the forms.
SplitPolicy parse_split(std::string_view spec);
std::string to_string(const SplitPolicy& policy);

// Rows per tower, summing to batch. Throws InvalidArgument for batch < 1, a weights list whose
// length is not devices.size() or with a weight that is not positive and finite, and (with
// Remainder::Error) a batch that does not split exactly:
//   "batch 250 cannot be split evenly over 4 devices (/cpu:0, /cpu:1, /cpu:2, /cpu:3); use batch
//    248 or 252, or let the towers' shares differ by a row (TrainerOptions::remainder =
//    Remainder::Spread)"
std::vector<int> split_batch(int batch, const std::vector<Device>& devices,
                             const SplitPolicy& policy, Remainder remainder = Remainder::Error);

// InvalidArgument unless a global batch of `batch` rows, cut into `micro_batches` micro-batches
// (TrainerOptions::accumulation_steps; their sizes differ by at most a row), splits over `devices`
// (every process's towers) by `policy` in each micro-batch; nothing to check with
// Remainder::Spread. The message names the options that fix it: the nearest batches that split
// (FitOptions::batch), the nearest micro-batch count that does, and TrainerOptions::remainder.
void check_batch_split(int batch, const std::vector<Device>& devices, const SplitPolicy& policy,
                       Remainder remainder, int micro_batches);

// The nearest batches below and above `batch` that split exactly over `towers` (0 where none).
std::pair<int, int> nearest_exact_batches(int batch, std::size_t towers, const SplitPolicy& policy);

// The global batch a loader should produce for a configured batch size: n * batch for
// PerTowerBatch, batch otherwise.
int global_batch(int configured_batch, int towers, const SplitPolicy& policy);

}  // namespace towerflow::tower
