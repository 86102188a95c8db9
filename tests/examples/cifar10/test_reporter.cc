#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <sstream>

#include <nlohmann/json.hpp>

#include "examples/cifar10/reporter.h"
#include "io/atomic_file.h"

using namespace towerflow::cifar10;
namespace tw = towerflow;

namespace {

struct Captured {
  std::FILE* file = std::tmpfile();
  ~Captured() { std::fclose(file); }
  std::string text() const {
    std::fflush(file);
    std::rewind(file);
    std::string out;
    char buf[4096];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, file)) > 0) out.append(buf, n);
    return out;
  }
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
