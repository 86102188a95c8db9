#include <catch2/catch.hpp>

#include <cmath>

#include "core/error.h"
#include "fixtures.h"
#include "optim/schedule.h"

using namespace towerflow;
using namespace towerflow::optim;

TEST_CASE("schedules match torch.optim.lr_scheduler at every step", "[optim][schedule]") {
  for (const auto& c : optim_reference()["schedules"]) {
    const std::string kind = c["kind"];
    SECTION(kind) {
      LrSchedule s;
      if (kind == "step")
        s = step_decay_schedule(c["base_lr"], c["milestones"].get<std::vector<std::int64_t>>(), c["gamma"]);
      else if (kind == "cosine")
        s = cosine_schedule(c["base_lr"], c["total_steps"], c["min_lr"]);
      else if (kind == "warmup")
        s = warmup_schedule(constant_schedule(c["base_lr"]), c["warmup_steps"], c["start_factor"]);
      else if (kind == "linear") {
        std::vector<LrKnot> knots;
        for (const auto& k : c["knots"])
          knots.push_back({.step = step_at_fraction(k[0], c["total_steps"]), .factor = k[1]});
        s = piecewise_linear_schedule(c["base_lr"], std::move(knots));
      } else
        s = one_cycle_schedule(c["max_lr"], c["total_steps"],
                               {.pct_start = c["pct_start"], .div_factor = c["div_factor"],
                                .final_div_factor = c["final_div_factor"]});
      const auto lrs = c["lrs"].get<std::vector<double>>();
      for (std::size_t step = 0; step < lrs.size(); ++step) {
        INFO(kind << " step " << step);
        CHECK(s(static_cast<std::int64_t>(step)) == Approx(lrs[step]).epsilon(1e-9).margin(1e-12));
      }
    }
  }
}

TEST_CASE("parse_schedule reads the command-line forms", "[optim][schedule]") {
  CHECK(parse_schedule("constant", 0.1, 100)(57) == 0.1);
  auto step = parse_schedule("step:10,20:0.5", 0.1, 100);
  CHECK(step(9) == Approx(0.1));
  CHECK(step(10) == Approx(0.05));
  CHECK(step(25) == Approx(0.025));
  auto cos = parse_schedule("warmup:10,cosine", 0.2, 110);
  CHECK(cos(0) == 0.0);
  CHECK(cos(5) == Approx(0.2 * 0.5 * (1 + std::cos(M_PI * 5 / 110)) / 2));
  CHECK(cos(10) == Approx(0.2 * (1 + std::cos(M_PI * 10 / 110)) / 2));
  CHECK(cos(110) == 0.0);
  auto one = parse_schedule("onecycle:0.25", 0.4, 100);
  CHECK(one(24) == Approx(0.4));   // the peak at pct_start * total - 1
  CHECK(one(99) == Approx(0.4 / 25 / 1e4));

  REQUIRE_THROWS_WITH(parse_schedule("cosin", 0.1, 10),
                      Catch::Contains("'cosin'") && Catch::Contains("warmup:500,cosine"));
  REQUIRE_THROWS_WITH(parse_schedule("step:ten", 0.1, 10), Catch::Contains("'ten' is not a number"));
  REQUIRE_THROWS_WITH(parse_schedule("step:20,10", 0.1, 100), Catch::Contains("increase"));
  REQUIRE_THROWS_WITH(parse_schedule("warmup:5", 0.1, 10), Catch::Contains("after a comma"));
  REQUIRE_THROWS_WITH(parse_schedule("cosine", 0.1, 0), Catch::Contains("positive number of steps"));
  REQUIRE_THROWS_AS(one_cycle_schedule(0.1, 10, {.pct_start = 1.5}), InvalidArgument);
}

