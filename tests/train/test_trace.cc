// The timeline: a traced run's Chrome trace parses, every tower's thread shows forward, backward
// and reduction in the traced steps, spans on a thread nest, and bucketed reduction overlaps
// backward.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "core/queue_event.h"
#include "core/trace.h"
#include "io/atomic_file.h"
#include "models/models.h"
#include "train/fit_fixtures.h"

namespace tw = towerflow;
namespace fs = std::filesystem;
using namespace towerflow::train;
using namespace towerflow::train::testing;

namespace {

struct Span {
  std::string cat, name;
  double begin, end;
};

// The complete events of a trace file by thread name.
std::map<std::string, std::vector<Span>> spans_by_thread(const fs::path& path) {
  auto doc = nlohmann::json::parse(tw::io::read_file(path));
  std::map<int, std::string> names;
  for (const auto& e : doc.at("traceEvents"))
    if (e.at("ph") == "M" && e.at("name") == "thread_name") names[e.at("tid")] = e.at("args").at("name");
  std::map<std::string, std::vector<Span>> out;
  for (const auto& e : doc.at("traceEvents"))
    if (e.at("ph") == "X") {
      const double ts = e.at("ts"), dur = e.at("dur");
      out[names.at(e.at("tid"))].push_back({e.at("cat"), e.at("name"), ts, ts + dur});
    }
  return out;
}

bool has(const std::vector<Span>& spans, const std::string& cat, const std::string& name = {}) {
  return std::any_of(spans.begin(), spans.end(), [&](const Span& s) { return s.cat == cat && (name.empty() || s.name == name); });
}

}  // namespace

TEST_CASE("a traced run writes a Chrome trace of towers, layers, reduction, optimizer and data", "[train][trace]") {
  fresh_devices();
  TempDir dir;
  const fs::path file = dir.path / "trace.json";
  Setup s(tw::models::factory("tfcnn", {.seed = 1}));
  Trace timeline({.path = file, .first_step = 3, .last_step = 4});
  FitOptions o = tiny({});
  o.loader_threads = 1;
  FitResult r = fit(s.trainer, s.sgd, s.train, nullptr, o, {&timeline});
  CHECK(r.steps == 8);
  REQUIRE(timeline.written());
  CHECK_FALSE(tw::trace::enabled());  // off again after step 4
  CHECK_THAT(timeline.summary(), Catch::Contains("Conv2D") && Catch::Contains("grad") && Catch::Contains("share"));

  auto threads = spans_by_thread(file);
  REQUIRE(threads.count("training loop"));
  const auto& loop = threads.at("training loop");
  CHECK(std::count_if(loop.begin(), loop.end(), [](const Span& x) { return x.name == "optimizer step"; }) == 2);
  CHECK(has(loop, "data", "wait for batch"));
  REQUIRE(threads.count("loader 0") + threads.count("loader 1") + threads.count("loader 2") >= 1);
  for (int i = 0; i < 2; ++i) {
    const std::string name = "tower " + std::to_string(i) + " (/cpu:" + std::to_string(i) + ")";
    INFO(name);
    REQUIRE(threads.count(name));
    const auto& t = threads.at(name);
    CHECK(std::count_if(t.begin(), t.end(), [](const Span& x) { return x.cat == "phase" && x.name == "forward"; }) == 2);
    CHECK(std::count_if(t.begin(), t.end(), [](const Span& x) { return x.cat == "phase" && x.name == "backward"; }) == 2);
    CHECK(has(t, "reduction"));
    CHECK(has(t, "layer", "conv1"));
    CHECK(has(t, "op", "Conv2D"));
    // tfcnn's convolutions run with their pools as one op, one node of the backward.
    CHECK(has(t, "grad", "Conv2DMaxPoolRelu"));
  }
  // Spans on one thread nest: sorted by start, each one ends before its enclosing one does.
  for (auto& [name, spans] : threads) {
    INFO(name);
    std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end > b.end;
    });
    std::vector<double> open;
    bool nested = true;
    for (const auto& x : spans) {
      while (!open.empty() && open.back() <= x.begin) open.pop_back();
      if (!open.empty() && x.end > open.back() + 1e-3) nested = false;
      open.push_back(x.end);
    }
    CHECK(nested);
  }
}

