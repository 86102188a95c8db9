#include <catch2/catch.hpp>

#include <numeric>

#include "core/error.h"
#include "tower/reduction.h"
#include "tower/split.h"

using namespace towerflow;
using namespace towerflow::tower;

namespace {
std::vector<Device> cpus(int n) {
  std::vector<Device> d;
  for (int i = 0; i < n; ++i) d.push_back(Device::cpu(i));
  return d;
}
}  // namespace

TEST_CASE("even split divides the batch or names the nearest batches that work", "[tower][split]") {
  CHECK(split_batch(128, cpus(2), EvenSplit{}) == std::vector<int>{64, 64});
  CHECK(split_batch(128, cpus(4), EvenSplit{}) == std::vector<int>{32, 32, 32, 32});
  CHECK(split_batch(7, cpus(1), EvenSplit{}) == std::vector<int>{7});
  REQUIRE_THROWS_AS(split_batch(250, cpus(4), EvenSplit{}), InvalidArgument);
  REQUIRE_THROWS_WITH(split_batch(250, cpus(4), EvenSplit{}),
                      Catch::Contains("batch 250") && Catch::Contains("evenly over 4 devices") &&
                          Catch::Contains("/cpu:0, /cpu:1, /cpu:2, /cpu:3") &&
                          Catch::Contains("use batch 248 or 252") && Catch::Contains("Remainder::Spread"));
  REQUIRE_THROWS_WITH(split_batch(3, cpus(4), EvenSplit{}), Catch::Contains("use batch 4"));
  CHECK(nearest_exact_batches(250, 4, EvenSplit{}) == std::pair<int, int>{248, 252});
  CHECK(nearest_exact_batches(3, 4, EvenSplit{}) == std::pair<int, int>{0, 4});
  CHECK(nearest_exact_batches(130, 2, WeightedSplit{{3, 1}}) == std::pair<int, int>{128, 132});
  REQUIRE_THROWS_WITH(split_batch(0, cpus(2), EvenSplit{}), Catch::Contains("batch 0"));
}

TEST_CASE("a global batch is checked against every micro-batch, naming the fields that fix it",
          "[tower][split]") {
  CHECK_NOTHROW(check_batch_split(128, cpus(2), EvenSplit{}, Remainder::Error, 1));
  CHECK_NOTHROW(check_batch_split(128, cpus(2), EvenSplit{}, Remainder::Error, 4));
  CHECK_NOTHROW(check_batch_split(33, cpus(2), EvenSplit{}, Remainder::Spread, 4));  // spread: any batch
  CHECK_THROWS_WITH(check_batch_split(33, cpus(2), EvenSplit{}, Remainder::Error, 1),
                    Catch::Contains("FitOptions::batch = 33 cannot be split evenly over 2 towers (/cpu:0, /cpu:1)") &&
                        Catch::Contains("use FitOptions::batch = 32 or 34, or TrainerOptions::remainder = "
                                        "Remainder::Spread"));
  // 30 rows in 4 micro-batches are 8, 8, 7 and 7: 7 does not split over 2 towers; 32 or 24 rows
  // (micro-batches of 8 or 6) do, and so do 3 micro-batches of 10.
  CHECK_THROWS_WITH(check_batch_split(30, cpus(2), EvenSplit{}, Remainder::Error, 4),
                    Catch::Contains("FitOptions::batch = 30 with TrainerOptions::accumulation_steps = 4 gives "
                                    "micro-batches of 8 and 7 rows, and one of 7 rows cannot be split evenly") &&
                        Catch::Contains("use FitOptions::batch = 32 or 24, TrainerOptions::accumulation_steps = 3, "
                                        "or TrainerOptions::remainder = Remainder::Spread"));
  CHECK_THROWS_WITH(check_batch_split(130, cpus(2), WeightedSplit{{3, 1}}, Remainder::Error, 1),
                    Catch::Contains("in the proportions weights:3,1 (TrainerOptions::split)") &&
                        Catch::Contains("use FitOptions::batch = 128 or 132"));
}

TEST_CASE("weighted split follows the weights exactly or apportions the remainder", "[tower][split]") {
  CHECK(split_batch(128, cpus(2), WeightedSplit{{3, 1}}) == std::vector<int>{96, 32});
  CHECK(split_batch(100, cpus(3), WeightedSplit{{2, 1, 2}}) == std::vector<int>{40, 20, 40});
  REQUIRE_THROWS_WITH(split_batch(130, cpus(2), WeightedSplit{{3, 1}}),
                      Catch::Contains("proportions weights:3,1") && Catch::Contains("use batch 128 or 132"));
  REQUIRE_THROWS_WITH(split_batch(128, cpus(3), WeightedSplit{{3, 1}}),
                      Catch::Contains("2 weights for 3 devices"));
  REQUIRE_THROWS_AS(split_batch(128, cpus(2), WeightedSplit{{3, -1}}), InvalidArgument);
  // Largest remainder: 130 * 3/4 = 97.5, 130 * 1/4 = 32.5 -> the tie goes to tower 0.
  CHECK(split_batch(130, cpus(2), WeightedSplit{{3, 1}}, Remainder::Spread) == std::vector<int>{98, 32});
  CHECK(split_batch(10, cpus(4), EvenSplit{}, Remainder::Spread) == std::vector<int>{3, 3, 2, 2});
  CHECK(split_batch(2, cpus(4), EvenSplit{}, Remainder::Spread) == std::vector<int>{1, 1, 0, 0});
  // Spread always sums to the batch and stays within one row of the exact share.
  for (int b = 1; b < 300; b += 7) {
    auto rows = split_batch(b, cpus(3), WeightedSplit{{0.5, 1.7, 3.1}}, Remainder::Spread);
    CHECK(std::accumulate(rows.begin(), rows.end(), 0) == b);
    const double w[] = {0.5, 1.7, 3.1};
    for (int i = 0; i < 3; ++i) CHECK(std::abs(rows[i] - b * w[i] / 5.3) < 1.0);
  }
}

