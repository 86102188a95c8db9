#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include <nlohmann/json.hpp>

#include "train/fit_test_util.h"
#include "train/reporter.h"
#include "train/step_window.h"
#include "train/time_left.h"

using namespace towerflow::train;
namespace tw = towerflow;

namespace {

using Captured = testing::Output;  // reporter output in a temporary file

TrainRecord record(std::int64_t step) {
  return {.step = step, .total_steps = 100, .epoch = step / 10.0, .epochs = 10, .loss = 1.5, .acc = 0.25,
          .lr = 0.1, .img_per_s = 812.3};
}

}  // namespace

TEST_CASE("json mode prints one object per line with the documented keys", "[train][reporter]") {
  Captured out;
  {
    Reporter r({.progress = Progress::Json, .out = out.file});
    r.block("start", "towerflow", {{"model", "tfcnn"}});
    r.train(record(10), 65);
    r.eval({.step = 10, .epoch = 1, .test_loss = 0.75, .test_acc = 0.625, .examples = 1000, .seconds = 1,
            .test_top5 = 0.875, .classes = 3, .confusion = {3, 1, 0, 0, 0, 0, 1, 1, 2}});
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
  CHECK(j[2]["test_top5"] == 0.875);
  // Per class: 3 of 4, no rows (null), 2 of 4.
  CHECK(j[2]["test_class_acc"] == nlohmann::json::parse("[0.75, null, 0.5]"));
  CHECK(j[3]["event"] == "log");
  CHECK(j[3]["level"] == "warning");
  CHECK(j[3]["message"] == "a warning from the library");
  CHECK(j[4]["event"] == "summary");
  CHECK(j[4]["test_acc"] == 0.5);
}

TEST_CASE("plain mode prints whole lines, live mode redraws one line in place", "[train][reporter]") {
  SECTION("plain") {
    Captured out;
    {
      Reporter r({.progress = Progress::Plain, .out = out.file});
      r.train(record(10), 65);
      r.train(record(20), 65);
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
      Reporter r({.progress = Progress::Live, .out = out.file});
      r.train(record(10), 65);
      r.train(record(20), 65);
      r.eval({.step = 20, .epoch = 2, .test_loss = 1, .test_acc = 0.5});
      r.train(record(30), 65);
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

TEST_CASE("the reporter estimates the time left from the records' pace", "[train][reporter]") {
  Captured out;
  {
    Reporter r({.progress = Progress::Json, .out = out.file});
    TrainRecord a = record(10);
    a.step_s = 0.5;  // 10 steps at 0.5 s: 90 steps left take 45 s
    r.on_log(a);
    TrainRecord b = record(20);
    b.step_s = 2.0;  // a slower window moves the pace by its weight (train/time_left.h)
    r.on_log(b);
  }
  auto lines = out.lines();
  REQUIRE(lines.size() == 2);
  CHECK(nlohmann::json::parse(lines[0])["eta_s"] == 45.0);
  tw::train::TimeLeft reference;  // the second estimate: the same arithmetic, fed by hand
  reference.add_steps(10, 5.0);
  reference.add_steps(10, 20.0);
  const double expected = std::round(reference.seconds(80, 0) * 10) / 10;
  CHECK(expected > 40.5);  // not the first window's pace alone (80 steps at 0.5 s)
  CHECK(nlohmann::json::parse(lines[1])["eta_s"] == expected);
}

TEST_CASE("progress: auto is live on a terminal outside a launcher, plain elsewhere, names parse", "[train][reporter]") {
  for (Progress p : {Progress::Auto, Progress::Plain, Progress::Live, Progress::Json})
    CHECK(parse_progress(to_string(p)) == p);
  CHECK_THROWS_WITH(parse_progress("nonsense"), Catch::Contains("\"nonsense\"") &&
                                                    Catch::Contains("auto, plain, live, json"));
  Captured out;  // a file, not a terminal
  CHECK(resolve_progress(Progress::Auto, out.file) == Progress::Plain);
  CHECK(resolve_progress(Progress::Live, out.file) == Progress::Live);  // asked for: drawn anyway
  CHECK(resolve_progress(Progress::Json, out.file) == Progress::Json);
  CHECK(Reporter({.out = out.file}).progress() == Progress::Plain);
  // A terminal with and without launcher variables: tests/examples/cifar10/test_progress_cli.py
  // runs the program under a pseudo-terminal.
}

TEST_CASE("records as JSON: short numbers, a non-finite loss as null", "[train][reporter]") {
  auto j = nlohmann::json::parse(to_json(TrainRecord{.step = 7, .epoch = 0.123456, .loss = 0.1 + 0.2, .acc = 0.5, .lr = 0.1}));
  CHECK(j["step"] == 7);
  CHECK(j["epoch"] == 0.123);
  CHECK(j["loss"] == 0.3);
  CHECK_FALSE(j.contains("eta_s"));  // files get the record, not the terminal's estimate
  auto e = nlohmann::json::parse(to_json(EvalRecord{.step = 7, .test_loss = std::nan(""), .test_acc = 0.25, .examples = 64}));
  CHECK(e["test_loss"].is_null());
  CHECK(e["test_acc"] == 0.25);
  CHECK(e["examples"] == 64);
}

TEST_CASE("start-up block fields are replaced in place or inserted where asked", "[train][reporter]") {
  Fields f{{"model", "a"}, {"optimizer", "sgd"}, {"length", "8 steps"}};
  set_field(f, "model", "tfcnn");
  set_field(f, "loss", "smoothed", "optimizer");
  set_field(f, "extra", "x");
  REQUIRE(f.size() == 5);
  CHECK(f[0] == std::pair<std::string, std::string>{"model", "tfcnn"});
  CHECK(f[2].first == "loss");
  CHECK(f[3].first == "length");
  CHECK(f[4].first == "extra");
}

TEST_CASE("durations print as minutes or hours", "[train][reporter]") {
  CHECK(format_duration(65) == "1:05");
  CHECK(format_duration(3723) == "1:02:03");
  CHECK(format_duration(-1) == "?");
}

TEST_CASE("time left follows the recent pace and counts the evaluations to come", "[train][reporter]") {
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

TEST_CASE("evaluations left: every eval_every epochs and one at the end", "[train][reporter]") {
  CHECK(evals_left(0, 140, 2) == 70);
  CHECK(evals_left(7, 140, 2) == 67);   // after epochs 8, 10, ..., 140
  CHECK(evals_left(0, 5, 2) == 3);      // after epochs 2 and 4, and at the end (5)
  CHECK(evals_left(4, 5, 2) == 1);
  CHECK(evals_left(5, 5, 2) == 0);
  CHECK(evals_left(0, 5, 0) == 1);      // only at the end
  CHECK(evals_left(3, 3, 0) == 0);
}

TEST_CASE("json mode writes names and paths that are not UTF-8 with U+FFFD instead of failing",
          "[train][reporter]") {
  Captured out;
  {
    Reporter r({.progress = Progress::Json, .out = out.file});
    r.block("start", "towerflow", {{"train data", "image folder /data/caf\xe9 (10 classes)"}});
    tw::log_warning("class folder 'r\xe9sum\xe9' has no image");
  }
  auto lines = out.lines();
  REQUIRE(lines.size() == 2);
  CHECK(nlohmann::json::parse(lines[0])["train data"] == "image folder /data/caf\xef\xbf\xbd (10 classes)");
  CHECK(nlohmann::json::parse(lines[1])["message"] == "class folder 'r\xef\xbf\xbdsum\xef\xbf\xbd' has no image");
}

TEST_CASE("the start-up block says how images are normalised, naming CIFAR-10's statistics", "[train][reporter]") {
  const tw::data::Augment cifar = tw::data::cifar_augment();
  CHECK(describe_normalisation(cifar) ==
        "(x/255 - mean) / std per channel, mean (0.4914, 0.4822, 0.4465), std (0.247, 0.2435, 0.2616) (CIFAR-10's)");
  tw::data::Augment imagenet;
  imagenet.mean = {0.485f, 0.456f, 0.406f};
  imagenet.std = {0.229f, 0.224f, 0.225f};
  CHECK(describe_normalisation(imagenet) == "(x/255 - mean) / std per channel, mean (0.485, 0.456, 0.406), std (0.229, 0.224, 0.225)");
}

TEST_CASE("a step window reports its steps' means and per-step times, then starts over", "[train][records]") {
  StepWindow w({.compute_s = 1.0, .reduction_s = 0.5, .optimizer_s = 0.25});
  w.add_data_wait(0.3);
  w.add_step(2.0, 0.25, 64);
  w.add_data_wait(0.1);
  w.add_step(1.0, 0.75, 32);
  CHECK(w.steps() == 2);
  CHECK(w.images() == 96);
  const TrainRecord r = w.close(4.0, {.compute_s = 3.0, .reduction_s = 1.5, .optimizer_s = 1.25});
  CHECK(r.loss == 1.5);
  CHECK(r.acc == 0.5);
  CHECK(r.img_per_s == 24.0);     // 96 images in 4 s
  CHECK(r.step_s == 2.0);
  CHECK(r.compute_s == 1.0);      // (3 - 1) / 2 steps
  CHECK(r.reduction_s == 0.5);
  CHECK(r.optimizer_s == 0.5);
  CHECK(r.data_wait_s == Approx(0.2));
  CHECK(w.steps() == 0);          // the next window opens at the closing counters
  w.add_step(3.0, 1.0, 10);
  const TrainRecord next = w.close(1.0, {.compute_s = 4.0, .reduction_s = 1.5, .optimizer_s = 1.25});
  CHECK(next.compute_s == 1.0);
  CHECK(next.reduction_s == 0.0);
  CHECK(next.data_wait_s == 0.0);
  const TrainRecord empty = w.close(1.0, {});
  CHECK(empty.loss == 0.0);
  CHECK(empty.img_per_s == 0.0);
}

TEST_CASE("an evaluation through test views says how many, in plain lines and JSON", "[train][reporter]") {
  Captured out;
  {
    Reporter r({.progress = Progress::Plain, .out = out.file});
    r.eval({.step = 476, .epoch = 9.9, .test_loss = 0.5, .test_acc = 0.9, .examples = 10000, .seconds = 97, .views = 6});
    r.eval({.step = 476, .epoch = 9.9, .test_loss = 0.5, .test_acc = 0.9, .examples = 10000, .seconds = 17});
  }
  auto lines = out.lines();
  REQUIRE(lines.size() == 2);
  CHECK_THAT(lines[0], Catch::Contains("(10000 images x 6 views, 97.0 s)"));
  CHECK_THAT(lines[1], Catch::Contains("(10000 images, 17.0 s)"));
  CHECK(nlohmann::json::parse(to_json(EvalRecord{.step = 1, .views = 6}))["views"] == 6);
  CHECK_FALSE(nlohmann::json::parse(to_json(EvalRecord{.step = 1})).contains("views"));
}
