// RowPlan (tower/row_plan.h) alone: the rows each tower of each process takes, written out by
// hand for small cases.
#include <catch2/catch.hpp>

#include "core/error.h"
#include "tower/row_plan.h"

using namespace towerflow;
using namespace towerflow::tower;

namespace {
// Two processes of two CPU towers: global towers 0,1 (rank 0) and 2,3 (rank 1).
std::vector<Device> four() { return {Device::cpu(0), Device::cpu(1), Device::cpu(0), Device::cpu(1)}; }
}  // namespace

TEST_CASE("a row plan: micro-batches split over every process's towers, this process's rows in order", "[tower][rows]") {
  // Weights 3,1,1,3 over 16 rows in 2 micro-batches of 8: each micro-batch gives 3,1,1,3.
  const RowPlan rank1(four(), /*rank=*/1, /*towers=*/2, WeightedSplit{{3, 1, 1, 3}}, Remainder::Error, 2, false);
  CHECK(rank1.split(16) == std::vector<std::vector<int>>{{3, 1, 1, 3}, {3, 1, 1, 3}});
  // Rank 1 holds rows 4..7 of micro-batch 0 and 12..15 of micro-batch 1.
  CHECK(rank1.shard(16) == std::vector<std::pair<int, int>>{{4, 8}, {12, 16}});
  const StepRows s = rank1.step(16, 8);
  CHECK(s.rows == std::vector<std::vector<int>>{{1, 3}, {1, 3}});
  CHECK(s.offset == std::vector<std::vector<int>>{{0, 1}, {4, 5}});
  CHECK(s.total == std::vector<int>{2, 6});
  // Contiguous ranges merge: rank 0 with one micro-batch.
  const RowPlan rank0(four(), 0, 2, EvenSplit{}, Remainder::Error, 1, false);
  CHECK(rank0.shard(8) == std::vector<std::pair<int, int>>{{0, 4}});
}

TEST_CASE("a row plan refuses batches it cannot take, naming the value and the fix", "[tower][rows]") {
  const RowPlan one({Device::cpu(0), Device::cpu(1)}, 0, 2, EvenSplit{}, Remainder::Spread, 3, true);
  CHECK_THROWS_WITH(one.step(2, 2), Catch::Contains("batch 2 cannot be cut into 3 micro-batches") &&
                                        Catch::Contains("at least 3"));
  CHECK_THROWS_WITH(one.step(12, 10), Catch::Contains("got 10 rows") && Catch::Contains("gives this process's towers 12"));
  // Spread leaves tower 1 without rows in a micro-batch of 1: synchronised batch norm refuses.
  CHECK_THROWS_WITH(one.step(4, 4), Catch::Contains("gives tower 1 (/cpu:1) no rows") &&
                                        Catch::Contains("use a batch of at least 6"));
  CHECK_THROWS_AS(one.shard(0), InvalidArgument);
}