TEST_CASE("split and reduction strings parse, print, and explain mistakes", "[tower][split]") {
  CHECK(std::holds_alternative<EvenSplit>(parse_split("even")));
  CHECK(std::holds_alternative<PerTowerBatch>(parse_split("per_tower")));
  auto w = parse_split("weights:3,1");
  REQUIRE(std::holds_alternative<WeightedSplit>(w));
  CHECK(std::get<WeightedSplit>(w).weights == std::vector<double>{3, 1});
  CHECK(to_string(w) == "weights:3,1");
  REQUIRE_THROWS_WITH(parse_split("weights:3,x"), Catch::Contains("bad weight 'x'"));
  CHECK(split_batch(4, cpus(2), parse_split("weights:1e308,1e308")) == std::vector<int>{2, 2});
  REQUIRE_THROWS_WITH(parse_split("uneven"), Catch::Contains("'uneven'") && Catch::Contains("weights:3,1"));
  CHECK(global_batch(64, 4, PerTowerBatch{}) == 256);
  CHECK(global_batch(64, 4, EvenSplit{}) == 64);
  REQUIRE_THROWS_WITH(split_batch(250, cpus(4), PerTowerBatch{}), Catch::Contains("towers x per-tower"));
  // auto: its options by name; an auto split starts even and always spreads the remainder.
  const SplitPolicy a = parse_split("auto:freeze_after=200,min_share=0.2,hysteresis=0.1");
  REQUIRE(std::holds_alternative<AutoSplit>(a));
  CHECK(std::get<AutoSplit>(a).freeze_after == 200);
  CHECK(std::get<AutoSplit>(a).min_share == 0.2);
  CHECK(to_string(a) == "auto:freeze_after=200,min_share=0.2,hysteresis=0.1");
  CHECK(to_string(parse_split("auto")) == "auto");
  CHECK(split_batch(250, cpus(4), AutoSplit{}) == std::vector<int>{63, 63, 62, 62});
  CHECK_NOTHROW(check_batch_split(250, cpus(4), AutoSplit{}, Remainder::Error, 1));
  REQUIRE_THROWS_WITH(parse_split("auto:freeze_after=x"), Catch::Contains("'freeze_after=x', which is not NAME=NUMBER"));
  REQUIRE_THROWS_WITH(parse_split("auto:speed=2"), Catch::Contains("auto takes freeze_after and warmup"));
  REQUIRE_THROWS_WITH(parse_split("auto:freeze_after=2.5"), Catch::Contains("auto takes freeze_after"));
  REQUIRE_THROWS_WITH(parse_split("auto:smoothing=2"), Catch::Contains("AutoSplit::smoothing is 2"));
  REQUIRE_THROWS_WITH(parse_split("autox"), Catch::Contains("per_tower or auto"));
  REQUIRE_THROWS_WITH(parse_split("auto:"), Catch::Contains("use auto, or auto:NAME=VALUE"));

  CHECK(std::get<ParameterDevice>(parse_reduction("parameter_device")).device == std::nullopt);
  CHECK(std::get<ParameterDevice>(parse_reduction("parameter_device:/gpu:1")).device == Device::gpu(1));
  CHECK(std::get<AllReduce>(parse_reduction("all_reduce")).bucket_bytes == 0);
  CHECK(std::get<AllReduce>(parse_reduction("bucketed")).bucket_bytes == 25u << 20);
  CHECK(std::get<AllReduce>(parse_reduction("bucketed:0.5")).bucket_bytes == 1u << 19);
  CHECK(to_string(parse_reduction("bucketed:4")) == "bucketed:4");
  CHECK(to_string(parse_reduction("parameter_device:cuda:1")) == "parameter_device:/gpu:1");
  REQUIRE_THROWS_WITH(parse_reduction("allreduce"), Catch::Contains("'allreduce'") && Catch::Contains("bucketed"));
  REQUIRE_THROWS_WITH(parse_reduction("bucketed:-1"), Catch::Contains("bad bucket size"));
  REQUIRE_THROWS_WITH(parse_reduction("bucketed:252222222222222222222"), Catch::Contains("up to 1048576"));
  CHECK(std::get<AllReduce>(parse_reduction("bucketed:1048576")).bucket_bytes == std::size_t{1} << 40);
  CHECK(std::get<AllReduce>(parse_reduction("bucketed:1e-300")).bucket_bytes == 1);
  REQUIRE_THROWS_WITH(parse_reduction("parameter_device:/tpu:0"), Catch::Contains("parameter_device:/gpu:0"));
}
