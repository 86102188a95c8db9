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
  CHECK(s.global_total == std::vector<int>{6, 2, 2, 6});
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

TEST_CASE("an auto split's row plan follows its schedule by step, for the trainer and a loader alike", "[tower][rows]") {
  RowPlan rank1(four(), 1, 2, AutoSplit{}, Remainder::Error, 1, false);
  // Even from step 0; 3:1:1:3 from step 5; 1:1:1:5 from step 8 (rows 2, 2, 2, 10).
  CHECK(rank1.split(16, 1) == std::vector<std::vector<int>>{{4, 4, 4, 4}});
  rank1.set_shares(5, {0.375, 0.125, 0.125, 0.375});
  rank1.set_shares(8, {0.125, 0.125, 0.125, 0.625});
  CHECK(rank1.shard(16, 4) == std::vector<std::pair<int, int>>{{8, 16}});
  CHECK(rank1.shard(16, 5) == std::vector<std::pair<int, int>>{{8, 16}});
  CHECK(rank1.step(16, 8, 6).rows == std::vector<std::vector<int>>{{2, 6}});
  CHECK(rank1.shard(16, 9) == std::vector<std::pair<int, int>>{{4, 16}});
  CHECK(rank1.step(16, 12, 9).total == std::vector<int>{2, 10});
  // A later decision replaces what was scheduled from its step on; the past can be forgotten.
  rank1.set_shares(7, {0.25, 0.25, 0.25, 0.25});
  CHECK(rank1.shares_at(9) == std::vector<double>{0.25, 0.25, 0.25, 0.25});
  CHECK(rank1.shares_at(6) == std::vector<double>{0.375, 0.125, 0.125, 0.375});
  rank1.forget_before(6);
  CHECK(rank1.shares_at(6) == std::vector<double>{0.375, 0.125, 0.125, 0.375});  // in force at 6: kept
  CHECK(rank1.shares_at(2) == std::vector<double>{0.375, 0.125, 0.125, 0.375});  // the earliest kept
  // Any batch splits (largest remainders), and synchronised batch norm gets a row for every tower
  // even where a share rounds to none.
  RowPlan sync({Device::cpu(0), Device::cpu(1)}, 0, 2, AutoSplit{}, Remainder::Error, 1, true);
  sync.set_shares(1, {0.99, 0.01});
  CHECK(sync.split(16, 1) == std::vector<std::vector<int>>{{15, 1}});
  CHECK(sync.split(17, 1) == std::vector<std::vector<int>>{{16, 1}});
}