// airbench94's schedule: LambdaLR with its lambda over 476 steps, warm-up to int(0.23 * 476) = 109.
TEST_CASE("piecewise-linear schedules: airbench94's, holds, jumps, the string form", "[optim][schedule]") {
  const nlohmann::json* ref = nullptr;
  for (const auto& c : optim_reference()["schedules"])
    if (c["name"] == "linear_airbench") ref = &c;
  REQUIRE(ref != nullptr);
  const double lr = (*ref)["base_lr"];
  const std::int64_t T = (*ref)["total_steps"];
  REQUIRE(T == 476);
  CHECK(step_at_fraction(0.23, T) == 109);  // int(109.48): truncated, as Python's int()
  CHECK(step_at_fraction(1.0, T) == T);
  CHECK(step_at_fraction(0.0, T) == 0);
  const auto lrs = (*ref)["lrs"].get<std::vector<double>>();
  REQUIRE(lrs.size() == static_cast<std::size_t>(T));
  const LrSchedule built = piecewise_linear_schedule(lr, {{0, 0.2}, {step_at_fraction(0.23, T), 1.0}, {T, 0.07}});
  const LrSchedule parsed = parse_schedule("linear:0=0.2,0.23=1,1=0.07", lr, T);
  double max_err = 0;
  for (std::int64_t step = 0; step < T; ++step) {
    const double want = lrs[static_cast<std::size_t>(step)];
    max_err = std::max({max_err, std::abs(built(step) - want) / want, std::abs(parsed(step) - want) / want});
  }
  INFO("max relative error against LambdaLR " << max_err);
  CHECK(max_err < 1e-15);  // the same double arithmetic; an ulp where a compiler fuses a multiply-add
  CHECK(built(108) < built(109));
  CHECK(built(109) == lr);  // the peak at the end of warm-up
  // After the last knot the last factor holds (airbench's lambda would go on falling).
  CHECK(built(T) == Approx(lr * 0.07).epsilon(1e-15));
  CHECK(built(10 * T) == built(T));

  // Before the first knot its factor holds; two knots at one step jump (the later one from there).
  const LrSchedule jump = piecewise_linear_schedule(1.0, {{10, 0.5}, {20, 1.0}, {20, 0.1}, {30, 0.0}});
  CHECK(jump(0) == 0.5);
  CHECK(jump(15) == Approx(0.75));
  CHECK(jump(19) == Approx(0.95));
  CHECK(jump(20) == Approx(0.1));
  CHECK(jump(25) == Approx(0.05));
  CHECK(jump(31) == 0.0);
  // With few steps, fractions can truncate to one step: a jump too ("0=0.2,0.23=1" over 4 steps).
  const LrSchedule tiny = parse_schedule("linear:0=0.2,0.23=1,1=0.07", 1.0, 4);
  CHECK(tiny(0) == 1.0);
  CHECK(tiny(2) == Approx(1.0 * 0.5 + 0.07 * 0.5));
  // Under a warm-up prefix, as every other kind.
  const LrSchedule warm = parse_schedule("warmup:10,linear:0=1,1=0", 0.5, 100);
  CHECK(warm(0) == 0.0);
  CHECK(warm(5) == Approx(0.5 * 0.95 * 0.5));
  CHECK(warm(50) == Approx(0.25));

  REQUIRE_THROWS_WITH(piecewise_linear_schedule(0.1, {}), Catch::Contains("at least one knot"));
  REQUIRE_THROWS_WITH(piecewise_linear_schedule(0.1, {{10, 1.0}, {5, 0.1}}),
                      Catch::Contains("knot 2 is at step 5") && Catch::Contains("at step 10"));
  REQUIRE_THROWS_WITH(piecewise_linear_schedule(0.1, {{-1, 1.0}}), Catch::Contains("step -1"));
  REQUIRE_THROWS_WITH(piecewise_linear_schedule(0.1, {{0, -0.5}}), Catch::Contains("factor -0.5"));
  REQUIRE_THROWS_WITH(piecewise_linear_schedule(-0.1, {{0, 1.0}}), Catch::Contains("learning rate -0.1"));
  REQUIRE_THROWS_WITH(step_at_fraction(1.5, 100), Catch::Contains("fraction 1.5") && Catch::Contains("[0, 1]"));
  REQUIRE_THROWS_WITH(step_at_fraction(0.5, 0), Catch::Contains("positive number of steps"));

  // Bad strings quote the string, say what is wrong and show the accepted forms.
  // (Catch's combined matchers hold their parts by reference: spelled out in each check.)
#define FORMS Catch::Contains("linear:FRACTION=FACTOR") && Catch::Contains("warmup:500,cosine")
  REQUIRE_THROWS_WITH(parse_schedule("linear", 0.1, 100), Catch::Contains("'linear'") && Catch::Contains("needs knots") && FORMS);
  REQUIRE_THROWS_WITH(parse_schedule("linear:0.5", 0.1, 100), Catch::Contains("knot '0.5' is not FRACTION=FACTOR") && FORMS);
  REQUIRE_THROWS_WITH(parse_schedule("linear:0=x", 0.1, 100), Catch::Contains("'x' is not a number"));
  REQUIRE_THROWS_WITH(parse_schedule("linear:0=1,1.5=0", 0.1, 100), Catch::Contains("fraction 1.5 lies outside [0, 1]"));
  REQUIRE_THROWS_WITH(parse_schedule("linear:0.5=1,0.2=0", 0.1, 100), Catch::Contains("must not decrease"));
  REQUIRE_THROWS_WITH(parse_schedule("linear:0=nan", 0.1, 100), Catch::Contains("factor nan"));
  REQUIRE_THROWS_WITH(parse_schedule("linear:0=-1", 0.1, 100), Catch::Contains("factor -1"));
  REQUIRE_THROWS_WITH(parse_schedule("linear:0=1", 0.1, 0), Catch::Contains("positive number of steps"));
#undef FORMS
}
