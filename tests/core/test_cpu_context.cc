#include <catch2/catch.hpp>

#include <atomic>
#include <numeric>
#include <stdexcept>
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