TEST_CASE("under bucketed reduction the trace shows buckets reduced while backward runs", "[train][trace]") {
  fresh_devices();
  TempDir dir;
  const fs::path file = dir.path / "trace.json";
  tw::data::Builtin train{tw::data::Split::Train, {.train_size = 128, .test_size = 64}};
  tw::tower::Trainer trainer(tw::models::factory("resnet20", {.seed = 1}), {tw::Device::cpu(0), tw::Device::cpu(1)},
                             {.reduction = tw::tower::parse_reduction("bucketed:0.05")});
  tw::optim::Sgd sgd(trainer.parameters(), {.lr = 0.02, .momentum = 0.9});
  Trace timeline({.path = file, .first_step = 2, .last_step = 3});
  FitOptions o = tiny({});
  o.max_steps = 3;
  fit(trainer, sgd, train, nullptr, o, {&timeline});
  auto threads = spans_by_thread(file);
  int overlapping = 0;
  for (int i = 0; i < 2; ++i) {
    const std::string tower = "tower " + std::to_string(i) + " (/cpu:" + std::to_string(i) + ")";
    REQUIRE(threads.count(tower));
    std::vector<Span> backward;
    for (const auto& x : threads.at(tower))
      if (x.cat == "phase" && x.name == "backward") backward.push_back(x);
    REQUIRE(backward.size() == 2);
    for (const auto& [name, spans] : threads)  // the bucket spans, on the tower's reduction thread
      if (name.starts_with("tower " + std::to_string(i) + " reduction"))
        for (const auto& x : spans)
          if (x.cat == "reduction" && x.name.starts_with("bucket"))
            for (const auto& b : backward)
              if (x.begin < b.end && x.end > b.begin && x.begin < b.end) ++overlapping;
  }
  INFO("bucket spans overlapping a backward span: " << overlapping);
  CHECK(overlapping > 0);
}

TEST_CASE("trace steps parse as A:B or A, and anything else names the value and the form", "[train][trace]") {
  TraceOptions o;
  parse_trace_steps("101:110", o);
  CHECK(o.first_step == 101);
  CHECK(o.last_step == 110);
  parse_trace_steps("7", o);
  CHECK(o.first_step == 7);
  CHECK(o.last_step == 7);
  for (const char* bad : {"", "0:3", "5:4", "a:b", "3:", "1:2:3"})
    CHECK_THROWS_WITH(parse_trace_steps(bad, o), Catch::Contains(std::string("\"") + bad + "\"") && Catch::Contains("e.g. 101:110"));
  CHECK_THROWS_AS(Trace({.first_step = 3, .last_step = 2}), tw::InvalidArgument);
}

TEST_CASE("a trace that cannot be written fails at the start, and steps past the run are said", "[train][trace]") {
  fresh_devices();
  TempDir dir;
  {
    Setup s(tw::models::factory("tfcnn", {.seed = 1}));
    Trace bad_folder({.path = dir.path / "no" / "such" / "trace.json", .first_step = 3, .last_step = 4});
    std::int64_t steps = 0;
    LambdaHook count;
    count.step = [&](const StepInfo&) { ++steps; };
    CHECK_THROWS_WITH(fit(s.trainer, s.sgd, s.train, nullptr, tiny({}), {&bad_folder, &count}),
                      Catch::Contains("cannot write the trace") && Catch::Contains("does not exist"));
    CHECK(steps == 0);  // before any training
  }
  {
    Setup s(tw::models::factory("tfcnn", {.seed = 1}));
    Trace late({.path = dir.path / "late.json", .first_step = 50, .last_step = 60});
    std::string logged;
    auto previous = tw::set_log_sink([&](tw::LogLevel, std::string_view m) { logged += std::string(m) + "\n"; });
    FitResult r = fit(s.trainer, s.sgd, s.train, nullptr, tiny({}), {&late});
    tw::set_log_sink(previous);
    CHECK(r.steps == 8);
    CHECK_FALSE(late.written());
    CHECK_THAT(logged, Catch::Contains("trace steps 50:60 are outside the steps this run makes (1..8)"));
  }
}

