// The balancer of auto-balanced towers (tower/balancer.h) against synthetic timings: towers of
// known speed, with noise, a slow-down mid-run and a tower that nearly stops.
#include <catch2/catch.hpp>

#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "core/error.h"
#include "tower/balancer.h"
#include "tower/split.h"

using namespace towerflow;
using namespace towerflow::tower;

namespace {

constexpr int kBatch = 128;

// Towers whose seconds per row the test sets; each step splits the batch by the balancer's shares
// into whole rows, as the trainer does, and reports rows * seconds per row (times noise).
struct Simulation {
  explicit Simulation(std::vector<double> spr, AutoSplit options = {})
      : seconds_per_row(std::move(spr)), balancer(static_cast<int>(seconds_per_row.size()), options) {}
  std::vector<double> seconds_per_row;
  Balancer balancer;
  std::vector<int> rows;
  double noise = 0;  // each time is multiplied by a uniform factor in [1 - noise, 1 + noise]
  std::mt19937 rng{42};
  int changes = 0;

  // One step; returns its time (the slowest tower's).
  double step() {
    std::vector<Device> devices;
    for (std::size_t i = 0; i < seconds_per_row.size(); ++i) devices.push_back(Device::cpu(static_cast<int>(i)));
    rows = split_batch(kBatch, devices, WeightedSplit{balancer.shares()}, Remainder::Spread);
    std::uniform_real_distribution<double> u(1 - noise, 1 + noise);
    std::vector<double> seconds;
    double slowest = 0;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      seconds.push_back(rows[i] * seconds_per_row[i] * (noise > 0 ? u(rng) : 1.0));
      slowest = std::max(slowest, rows[i] * seconds_per_row[i]);
    }
    changes += balancer.observe(seconds, rows) ? 1 : 0;
    return slowest;
  }
  // The shortest step any split into whole rows could take.
  double best() const {
    double best = 1e300;
    if (seconds_per_row.size() != 2) {
      double speed = 0;
      for (double t : seconds_per_row) speed += 1 / t;
      return kBatch / speed;  // a bound: fractional rows
    }
    for (int a = 0; a <= kBatch; ++a)
      best = std::min(best, std::max(a * seconds_per_row[0], (kBatch - a) * seconds_per_row[1]));
    return best;
  }
};

}  // namespace

TEST_CASE("balanced shares are in proportion to speed, with every tower at least at the floor", "[balancer]") {
  const std::vector<double> two_to_one = balanced_shares(std::vector<double>{1.0, 2.0}, 0.05);
  CHECK(two_to_one[0] == Approx(2.0 / 3));
  CHECK(two_to_one[1] == Approx(1.0 / 3));
  // A tower 100x slower would get 1/101; the floor gives it 0.05 and the others share the rest.
  const std::vector<double> floored = balanced_shares(std::vector<double>{1.0, 1.0, 100.0}, 0.05);
  CHECK(floored[2] == Approx(0.05));
  CHECK(floored[0] == Approx(0.475));
  CHECK(floored[1] == Approx(0.475));
  CHECK(std::accumulate(floored.begin(), floored.end(), 0.0) == Approx(1.0));
  // The predicted step of balanced shares: every tower alike.
  CHECK(predicted_step(two_to_one, std::vector<double>{1.0, 2.0}) == Approx(2.0 / 3));
  CHECK(predicted_step(std::vector<double>{0.5, 0.5}, std::vector<double>{1.0, 2.0}) == Approx(1.0));
}

TEST_CASE("a 2:1 pair is balanced from the first measured step, and stays so", "[balancer]") {
  Simulation sim({1e-3, 2e-3});
  CHECK(sim.step() == Approx(64 * 2e-3));  // warm-up: even, not measured
  CHECK(sim.balancer.shares() == std::vector<double>{0.5, 0.5});
  sim.step();  // measured: the shares change
  CHECK(sim.balancer.shares()[0] == Approx(2.0 / 3));
  for (int s = 0; s < 20; ++s) CHECK(sim.step() <= 1.05 * sim.best());
  CHECK(sim.rows == std::vector<int>{85, 43});
  CHECK(sim.changes == 1);
}

TEST_CASE("a tower that slows mid-run is followed within 4 steps", "[balancer]") {
  Simulation sim({1e-3, 1e-3});
  for (int s = 0; s < 30; ++s) sim.step();
  CHECK(sim.changes == 0);
  sim.seconds_per_row[1] = 2e-3;  // tower 1 now runs at half speed
  int steps = 0;
  while (sim.step() > 1.05 * sim.best()) {
    ++steps;
    REQUIRE(steps < 4);
  }
  // And it stays within 5% of the best split from then on.
  for (int s = 0; s < 30; ++s) CHECK(sim.step() <= 1.05 * sim.best());
  // The same under +-10% noise, within a few steps more.
  Simulation noisy({1e-3, 1e-3});
  noisy.noise = 0.10;
  for (int s = 0; s < 30; ++s) noisy.step();
  noisy.seconds_per_row[1] = 2e-3;
  steps = 0;
  while (noisy.step() > 1.05 * noisy.best()) {
    ++steps;
    REQUIRE(steps < 8);
  }
}

