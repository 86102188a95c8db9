#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <numeric>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/cpu/context.h"

TEST_CASE("parallel_for covers the range exactly once, in contiguous chunks", "[cpu]") {
  for (int threads : {1, 2, 4}) {
    towerflow::cpu::CpuContext ctx(threads);
    for (std::int64_t n : {0, 1, 7, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
      std::atomic<int> calls{0}, bad_chunks{0};  // Catch2's assertions are for the test's thread
      ctx.parallel_for(n, 3, [&](std::int64_t b, std::int64_t e) {
        if (!(b < e) || e - b < std::min<std::int64_t>(3, n)) ++bad_chunks;
        ++calls;
        for (std::int64_t i = b; i < e; ++i) hits[static_cast<std::size_t>(i)]++;
      });
      CHECK(bad_chunks.load() == 0);  // every chunk non-empty and at least the grain
      for (auto& h : hits) CHECK(h.load() == 1);
      CHECK(calls.load() <= threads);
    }
  }
}

TEST_CASE("parallel_for rethrows a chunk's exception after all chunks finish", "[cpu]") {
  towerflow::cpu::CpuContext ctx(3);
  std::atomic<int> finished{0};
  CHECK_THROWS_AS(ctx.parallel_for(300, 1,
                                   [&](std::int64_t b, std::int64_t) {
                                     if (b == 0) throw std::runtime_error("chunk 0");
                                     ++finished;
                                   }),
                  std::runtime_error);
  CHECK(finished.load() == 2);
}

TEST_CASE("parallel_for inside a chunk of the same context runs on the calling thread", "[cpu]") {
  towerflow::cpu::CpuContext ctx(2);
  std::vector<std::atomic<int>> hits(100);
  std::atomic<int> inner_chunks{0};
  ctx.parallel_for(2, 1, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i)
      ctx.parallel_for(50, 1, [&](std::int64_t ib, std::int64_t ie) {
        ++inner_chunks;
        for (std::int64_t j = ib; j < ie; ++j) hits[static_cast<std::size_t>(i * 50 + j)]++;
      });
  });
  CHECK(inner_chunks.load() == 2);  // one inline chunk per outer chunk, no deadlock
  for (auto& h : hits) CHECK(h.load() == 1);
}

TEST_CASE("parallel_for runs loop after loop, of any chunk count, with sleeping workers", "[cpu]") {
  // Loops of 1 to 4 chunks back to back (workers still polling), then after pauses long enough
  // for the workers to sleep: every element of every loop is covered exactly once, and each
  // chunk runs on a thread of its own.
  towerflow::cpu::CpuContext ctx(4);
  std::vector<int> data(4000, 0);
  for (int round = 0; round < 2000; ++round) {
    const std::int64_t n = 1 + round % 4;
    std::atomic<int> calls{0};
    std::mutex mu;
    std::set<std::thread::id> threads;
    ctx.parallel_for(n * 1000, 1000, [&](std::int64_t b, std::int64_t e) {
      ++calls;
      {
        const std::lock_guard lock(mu);
        threads.insert(std::this_thread::get_id());
      }
      for (std::int64_t i = b; i < e; ++i) ++data[static_cast<std::size_t>(i)];
    });
    REQUIRE(calls.load() == n);
    REQUIRE(threads.size() == static_cast<std::size_t>(n));
    if (round % 500 == 499) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // Element i is in loops with n * 1000 > i: 2000 rounds, n cycling 1..4.
  for (std::size_t i = 0; i < data.size(); ++i) CHECK(data[i] == 500 * static_cast<int>(4 - i / 1000));
}

TEST_CASE("contexts used from different threads at once stay apart", "[cpu]") {
  towerflow::cpu::CpuContext a(2), b(2);
  std::vector<std::int64_t> sums(2, 0);
  auto use = [](towerflow::cpu::CpuContext& ctx, std::int64_t& out) {
    for (int round = 0; round < 500; ++round) {
      std::atomic<std::int64_t> sum{0};
      ctx.parallel_for(1000, 100, [&](std::int64_t lo, std::int64_t hi) {
        std::int64_t s = 0;
        for (std::int64_t i = lo; i < hi; ++i) s += i;
        sum += s;
      });
      out += sum.load();
    }
  };
  std::thread other([&] { use(b, sums[1]); });
  use(a, sums[0]);
  other.join();
  CHECK(sums[0] == 500 * 499500);
  CHECK(sums[1] == 500 * 499500);
}