namespace {

// A device queue whose clock is the host's: a mark is the moment it was recorded, so the device
// spans must come out where the host spans are, with their durations.
class FakeMark final : public tw::QueueEvent {
 public:
  explicit FakeMark(std::chrono::steady_clock::time_point t) : t_(t) {}
  void synchronize() const override {}
  void make_stream_wait(void*) const override {}
  double milliseconds_since(const tw::QueueEvent& earlier) const override {
    const auto* e = dynamic_cast<const FakeMark*>(&earlier);
    return e ? std::chrono::duration<double, std::milli>(t_ - e->t_).count() : -1;
  }

 private:
  std::chrono::steady_clock::time_point t_;
};

}  // namespace

TEST_CASE("a thread with a device queue gets its op and grad spans timed on the device's track", "[trace]") {
  namespace trace = tw::trace;
  int marks = 0;  // checked on the test's thread: Catch2's assertions are not for others
  std::thread worker([&marks] {
    trace::set_thread_name("fake tower");
    trace::set_thread_device_queue("/gpu:9 stream", [&marks] {
      ++marks;
      return std::make_shared<FakeMark>(std::chrono::steady_clock::now());
    });
    trace::start();
    {
      trace::Span forward("phase", "forward");  // not an op: host only
      {
        trace::Span op("op", "Conv2D", "conv1");
        std::this_thread::sleep_for(std::chrono::milliseconds(3));
      }
      trace::Span grad("grad", "Conv2D");
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    trace::stop();
    trace::set_thread_device_queue({}, {});
  });
  worker.join();
  CHECK(marks == 5);  // the anchor, then a begin and an end for each of the two spans
  const auto events = trace::collect();
  const auto tracks = trace::threads();
  auto track_of = [&](const std::string& name) {
    for (const auto& t : tracks)
      if (t.name == name) return t.id;
    return -1;
  };
  const int device = track_of("/gpu:9 stream"), host = track_of("fake tower");
  REQUIRE(device >= 0);
  REQUIRE(host >= 0);
  std::map<std::string, trace::Event> on_device, on_host;
  for (const auto& e : events) {
    if (e.thread == device) on_device[e.category + " " + e.name] = e;
    if (e.thread == host) on_host[e.category + " " + e.name] = e;
  }
  REQUIRE(on_device.size() == 2);  // the op and the grad span, not the phase
  const auto& op = on_device.at("device op Conv2D");
  const auto& grad = on_device.at("device grad Conv2D");
  CHECK(op.detail == "conv1");
  // Device durations are the marks' differences; placed on the host timeline through the anchor,
  // so they follow the host spans (within the marks' own cost).
  CHECK(op.duration_us == Approx(on_host.at("op Conv2D").duration_us).margin(500));
  CHECK(op.duration_us >= 2900);
  CHECK(grad.duration_us >= 1900);
  CHECK(op.begin_us == Approx(on_host.at("op Conv2D").begin_us).margin(500));
  CHECK(grad.begin_us >= op.begin_us + op.duration_us - 1);
  // The JSON has the device's track with its name.
  const auto j = nlohmann::json::parse(trace::chrome_trace_json(events, tracks));
  bool named = false;
  for (const auto& e : j["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "thread_name" && e["args"]["name"] == "/gpu:9 stream") named = true;
  CHECK(named);
}

TEST_CASE("memory-bound kernels carry their bytes, and the bandwidth rows set them against a bound", "[trace]") {
  namespace trace = tw::trace;
  using tw::Tensor;
  fresh_devices();
  // ReLU forward and backward on 1000 elements: the kernel spans inside the op and grad spans
  // count 2 and 3 floats an element (x read, y written; y and dy read, dx written).
  const std::vector<float> v(1000, -0.5f);
  Tensor x = Tensor::from_host(std::span<const float>(v), {1000}, tw::Device::cpu()).set_requires_grad(true);
  trace::start();
  tw::sum(tw::relu(x)).backward();
  trace::stop();
  const auto events = trace::collect();
  std::map<std::string, std::int64_t> bytes;
  for (const auto& e : events)
    if (e.category == "kernel") bytes[e.name] += e.bytes;
  CHECK(bytes["relu_forward"] == 8000);
  CHECK(bytes["relu_backward"] == 12000);
  // The Chrome trace carries them as args.bytes; the op summary leaves the kernels out (they sit
  // inside the op and grad spans it counts).
  const auto doc = nlohmann::json::parse(trace::chrome_trace_json(events, trace::threads()));
  int with_bytes = 0;
  for (const auto& e : doc.at("traceEvents"))
    if (e.contains("args") && e.at("args").contains("bytes")) ++with_bytes;
  CHECK(with_bytes >= 2);
  const std::string summary = trace::summary_table(events);
  CHECK(summary.find("Relu") != std::string::npos);
  CHECK(summary.find("relu_forward") == std::string::npos);

  // Against a bound of 1 GB/s: 6 MB in 12 ms is twice the 6 ms the bytes need; events without
  // bytes count nothing; the furthest from the bound comes first.
  const std::vector<trace::Event> synthetic = {
      {.category = "kernel", .name = "add", .duration_us = 4000, .bytes = 2'000'000},
      {.category = "kernel", .name = "add", .duration_us = 8000, .bytes = 4'000'000},
      {.category = "kernel", .name = "relu_forward", .duration_us = 10000, .bytes = 2'000'000},
      {.category = "op", .name = "Conv2D", .duration_us = 9000}};
  const auto rows = trace::bandwidth_rows(synthetic, 1e9);
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].name == "relu_forward");
  CHECK(rows[0].over_bound == Approx(5.0));
  CHECK(rows[1].name == "add");
  CHECK(rows[1].calls == 2);
  CHECK(rows[1].bytes == 6'000'000);
  CHECK(rows[1].ms == Approx(12.0));
  CHECK(rows[1].bound_ms == Approx(6.0));
  CHECK(rows[1].gb_per_s == Approx(0.5));
  CHECK(rows[1].over_bound == Approx(2.0));
  CHECK(trace::bandwidth_table(rows).find("relu_forward") != std::string::npos);
  CHECK_FALSE(rows[0].in_cache);

  // A kernel moving under 1 MiB a call is listed after the others, however far from the bound,
  // under a line that says why.
  const std::vector<trace::Event> with_small = {
      {.category = "kernel", .name = "sum_rows", .duration_us = 100, .bytes = 4'000},
      {.category = "kernel", .name = "sum_rows", .duration_us = 100, .bytes = 4'000},
      {.category = "kernel", .name = "add", .duration_us = 8000, .bytes = 4'000'000}};
  const auto mixed = trace::bandwidth_rows(with_small, 1e9);
  REQUIRE(mixed.size() == 2);
  CHECK(mixed[0].name == "add");
  CHECK_FALSE(mixed[0].in_cache);
  CHECK(mixed[1].name == "sum_rows");
  CHECK(mixed[1].in_cache);
  CHECK(mixed[1].over_bound == Approx(25.0));
  const std::string table = trace::bandwidth_table(mixed);
  CHECK(table.find("in cache") < table.find("sum_rows"));
  CHECK(table.find("add") < table.find("in cache"));
}
