#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "core/collectives/collectives.h"
#include "core/cpu/context.h"
#include "core/log.h"

#include <nlohmann/json.hpp>

using namespace towerflow;
using namespace towerflow::collectives;

namespace {

std::vector<Device> cpus(int n) {
  std::vector<Device> d;
  for (int i = 0; i < n; ++i) d.push_back(Device::cpu(i));
  return d;
}

// Runs fn(p) on n threads; returns each participant's exception (or null).
std::vector<std::exception_ptr> run_participants(int n, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> threads;
  for (int p = 0; p < n; ++p)
    threads.emplace_back([&, p] {
      try {
        fn(p);
      } catch (...) {
        errors[p] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

void require_no_errors(const std::vector<std::exception_ptr>& errors) {
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

std::vector<std::vector<float>> random_buffers(int n, std::size_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<std::vector<float>> bufs(n, std::vector<float>(count));
  for (auto& b : bufs)
    for (float& x : b) x = u(rng);
  return bufs;
}

}  // namespace

TEST_CASE("local all-reduce sums every participant's buffer in a fixed order", "[collectives]") {
  for (int n : {1, 2, 3, 4, 5}) {
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{15}, std::size_t{17},
                              std::size_t{1000}, std::size_t{100003}}) {
      auto bufs = random_buffers(n, count, static_cast<unsigned>(n * 7919 + count));
      // The reference: a second, plain implementation summing in order 0..n-1.
      std::vector<float> expect(count);
      for (std::size_t j = 0; j < count; ++j) {
        float s = bufs[0][j];
        for (int k = 1; k < n; ++k) s += bufs[k][j];
        expect[j] = s;
      }
      LocalCommunicator comm(cpus(n));
      require_no_errors(run_participants(n, [&](int p) { comm.all_reduce_sum(p, bufs[p]); }));
      INFO("n=" << n << " count=" << count);
      // count == 0 is skipped: memcmp of an empty vector's data() (null) is undefined.
      for (int p = 0; p < n && count > 0; ++p)
        REQUIRE(std::memcmp(bufs[p].data(), expect.data(), count * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("local all-reduce is reusable many times and with intra-op threads", "[collectives]") {
  const int n = 3;
  cpu::CpuContext ctx0(2), ctx1(1), ctx2(3);
  LocalCommunicator comm(cpus(n), {.contexts = {&ctx0, &ctx1, &ctx2}, .spin_iterations = 10});
  const std::size_t count = (1 << 17) + 5;  // large enough for the contexts to split shards
  auto bufs = random_buffers(n, count, 42);
  auto expect = bufs;
  const int rounds = 20;
  for (int r = 0; r < rounds; ++r)
    for (std::size_t j = 0; j < count; ++j) {
      float s = expect[0][j] + expect[1][j] + expect[2][j];
      s *= 0.25f;  // keep values bounded; applied identically below
      for (int k = 0; k < n; ++k) expect[k][j] = s;
    }
  require_no_errors(run_participants(n, [&](int p) {
    for (int r = 0; r < rounds; ++r) {
      comm.all_reduce_sum(p, bufs[p]);
      for (float& x : bufs[p]) x *= 0.25f;
      comm.barrier(p);
    }
  }));
  for (int p = 0; p < n; ++p)
    REQUIRE(std::memcmp(bufs[p].data(), expect[0].data(), count * sizeof(float)) == 0);
}

TEST_CASE("local broadcast and all-gather", "[collectives]") {
  const int n = 4;
  LocalCommunicator comm(cpus(n));
  auto bufs = random_buffers(n, 333, 7);
  const auto root_data = bufs[2];
  std::vector<std::vector<float>> gathered(n, std::vector<float>(n * 5));
  require_no_errors(run_participants(n, [&](int p) {
    comm.broadcast(p, bufs[p], 2);
    std::vector<float> send(5, static_cast<float>(p) + 0.5f);
    comm.all_gather(p, send, gathered[p]);
  }));
  for (int p = 0; p < n; ++p) {
    CHECK(bufs[p] == root_data);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < 5; ++j) CHECK(gathered[p][i * 5 + j] == static_cast<float>(i) + 0.5f);
  }
}

TEST_CASE("mismatched sizes raise InvalidArgument on every participant", "[collectives]") {
  const int n = 3;
  LocalCommunicator comm(cpus(n));
  std::vector<std::vector<float>> bufs = {std::vector<float>(10), std::vector<float>(10),
                                          std::vector<float>(11)};
  auto errors = run_participants(n, [&](int p) { comm.all_reduce_sum(p, bufs[p]); });
  for (auto& e : errors) {
    REQUIRE(e);
    REQUIRE_THROWS_WITH(std::rethrow_exception(e), Catch::Contains("same size") &&
                                                       Catch::Contains("11"));
    REQUIRE_THROWS_AS(std::rethrow_exception(e), InvalidArgument);
  }
  // A bad all-gather output on one participant fails them all, rather than hanging the others.
  auto gather_errors = run_participants(n, [&](int p) {
    std::vector<float> send(2), out(p == 1 ? 5 : 6);
    comm.all_gather(p, send, out);
  });
  for (auto& e : gather_errors) REQUIRE_THROWS_AS(std::rethrow_exception(e), InvalidArgument);
  auto bcast_errors = run_participants(n, [&](int p) { comm.broadcast(p, bufs[0], 7); });
  for (auto& e : bcast_errors)
    REQUIRE_THROWS_WITH(std::rethrow_exception(e), Catch::Contains("root 7"));
}

TEST_CASE("abort releases participants waiting for one that never comes", "[collectives]") {
  const int n = 3;
  LocalCommunicator comm(cpus(n), {.contexts = {}, .spin_iterations = 10});
  std::vector<std::vector<float>> bufs(n, std::vector<float>(100, 1.f));
  std::atomic<int> waiting{0};
  auto errors = run_participants(n, [&](int p) {
    if (p == 1) {  // the failing tower: waits until the others are blocked, then aborts
      while (waiting.load() < 2) std::this_thread::yield();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      comm.abort("tower 1 (/cpu:1) failed: out of memory");
      throw OutOfMemory("out of memory on /cpu:1");
    }
    ++waiting;
    comm.all_reduce_sum(p, bufs[p]);
  });
  REQUIRE_THROWS_AS(std::rethrow_exception(errors[1]), OutOfMemory);
  for (int p : {0, 2}) {
    REQUIRE_THROWS_AS(std::rethrow_exception(errors[p]), CollectiveAborted);
    REQUIRE_THROWS_WITH(std::rethrow_exception(errors[p]), Catch::Contains("/cpu:1"));
  }
  // Calls after an abort fail at once; after reset() the communicator works again.
  REQUIRE_THROWS_AS(comm.barrier(0), CollectiveAborted);
  comm.reset();
  for (auto& b : bufs) std::fill(b.begin(), b.end(), 1.f);
  require_no_errors(run_participants(n, [&](int p) { comm.all_reduce_sum(p, bufs[p]); }));
  for (auto& b : bufs) CHECK(b[99] == 3.f);
}

TEST_CASE("make_communicator validates its device list", "[collectives]") {
  REQUIRE_THROWS_AS(make_communicator({}), InvalidArgument);
  REQUIRE_THROWS_WITH(make_communicator({Device::cpu(0), Device::gpu(0)}),
                      Catch::Contains("mixes") && Catch::Contains("/gpu:0"));
  REQUIRE_THROWS_WITH(make_communicator({Device::cpu(0), Device::cpu(0)}),
                      Catch::Contains("/cpu:0") && Catch::Contains("twice"));
  REQUIRE_THROWS_AS(make_communicator({Device::gpu(0)}, CommunicatorKind::Local), InvalidArgument);
  auto local = make_communicator(cpus(2));
  CHECK(local->size() == 2);
  CHECK_THAT(local->name(), Catch::Contains("2 CPU participants"));
#ifndef TOWERFLOW_HAVE_CUDA
  REQUIRE_THROWS_WITH(make_communicator({Device::gpu(0), Device::gpu(1)}),
                      Catch::Contains("-DTOWERFLOW_CUDA=ON"));
  CHECK_FALSE(nccl_can_join({0, 1}));
#endif
}

namespace {

// A stand-in for a GPU event: the producing work "finishes" (writes the final values) only when
// someone waits for the event, so a collective that reads the buffer before waiting sees the
// unfinished values instead.
class FinishOnWait final : public QueueEvent {
 public:
  FinishOnWait(std::span<float> buffer, float final_value) : buffer_(buffer), value_(final_value) {}
  void synchronize() const override {
    ++waits;
    for (float& x : buffer_) x = value_;
  }
  void make_stream_wait(void*) const override { FAIL("a host communicator has no stream"); }
  mutable std::atomic<int> waits{0};

 private:
  std::span<float> buffer_;
  float value_;
};

}  // namespace

// The ordering contract of Note [Bucketed reduction during backward]: a bucket's all-reduce reads
// the buffer only after the event recorded when the bucket became ready.
TEST_CASE("all_reduce_sum_after reads the buffers only after each participant's ready event",
          "[collectives]") {
  constexpr int n = 3;
  LocalCommunicator comm(cpus(n));
  std::vector<std::vector<float>> bufs(n, std::vector<float>(1000, -1.0f));  // "unfinished"
  std::vector<std::unique_ptr<FinishOnWait>> events;
  for (int p = 0; p < n; ++p) events.push_back(std::make_unique<FinishOnWait>(bufs[p], p + 1.0f));
  auto errors = run_participants(n, [&](int p) {
    comm.all_reduce_sum_after(p, bufs[p], p == 1 ? nullptr : events[p].get());
  });
  for (auto& e : errors) REQUIRE(e == nullptr);
  // Participant 1 passed no event (nothing pending): its -1s are final. 1 + (-1) + 3 = 3.
  for (int p = 0; p < n; ++p)
    for (float x : bufs[p]) REQUIRE(x == 3.0f);
  CHECK(events[0]->waits == 1);
  CHECK(events[1]->waits == 0);
  CHECK(events[2]->waits == 1);
}

namespace {
// Collects what the library logs, from any thread, with the time since it was made.
struct LogCapture {
  std::mutex mu;
  std::vector<std::pair<double, std::string>> lines;
  const std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  LogSink previous;
  LogCapture() {
    previous = set_log_sink([this](LogLevel, std::string_view m) {
      std::lock_guard lock(mu);
      lines.emplace_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), m);
    });
  }
  ~LogCapture() { set_log_sink(previous); }
  std::vector<std::pair<double, std::string>> containing(std::string_view text) {
    std::lock_guard lock(mu);
    std::vector<std::pair<double, std::string>> out;
    for (const auto& l : lines)
      if (l.second.find(text) != std::string::npos) out.push_back(l);
    return out;
  }
};
}  // namespace

TEST_CASE("a participant that comes late is named while the others wait, with the step and bucket",
          "[collectives][stall]") {
  using namespace std::chrono_literals;
  LocalCommunicator comm(cpus(3), {.stall_warning = 100ms, .timeout = 60s});
  LogCapture log;
  std::vector<std::vector<float>> bufs(3, std::vector<float>(1000, 1.0f));
  const auto errors = run_participants(3, [&](int p) {
    const ContextScope step({.step = 7});
    const ContextScope bucket({.purpose = "gradient bucket", .index = 2});
    if (p == 2) std::this_thread::sleep_for(700ms);
    comm.all_reduce_sum(p, bufs[p]);
  });
  require_no_errors(errors);
  for (const auto& b : bufs) REQUIRE(b == std::vector<float>(1000, 3.0f));

  const auto reports = log.containing("stall:");
  // At 0.1, 0.2 and 0.4 s (0.8 s is after tower 2 arrived), from one waiter only.
  REQUIRE(reports.size() >= 2);
  REQUIRE(reports.size() <= 3);
  CHECK(reports.front().first < 0.1 + 0.3);  // within the threshold, give or take a busy machine
  for (const auto& [t, text] : reports) {
    INFO(text);
    CHECK(text.find("towers 0 (/cpu:0), 1 (/cpu:1) waited") != std::string::npos);
    CHECK(text.find("all-reduce #1 of the local communicator (4000 bytes) at step 7, gradient bucket 2") !=
          std::string::npos);
    CHECK(text.find("not arrived: tower 2 (/cpu:2)") != std::string::npos);
    CHECK(text.find("TOWERFLOW_STALL_WARNING") != std::string::npos);
  }
  CHECK(reports[1].first > reports[0].first + 0.05);  // backed off, not repeated at once
}

TEST_CASE("at the timeout every waiter raises CollectiveAborted naming who never arrived, and the "
          "record shows where each participant was", "[collectives][stall]") {
  using namespace std::chrono_literals;
  LocalCommunicator comm(cpus(3), {.stall_warning = 50ms, .timeout = 300ms});
  LogCapture log;
  std::vector<std::vector<float>> bufs(3, std::vector<float>(16, 1.0f));
  // One collective every participant completes, then participant 1 is far too late for the next.
  auto errors = run_participants(3, [&](int p) {
    const ContextScope step({.step = 4, .purpose = "gradients"});
    comm.barrier(p);
    if (p == 1) std::this_thread::sleep_for(900ms);
    comm.all_reduce_sum(p, bufs[p]);
  });
  for (int p = 0; p < 3; ++p) {
    INFO("participant " << p);
    REQUIRE(errors[p]);
    try {
      std::rethrow_exception(errors[p]);
    } catch (const CollectiveAborted& e) {
      const std::string m = e.what();
      INFO(m);
      CHECK(m.find("tower 1 (/cpu:1) did not arrive at all-reduce #2 of the local communicator (64 bytes) "
                   "at step 4, gradients within 0.3 s; towers 0 (/cpu:0), 2 (/cpu:2) waited") != std::string::npos);
      CHECK(m.find("TOWERFLOW_COLLECTIVE_TIMEOUT") != std::string::npos);
    }
  }
  CHECK(log.containing("did not arrive").size() == 1);  // said at once, by one waiter

  const auto record = nlohmann::json::parse(comm.recent_collectives());
  REQUIRE(record.size() == 3);
  for (int p = 0; p < 3; ++p) {
    const auto& mine = record[p];
    CHECK(mine["participant"] == p);
    CHECK(mine["device"] == str(Device::cpu(p)));
    CHECK(mine["recent"][0]["op"] == "barrier");
    CHECK(mine["recent"][0]["done"] == true);
    if (p == 1) {  // it came after the abort: it never entered the all-reduce
      CHECK(mine["recent"].size() == 1);
      continue;
    }
    REQUIRE(mine["recent"].size() == 2);
    CHECK(mine["recent"][1]["seq"] == 2);
    CHECK(mine["recent"][1]["op"] == "all-reduce");
    CHECK(mine["recent"][1]["bytes"] == 64);
    CHECK(mine["recent"][1]["step"] == 4);
    CHECK(mine["recent"][1]["purpose"] == "gradients");
    CHECK(mine["recent"][1]["done"] == false);
  }

  // Usable again once reset.
  comm.reset();
  errors = run_participants(3, [&](int p) { comm.all_reduce_sum(p, bufs[p]); });
  require_no_errors(errors);
  CHECK(bufs[0][0] == 3.0f);
}

TEST_CASE("the record keeps each participant's last 64 collectives", "[collectives][stall]") {
  LocalCommunicator comm(cpus(2));
  CHECK(nlohmann::json::parse(comm.recent_collectives())[0]["recent"].empty());
  std::vector<std::vector<float>> bufs(2, std::vector<float>(4, 1.0f));
  require_no_errors(run_participants(2, [&](int p) {
    for (int i = 0; i < 70; ++i) comm.broadcast(p, bufs[p], 1);
  }));
  const auto record = nlohmann::json::parse(comm.recent_collectives());
  for (const auto& mine : record) {
    REQUIRE(mine["recent"].size() == 64);
    CHECK(mine["recent"].front()["seq"] == 7);
    CHECK(mine["recent"].back()["seq"] == 70);
    CHECK(mine["recent"].back()["op"] == "broadcast");
    CHECK(!mine["recent"].back().contains("step"));
  }
}

TEST_CASE("LocalCommunicatorOptions refuses a wait limit that is not positive", "[collectives][stall]") {
  using namespace std::chrono_literals;
  CHECK_THROWS_WITH(LocalCommunicator(cpus(2), {.stall_warning = 0ms}),
                    Catch::Contains("LocalCommunicatorOptions.stall_warning is 0 ms; give a positive duration"));
  CHECK_THROWS_AS(LocalCommunicator(cpus(2), {.timeout = -5ms}), InvalidArgument);
}