TEST_CASE("noise of +-10% in every step's times does not move the split", "[balancer]") {
  for (const std::vector<double>& spr : {std::vector<double>{1e-3, 1e-3}, std::vector<double>{1e-3, 2e-3},
                                         std::vector<double>{1e-3, 1e-3, 1e-3, 1e-3}}) {
    for (unsigned seed : {1u, 2u, 3u, 4u, 5u}) {
      INFO(spr.size() << " towers, tower 1 at " << spr[1] << ", seed " << seed);
      Simulation sim(spr);
      sim.rng.seed(seed);
      for (int s = 0; s < 3; ++s) sim.step();  // balanced (the 2:1 pair: one change)
      const int settled = sim.changes;
      sim.noise = 0.10;
      for (int s = 0; s < 1000; ++s) sim.step();
      CHECK(sim.changes == settled);
    }
  }
}

TEST_CASE("a tower that nearly stops keeps the floor's rows, is still measured, and gets its rows "
          "back when it recovers", "[balancer]") {
  Simulation sim({1e-3, 1e-3});
  for (int s = 0; s < 5; ++s) sim.step();
  sim.seconds_per_row[1] = 1.0;  // 1000x slower
  for (int s = 0; s < 20; ++s) {
    sim.step();
    CHECK(sim.rows[1] >= 1);  // measured every step
  }
  CHECK(sim.balancer.shares()[1] == Approx(0.05));  // min_share 0.1 of an even share of 0.5
  CHECK(sim.rows[1] == 6);
  sim.seconds_per_row[1] = 1e-3;  // recovered
  int steps = 0;
  while (sim.step() > 1.05 * sim.best()) {
    ++steps;
    REQUIRE(steps < 4);
  }
}

TEST_CASE("freeze_after keeps the shares once that many steps were measured", "[balancer]") {
  Simulation sim({1e-3, 2e-3}, {.freeze_after = 3});
  for (int s = 0; s < 4; ++s) sim.step();  // warm-up and 3 measured steps
  CHECK(sim.balancer.frozen());
  const std::vector<double> shares = sim.balancer.shares();
  CHECK(shares[0] == Approx(2.0 / 3));
  sim.seconds_per_row = {2e-3, 1e-3};  // the speeds swap: a frozen split stays
  for (int s = 0; s < 10; ++s) sim.step();
  CHECK(sim.balancer.shares() == shares);
  CHECK(to_string(AutoSplit{.freeze_after = 3}) == "auto:freeze_after=3");
  CHECK(to_string(AutoSplit{}) == "auto");
}

TEST_CASE("bad balancer options and inputs name the field, the value and the range", "[balancer]") {
  CHECK_THROWS_WITH(Balancer(2, {.smoothing = 0}), Catch::Contains("AutoSplit::smoothing is 0; use a weight in (0, 1]"));
  CHECK_THROWS_WITH(Balancer(2, {.min_share = 1.5}), Catch::Contains("AutoSplit::min_share is 1.5"));
  CHECK_THROWS_WITH(Balancer(2, {.hysteresis = -0.1}), Catch::Contains("AutoSplit::hysteresis is -0.1"));
  CHECK_THROWS_WITH(Balancer(2, {.freeze_after = -1}), Catch::Contains("AutoSplit::freeze_after is -1"));
  CHECK_THROWS_WITH(Balancer(0, {}), Catch::Contains("at least one tower; got 0"));
  CHECK_THROWS_WITH(Balancer(2, {}, {0.5}), Catch::Contains("got 1 initial shares"));
  CHECK_THROWS_WITH(Balancer(2, {}, {0.5, -1}), Catch::Contains("initial share -1"));
  Balancer b(2, {});
  CHECK_THROWS_WITH(b.observe(std::vector<double>{1.0}, std::vector<int>{1, 1}), Catch::Contains("got 1 times and 2 row counts"));
  // A step where a tower had no rows, or no valid time, leaves its average as it was.
  Balancer c(2, {.warmup = 0});
  c.observe(std::vector<double>{0.1, 0.2}, std::vector<int>{10, 10});
  c.observe(std::vector<double>{0.1, std::nan("")}, std::vector<int>{10, 10});
  c.observe(std::vector<double>{0.1, 0.0}, std::vector<int>{10, 0});
  c.observe(std::vector<double>{0.1, 0.0}, std::vector<int>{10, 10});
  c.observe(std::vector<double>{0.1, -1.0}, std::vector<int>{10, 10});
  CHECK(c.seconds_per_row()[1] == Approx(0.02));
}
