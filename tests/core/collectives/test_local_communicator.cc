#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "core/collectives/collectives.h"
#include "core/cpu/context.h"

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
