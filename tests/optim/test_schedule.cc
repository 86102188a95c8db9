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
      else
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
