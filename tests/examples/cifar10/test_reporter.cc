#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include <nlohmann/json.hpp>

#include "examples/cifar10/reporter.h"
#include "io/atomic_file.h"
#include "training_test_util.h"

using namespace towerflow::cifar10;
namespace tw = towerflow;

namespace {

// Reporter output in a temporary file (Output), read back whole or as lines.
struct Captured : testing::Output {
  std::vector<std::string> lines() const {
    std::vector<std::string> out;
    std::istringstream in(text());
    for (std::string l; std::getline(in, l);) out.push_back(l);
    return out;
  }
};

TrainRecord record(std::int64_t step) {
  return {.step = step, .total_steps = 100, .epoch = step / 10.0, .epochs = 10, .loss = 1.5, .acc = 0.25,
          .lr = 0.1, .img_per_s = 812.3, .eta_s = 65};
}

}  // namespace

TEST_CASE("json mode prints one object per line with the documented keys", "[cifar10][reporter]") {
  Captured out;
  {
    Reporter r({.json = true, .out = out.file});
    r.block("start", "towerflow", {{"model", "tfcnn"}});
    r.train(record(10));
    r.eval({.step = 10, .epoch = 1, .test_loss = 0.75, .test_acc = 0.625, .examples = 1000, .seconds = 1});
    tw::log_warning("a warning from the library");
    r.summary({{"x", "y"}}, R"({"test_acc": 0.5})");
  }
  auto lines = out.lines();
  REQUIRE(lines.size() == 5);
  std::vector<nlohmann::json> j;
  for (const auto& l : lines) j.push_back(nlohmann::json::parse(l));
  CHECK(j[0]["event"] == "start");
  CHECK(j[0]["model"] == "tfcnn");
  for (const char* key : {"step", "epoch", "loss", "acc", "lr", "img_per_s"}) CHECK(j[1].contains(key));
  CHECK(j[1]["step"] == 10);
  CHECK(j[1]["loss"] == 1.5);
  CHECK(j[1]["img_per_s"] == 812.3);
  CHECK(j[2]["test_loss"] == 0.75);
  CHECK(j[2]["test_acc"] == 0.625);
  CHECK(j[3]["event"] == "log");
  CHECK(j[3]["level"] == "warning");
  CHECK(j[3]["message"] == "a warning from the library");
  CHECK(j[4]["event"] == "summary");
  CHECK(j[4]["test_acc"] == 0.5);
}

TEST_CASE("plain mode prints whole lines; live mode redraws one line in place", "[cifar10][reporter]") {
  SECTION("plain") {
    Captured out;
    {
      Reporter r({.live = 0, .out = out.file});
      r.train(record(10));
      r.train(record(20));
    }
    auto text = out.text();
    CHECK(text.find('\r') == std::string::npos);
    auto lines = out.lines();
    REQUIRE(lines.size() == 2);
    CHECK_THAT(lines[0], Catch::Contains("step 10/100") && Catch::Contains("loss 1.5000") &&
                             Catch::Contains("acc  25.0%") && Catch::Contains("812 img/s") &&
                             Catch::Contains("ETA 1:05") && Catch::Contains("epoch 1.00/10"));
  }
  SECTION("live") {
    Captured out;
    {
      Reporter r({.live = 1, .out = out.file});
      r.train(record(10));
      r.train(record(20));
      r.eval({.step = 20, .epoch = 2, .test_loss = 1, .test_acc = 0.5});
      r.train(record(30));
      r.epoch_end();
    }
    auto text = out.text();
    CHECK(std::count(text.begin(), text.end(), '\r') == 3);
    auto lines = out.lines();
    REQUIRE(lines.size() == 3);  // live line kept when eval prints, eval line, last live line
    CHECK_THAT(lines[0], Catch::Contains("step 20/100"));
    CHECK_THAT(lines[1], Catch::StartsWith("eval") && Catch::Contains("50.00%"));
    CHECK_THAT(lines[2], Catch::Contains("step 30/100"));
  }
}

TEST_CASE("metrics.jsonl receives every training and evaluation record, appended", "[cifar10][reporter]") {
  auto path = std::filesystem::temp_directory_path() / ("metrics-" + std::to_string(::getpid()) + ".jsonl");
  std::filesystem::remove(path);
  Captured out;
  for (int run = 0; run < 2; ++run) {
    Reporter r({.live = 0, .out = out.file, .metrics_path = path});
    r.train(record(10 + run));
    r.eval({.step = 10 + run, .epoch = 1, .test_loss = 0.5, .test_acc = 0.875});
  }
  std::istringstream in(tw::io::read_file(path));
  std::vector<nlohmann::json> j;
  for (std::string l; std::getline(in, l);) j.push_back(nlohmann::json::parse(l));
  REQUIRE(j.size() == 4);
  CHECK(j[0]["step"] == 10);
  CHECK(j[0]["lr"] == 0.1);
  CHECK(j[1]["test_acc"] == 0.875);
  CHECK(j[2]["step"] == 11);
  std::filesystem::remove(path);
}

TEST_CASE("durations print as minutes or hours", "[cifar10][reporter]") {
  CHECK(format_duration(65) == "1:05");
  CHECK(format_duration(3723) == "1:02:03");
  CHECK(format_duration(-1) == "?");
}

TEST_CASE("time left follows the recent pace and counts the evaluations to come", "[cifar10][reporter]") {
  TimeLeft t;
  CHECK(t.seconds(100, 3) == 0.0);  // nothing measured yet
  t.add_steps(50, 10.0);            // 0.2 s a step
  CHECK(t.seconds(100, 0) == Approx(20.0));
  // A slow spell of 500 steps at 0.4 s, then 5000 steps at 0.1 s: the estimate ends near the
  // recent pace, where a whole-run average (about 0.128 s) would not.
  for (int i = 0; i < 10; ++i) t.add_steps(50, 20.0);
  for (int i = 0; i < 100; ++i) t.add_steps(50, 5.0);
  CHECK(t.seconds(1000, 0) == Approx(100.0).epsilon(1e-3));
  // The weighting depends on steps, not on how they are grouped into windows.
  TimeLeft a, b;
  a.add_steps(10, 1.0);
  b.add_steps(10, 1.0);
  a.add_steps(200, 60.0);
  for (int i = 0; i < 4; ++i) b.add_steps(50, 15.0);
  CHECK(a.seconds(1000, 0) == Approx(b.seconds(1000, 0)));
  const double pace = 0.1 * std::exp(-200.0 / TimeLeft::kPaceSteps) + 0.3 * (1 - std::exp(-200.0 / TimeLeft::kPaceSteps));
  CHECK(a.seconds(1000, 0) == Approx(1000 * pace));
  // Evaluations add their mean measured cost.
  t.add_eval(4.0);
  t.add_eval(6.0);
  CHECK(t.seconds(1000, 3) == Approx(100.0 + 15.0).epsilon(1e-3));
}

TEST_CASE("evaluations left: every eval_every epochs and one at the end", "[cifar10][reporter]") {
  CHECK(evals_left(0, 140, 2) == 70);
  CHECK(evals_left(7, 140, 2) == 67);   // after epochs 8, 10, ..., 140
  CHECK(evals_left(0, 5, 2) == 3);      // after epochs 2 and 4, and at the end (5)
  CHECK(evals_left(4, 5, 2) == 1);
  CHECK(evals_left(5, 5, 2) == 0);
  CHECK(evals_left(0, 5, 0) == 1);      // only at the end
  CHECK(evals_left(3, 3, 0) == 0);
}
