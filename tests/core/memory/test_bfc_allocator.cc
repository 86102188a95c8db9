#include <catch2/catch.hpp>

#include <unistd.h>

#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/memory/memory.h"
#include "core/memory/fake_sub_allocator.h"

namespace tw = towerflow;
using tw::testing::FakeSubAllocator;
using tw::testing::SubAllocatorLog;

namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

struct Pool {
  std::shared_ptr<SubAllocatorLog> log = std::make_shared<SubAllocatorLog>();
  std::unique_ptr<tw::Allocator> a;
  explicit Pool(tw::BfcOptions opts, std::size_t budget = static_cast<std::size_t>(-1)) {
    log->budget = budget;
    a = tw::make_bfc_allocator(std::make_unique<FakeSubAllocator>(log), std::move(opts));
  }
  tw::Allocator* operator->() { return a.get(); }
};

std::uintptr_t addr(void* p) { return reinterpret_cast<std::uintptr_t>(p); }

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("pointers are 256-aligned and sizes round up to 256 bytes", "[memory]") {
  Pool pool({.device_name = "/cpu:0", .limit_bytes = 16 * MiB, .allow_growth = false});
  std::size_t expected = 0;
  std::vector<void*> ptrs;
  for (std::size_t bytes : {1ul, 255ul, 256ul, 257ul, 1000ul, 4096ul, 100001ul}) {
    void* p = pool->allocate(bytes);
    CHECK(addr(p) % tw::kAllocatorAlignment == 0);
    expected += (bytes + 255) / 256 * 256;
    ptrs.push_back(p);
    CHECK(pool->stats().bytes_in_use == expected);
  }
  // Distinct allocations never overlap: consecutive best-fit chunks tile from the region's start.
  for (std::size_t i = 1; i < ptrs.size(); ++i) CHECK(addr(ptrs[i]) > addr(ptrs[i - 1]));
  for (void* p : ptrs) pool->deallocate(p);
  CHECK(pool->stats().bytes_in_use == 0);
  CHECK(pool->stats().live_allocs == 0);
  CHECK(pool->stats().num_allocs == ptrs.size());
}

TEST_CASE("zero-size allocations return unique pointers that must be freed", "[memory]") {
  Pool pool({.device_name = "/cpu:0", .limit_bytes = 1 * MiB});
  void* a = pool->allocate(0);
  void* b = pool->allocate(0);
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  CHECK(a != b);
  CHECK(pool->stats().bytes_in_use == 2 * 256);
  CHECK(pool->stats().live_allocs == 2);
  pool->deallocate(a);
  pool->deallocate(b);
  CHECK(pool->stats().live_allocs == 0);
  pool->deallocate(nullptr);  // a no-op, like free(nullptr)
}

TEST_CASE("a chunk is split to the request and merged back with both neighbours", "[memory]") {
  Pool pool({.device_name = "/cpu:0", .limit_bytes = 1 * MiB, .allow_growth = false});
  void* a = pool->allocate(64 * KiB);
  void* b = pool->allocate(128 * KiB);
  void* c = pool->allocate(64 * KiB);
  // Best fit with ties broken to the lowest address: the three tile the region from its start.
  CHECK(addr(b) == addr(a) + 64 * KiB);
  CHECK(addr(c) == addr(b) + 128 * KiB);
  CHECK(pool->stats().largest_free_block == 1 * MiB - 256 * KiB);

  pool->deallocate(b);  // a hole between two live chunks: not merged with the tail
  auto s = pool->stats();
  CHECK(s.largest_free_block == 1 * MiB - 256 * KiB);
  CHECK(s.fragmentation == Approx(1.0 - 768.0 / 896.0));

  // The hole is the best fit for a request it can hold, even though the tail is larger.
  void* d = pool->allocate(100 * KiB);
  CHECK(d == b);
  pool->deallocate(d);

  pool->deallocate(a);  // merges with the hole after it: a 192 KiB free block
  void* e = pool->allocate(192 * KiB);
  CHECK(e == a);
  pool->deallocate(e);

  pool->deallocate(c);  // merges with the free chunks on both sides: the whole region again
  s = pool->stats();
  CHECK(s.largest_free_block == 1 * MiB);
  CHECK(s.fragmentation == 0.0);
  void* whole = pool->allocate(1 * MiB);
  CHECK(whole == a);
  pool->deallocate(whole);
}

TEST_CASE("best fit takes the smallest sufficient free block from any bin", "[memory]") {
  Pool pool({.device_name = "/cpu:0", .limit_bytes = 8 * MiB, .allow_growth = false});
  // Free blocks of 3 KiB, 40 KiB, 5 KiB and 600 KiB separated by live 256-byte fences.
  std::vector<std::size_t> holes = {3 * KiB, 40 * KiB, 5 * KiB, 600 * KiB};
  std::vector<void*> hole_ptrs, fences;
  for (std::size_t h : holes) {
    hole_ptrs.push_back(pool->allocate(h));
    fences.push_back(pool->allocate(256));
  }
  for (void* p : hole_ptrs) pool->deallocate(p);
  std::vector<void*> got;
  got.push_back(pool->allocate(4 * KiB));
  CHECK(got.back() == hole_ptrs[2]);  // 5 KiB: in the request's own bin
  got.push_back(pool->allocate(2 * KiB));
  CHECK(got.back() == hole_ptrs[0]);  // 3 KiB
  got.push_back(pool->allocate(33 * KiB));
  CHECK(got.back() == hole_ptrs[1]);  // 40 KiB: a higher bin
  got.push_back(pool->allocate(599 * KiB));
  CHECK(got.back() == hole_ptrs[3]);  // 600 KiB, before the multi-MiB tail
  std::string dump = pool->debug_dump();
  CHECK(contains(dump, "bin 4 [4.0 KiB, 8.0 KiB): 1 in use (4.0 KiB), 1 free (7.0 KiB, largest 7.0 KiB)"));  // 40 - 33
  CHECK(contains(dump, "region "));
  for (void* p : got) pool->deallocate(p);
  for (void* p : fences) pool->deallocate(p);
  CHECK(pool->stats().largest_free_block == 8 * MiB);
}

TEST_CASE("with growth the pool starts small and extends in doubling regions up to the limit",
          "[memory]") {
  Pool pool({.device_name = "/cpu:0", .limit_bytes = 20 * MiB, .allow_growth = true,
             .initial_region_bytes = 1 * MiB, .growth_cap = 0});
  CHECK(pool->stats().pool_bytes == 0);  // nothing is reserved before first use
  std::vector<void*> live;
  for (int i = 0; i < 15; ++i) live.push_back(pool->allocate(1 * MiB));
  // Regions of 1, 2, 4 and 8 MiB hold 15 MiB exactly.
  CHECK(pool.log->granted == std::vector<std::size_t>{1 * MiB, 2 * MiB, 4 * MiB, 8 * MiB});
  CHECK(pool->stats().num_regions == 4);
  // The next doubling (16 MiB) is capped at what remains of the limit.
  live.push_back(pool->allocate(1 * MiB));
  CHECK(pool.log->granted.back() == 5 * MiB);
  CHECK(pool->stats().pool_bytes == 20 * MiB);
  // A request larger than the next doubling gets a region that fits it.
  for (void* p : live) pool->deallocate(p);
  CHECK(pool->release_free_regions() == 20 * MiB);
  CHECK(pool->stats().pool_bytes == 0);
  CHECK(pool.log->frees == 5);
  void* big = pool->allocate(12 * MiB);
  CHECK(pool.log->granted.back() == 12 * MiB);
  pool->deallocate(big);
}

TEST_CASE("growth_cap keeps a growing pool's idle tail near a quarter", "[memory]") {
  Pool pool({.device_name = "/cpu:0", .limit_bytes = 1024 * MiB, .allow_growth = true,
             .initial_region_bytes = 1 * MiB});  // growth_cap 0.25 by default
  std::vector<void*> live;
  std::size_t in_use = 0;
  for (int i = 0; i < 300; ++i) {
    const std::size_t pool_before = pool->stats().pool_bytes;
    const std::size_t regions_before = pool.log->granted.size();
    live.push_back(pool->allocate(1 * MiB));
    in_use += 1 * MiB;
    if (pool.log->granted.size() > regions_before) {
      const std::size_t region = pool.log->granted.back();
      CHECK(region >= 1 * MiB);
      CHECK(region <= std::max<std::size_t>(1 * MiB, pool_before / 4));
      if (regions_before > 0) CHECK(region <= 2 * pool.log->granted[regions_before - 1]);
    }
    // What the pool holds beyond what is in use never exceeds the newest region.
    CHECK(pool->stats().pool_bytes - in_use < pool.log->granted.back());
  }
  CHECK(pool->stats().pool_bytes <= in_use + in_use / 4 + 1 * MiB);
  CHECK(pool.log->granted.size() < 30);  // 300 MiB from 1 MiB steps takes few regions
  for (void* p : live) pool->deallocate(p);
}

TEST_CASE("a steady-state training step makes no new region", "[memory]") {
  // One model's step, repeated: parameters live throughout; per layer an activation kept for the
  // backward pass and a transient workspace; backward frees activations in reverse order.
  Pool pool({.device_name = "/cpu:0", .limit_bytes = 1024 * MiB, .initial_region_bytes = 1 * MiB});
  std::vector<std::size_t> act, ws;
  std::uint64_t x = 12345;
  auto next_size = [&] {  // a small LCG: log-uniform-ish sizes from 1 KiB to 4 MiB
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return std::size_t{1024} << ((x >> 33) % 13) | ((x >> 20) & 1023);
  };
  for (int l = 0; l < 40; ++l) {
    act.push_back(next_size());
    ws.push_back(next_size());
  }
  std::vector<void*> params;
  for (int i = 0; i < 10; ++i) params.push_back(pool->allocate(next_size()));
  std::size_t pool_after_first = 0, regions_after_first = 0;
  for (int step = 0; step < 20; ++step) {
    std::vector<void*> saved;
    for (std::size_t l = 0; l < act.size(); ++l) {
      saved.push_back(pool->allocate(act[l]));
      pool->deallocate(pool->allocate(ws[l]));
    }
    for (std::size_t l = act.size(); l-- > 0;) {
      void* grad = pool->allocate(act[l]);
      pool->deallocate(saved[l]);
      pool->deallocate(pool->allocate(ws[l]));
      pool->deallocate(grad);
    }
    if (step == 0) {
      pool_after_first = pool->stats().pool_bytes;
      regions_after_first = pool->stats().num_regions;
    }
  }
  CHECK(pool->stats().pool_bytes == pool_after_first);
  CHECK(pool->stats().num_regions == regions_after_first);
  CHECK(pool->stats().live_allocs == params.size());
  for (void* p : params) pool->deallocate(p);
}

TEST_CASE("without growth the whole limit is reserved on first use, not before", "[memory]") {
  Pool pool({.device_name = "/gpu:0", .limit_bytes = 10 * MiB + 100, .allow_growth = false});
  CHECK(pool.log->granted.empty());
  CHECK(pool->stats().bytes_limit == 10 * MiB);  // rounded down to the granularity
  void* p = pool->allocate(1);
  CHECK(pool.log->granted == std::vector<std::size_t>{10 * MiB});
  CHECK(pool->stats().pool_bytes == 10 * MiB);
  pool->deallocate(p);
  void* q = pool->allocate(10 * MiB);  // the whole limit, in the one region
  CHECK(pool.log->granted.size() == 1);
  pool->deallocate(q);
}

TEST_CASE("a request beyond the limit raises OutOfMemory naming the device, sizes and the fix",
          "[memory]") {
  Pool pool({.device_name = "/gpu:1", .limit_bytes = 4 * MiB});
  void* p = pool->allocate(1 * MiB);
  try {
    pool->allocate(5 * MiB + 1);
    FAIL("no throw");
  } catch (const tw::OutOfMemory& e) {
    std::string m = e.what();
    INFO(m);
    CHECK(contains(m, "/gpu:1"));
    CHECK(contains(m, "5242881 bytes"));
    CHECK(contains(m, "5.0 MiB rounded"));
    CHECK(contains(m, "Limit 4.0 MiB"));
    CHECK(contains(m, "in use 1.0 MiB in 1 allocation, pool 2.0 MiB in 1 region"));
    CHECK(contains(m, "largest free block 1.0 MiB"));
    // The library names fields (core/error.h); programs render them as flags.
    CHECK(contains(m, "ProcessOptions::per_process_gpu_memory_fraction"));
    CHECK(contains(m, "ProcessOptions::memory_limit_mb[/gpu:1]"));
    CHECK(contains(m, "FitOptions::batch"));
    CHECK_FALSE(contains(m, "--"));
    CHECK(contains(m, "the request alone exceeds the limit"));
    CHECK(contains(m, "TOWERFLOW_ALLOCATOR_DUMP=1"));
    CHECK_FALSE(contains(m, "bin 0"));  // no dump by default
  }
  // Nothing changed, and a request that fits still succeeds.
  CHECK(pool->stats().bytes_in_use == 1 * MiB);
  CHECK(pool->stats().live_allocs == 1);
  void* q = pool->allocate(1 * MiB);  // the rest of the first (2 MiB) region
  void* r = pool->allocate(2 * MiB);  // a second region: the pool is at its limit
  CHECK(pool->stats().pool_bytes == 4 * MiB);
  try {
    pool->allocate(1);
    FAIL("no throw");
  } catch (const tw::OutOfMemory& e) {
    CHECK(contains(e.what(), "the limit is reached"));
  }
  CHECK_THROWS_AS(pool->allocate(static_cast<std::size_t>(-1)), tw::OutOfMemory);
  for (void* x : {p, q, r}) pool->deallocate(x);
}

TEST_CASE("out-of-memory says when fragmentation, not the limit, is the cause", "[memory]") {
  Pool pool({.device_name = "/cpu:1", .limit_bytes = 1 * MiB, .allow_growth = false});
  std::vector<void*> q;
  for (int i = 0; i < 4; ++i) q.push_back(pool->allocate(256 * KiB));
  pool->deallocate(q[0]);
  pool->deallocate(q[2]);  // 512 KiB free, in two separate 256 KiB holes
  auto s = pool->stats();
  CHECK(s.largest_free_block == 256 * KiB);
  CHECK(s.fragmentation == Approx(0.5));
  try {
    pool->allocate(300 * KiB);
    FAIL("no throw");
  } catch (const tw::OutOfMemory& e) {
    std::string m = e.what();
    INFO(m);
    CHECK(contains(m, "fragmented"));
    CHECK(contains(m, "largest free block 256.0 KiB"));
    CHECK(contains(m, "ProcessOptions::memory_limit_mb[/cpu:1]"));
  }
  pool->deallocate(q[1]);
  pool->deallocate(q[3]);
}

TEST_CASE("out-of-memory appends a per-bin dump on request", "[memory]") {
  Pool pool({.device_name = "/cpu:0", .limit_bytes = 1 * MiB, .dump_on_oom = true});
  void* p = pool->allocate(512 * KiB);
  try {
    pool->allocate(768 * KiB);
    FAIL("no throw");
  } catch (const tw::OutOfMemory& e) {
    std::string m = e.what();
    INFO(m);
    CHECK(contains(m, "/cpu:0"));
    CHECK(contains(m, "bin 11"));  // the 512 KiB chunk lives in bin [512 KiB, 1 MiB)
    CHECK(contains(m, "region "));
    CHECK_FALSE(contains(m, "per_process_gpu_memory_fraction"));  // a CPU device: no GPU flag
  }
  pool->deallocate(p);
}

TEST_CASE("TOWERFLOW_ALLOCATOR_DUMP=1 appends the dump without the option", "[memory]") {
  Pool pool({.device_name = "/cpu:0", .limit_bytes = 1 * MiB});
  void* p = pool->allocate(512 * KiB);
  ::setenv("TOWERFLOW_ALLOCATOR_DUMP", "1", 1);
  std::string with_env, without_env;
  try {
    pool->allocate(768 * KiB);
  } catch (const tw::OutOfMemory& e) {
    with_env = e.what();
  }
  ::unsetenv("TOWERFLOW_ALLOCATOR_DUMP");
  try {
    pool->allocate(768 * KiB);
  } catch (const tw::OutOfMemory& e) {
    without_env = e.what();
  }
  CHECK(contains(with_env, "bin 11"));
  CHECK_FALSE(contains(without_env, "bin 11"));
  CHECK(contains(without_env, "TOWERFLOW_ALLOCATOR_DUMP=1"));
  pool->deallocate(p);
}

TEST_CASE("a refused region makes the pool back off, free empty regions, then name allow_growth",
          "[memory]") {
  // The device has 3 MiB to give although the limit is 8 MiB.
  Pool pool({.device_name = "/gpu:0", .limit_bytes = 8 * MiB, .initial_region_bytes = 1 * MiB,
             .growth_cap = 0},
            3 * MiB);
  void* a = pool->allocate(1 * MiB);  // region of 1 MiB
  void* b = pool->allocate(1 * MiB);  // region of 2 MiB
  void* c = pool->allocate(1 * MiB);  // fills it
  CHECK(pool.log->granted == std::vector<std::size_t>{1 * MiB, 2 * MiB});
  pool->deallocate(a);  // the first region is empty now
  // 1.5 MiB fits nowhere: the 4 MiB region is refused, the pool backs off in 10% steps down to
  // 1.5 MiB, frees the empty region, tries again, and only then gives up.
  try {
    pool->allocate(1536 * KiB);
    FAIL("no throw");
  } catch (const tw::OutOfMemory& e) {
    std::string m = e.what();
    INFO(m);
    CHECK(contains(m, "refused"));
    CHECK(contains(m, "ProcessOptions::allow_growth = true"));
    CHECK(contains(m, "ProcessOptions::per_process_gpu_memory_fraction"));
  }
  REQUIRE(pool.log->refused.size() > 2);
  CHECK(pool.log->refused.front() == 4 * MiB);
  CHECK(pool.log->refused[1] < 4 * MiB);
  CHECK(pool.log->refused.back() == 1536 * KiB);
  CHECK(pool.log->frees == 1);  // the empty region went back
  CHECK(pool->stats().pool_bytes == 2 * MiB);
  CHECK(pool->stats().live_allocs == 2);
  // A request the device can still hold succeeds after backing off.
  void* d = pool->allocate(1 * MiB);
  CHECK(pool->stats().pool_bytes == 3 * MiB);
  for (void* p : {b, c, d}) pool->deallocate(p);
}

TEST_CASE("a pool without growth that the device cannot fill reserves what it can", "[memory]") {
  Pool pool({.device_name = "/gpu:0", .limit_bytes = 10 * MiB, .allow_growth = false}, 6 * MiB);
  void* p = pool->allocate(1 * MiB);
  REQUIRE(pool.log->granted.size() == 1);
  CHECK(pool.log->granted[0] <= 6 * MiB);
  CHECK(pool.log->granted[0] >= 5 * MiB);  // 10% steps: 10, 9, 8.1, 7.29, 6.56, 5.9
  pool->deallocate(p);
}

TEST_CASE("double frees and foreign pointers raise InvalidArgument and change nothing", "[memory]") {
  Pool pool({.device_name = "/cpu:3", .limit_bytes = 1 * MiB});
  void* a = pool->allocate(1000);
  void* b = pool->allocate(1000);
  pool->deallocate(a);
  const auto before = pool->stats();
  try {
    pool->deallocate(a);
    FAIL("no throw");
  } catch (const tw::InvalidArgument& e) {
    CHECK(contains(e.what(), "/cpu:3"));
    CHECK(contains(e.what(), "freed twice"));
  }
  CHECK_THROWS_AS(pool->deallocate(static_cast<char*>(b) + 256), tw::InvalidArgument);  // interior
  int on_stack = 0;
  try {
    pool->deallocate(&on_stack);
    FAIL("no throw");
  } catch (const tw::InvalidArgument& e) {
    CHECK(contains(e.what(), "not allocated by this allocator"));
  }
  const auto after = pool->stats();
  CHECK(after.bytes_in_use == before.bytes_in_use);
  CHECK(after.live_allocs == before.live_allocs);
  CHECK(after.largest_free_block == before.largest_free_block);
  pool->deallocate(b);
  CHECK(pool->stats().largest_free_block == 1 * MiB);
}

TEST_CASE("statistics: peak, reset_peak, counts, regions, fragmentation", "[memory]") {
  Pool pool({.device_name = "/cpu:0", .limit_bytes = 4 * MiB, .allow_growth = false});
  void* a = pool->allocate(1 * MiB);
  void* b = pool->allocate(2 * MiB);
  pool->deallocate(b);
  auto s = pool->stats();
  CHECK(s.bytes_in_use == 1 * MiB);
  CHECK(s.peak_bytes_in_use == 3 * MiB);
  CHECK(s.bytes_limit == 4 * MiB);
  CHECK(s.pool_bytes == 4 * MiB);
  CHECK(s.num_regions == 1);
  CHECK(s.num_allocs == 2);
  CHECK(s.live_allocs == 1);
  CHECK(s.largest_free_block == 3 * MiB);
  CHECK(s.fragmentation == 0.0);
  pool->reset_peak();
  CHECK(pool->stats().peak_bytes_in_use == 1 * MiB);
  void* c = pool->allocate(512 * KiB);
  CHECK(pool->stats().peak_bytes_in_use == 1536 * KiB);
  std::string line = tw::format_stats(pool->stats());
  CHECK(contains(line, "in use 1.5 MiB (peak 1.5 MiB) of 4.0 MiB limit"));
  CHECK(contains(line, "3 allocations (2 live)"));
  CHECK(pool->name() == "/cpu:0 BFC over fake");
  pool->deallocate(a);
  pool->deallocate(c);
}

TEST_CASE("bad options raise InvalidArgument naming the device and the fix", "[memory]") {
  CHECK_THROWS_AS(tw::make_bfc_allocator(nullptr, {.device_name = "/cpu:0", .limit_bytes = 1 * MiB}),
                  tw::InvalidArgument);
  try {
    tw::make_bfc_allocator(tw::make_host_sub_allocator(), {.device_name = "/gpu:2", .limit_bytes = 0});
    FAIL("no throw");
  } catch (const tw::InvalidArgument& e) {
    CHECK(contains(e.what(), "/gpu:2"));
    CHECK(contains(e.what(), "ProcessOptions::memory_limit_mb"));
  }
  CHECK_THROWS_AS(tw::make_bfc_allocator(tw::make_host_sub_allocator(),
                                         {.device_name = "/cpu:0", .limit_bytes = 1 * MiB,
                                          .initial_region_bytes = 0}),
                  tw::InvalidArgument);
  CHECK_THROWS_AS(tw::make_bfc_allocator(tw::make_host_sub_allocator(),
                                         {.device_name = "/cpu:0", .limit_bytes = 1 * MiB,
                                          .growth_cap = -1.0}),
                  tw::InvalidArgument);
}

TEST_CASE("the destructor returns every region to the sub-allocator", "[memory]") {
  auto log = std::make_shared<SubAllocatorLog>();
  {
    auto a = tw::make_bfc_allocator(std::make_unique<FakeSubAllocator>(log),
                                    {.device_name = "/cpu:0", .limit_bytes = 64 * MiB,
                                     .initial_region_bytes = 1 * MiB});
    for (int i = 0; i < 10; ++i) a->deallocate(a->allocate((i + 1) * MiB));
    CHECK(log->held > 0);
  }
  CHECK(log->held == 0);
  CHECK(log->frees == log->granted.size());
}

namespace {

// The mapping of /proc/self/smaps that holds address p: its [start, end) and VmFlags line, or
// start == end == 0 where there is none (or no /proc).
struct Mapping {
  std::uintptr_t start = 0, end = 0;
  std::string flags;
};
Mapping mapping_of(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  Mapping m;
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    const auto dash = line.find('-');
    if (dash != std::string::npos && dash > 0 && std::isxdigit(static_cast<unsigned char>(line[0])) &&
        line.find(' ') > dash) {
      const std::uintptr_t start = std::stoull(line.substr(0, dash), nullptr, 16);
      const std::uintptr_t end = std::stoull(line.substr(dash + 1, line.find(' ') - dash - 1), nullptr, 16);
      inside = start <= at && at < end;
      if (inside) m = {start, end, ""};
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      m.flags = line;
    }
  }
  return m;
}

}  // namespace

// Note [Huge pages for regions] in core/memory/host_sub_allocator.cc: a host region of 2 MiB or
// more starts on a 2 MiB boundary, is mapped exactly (the alignment's head and tail returned),
// and is advised for huge pages where the kernel has them; smaller ones are plain pages. Every
// byte is writable and freeing returns the mapping.
TEST_CASE("host regions of 2 MiB or more start on a huge page and are advised for huge pages", "[memory]") {
  const std::size_t huge = std::size_t{2} << 20;
  const long page = sysconf(_SC_PAGESIZE);
  auto sub = tw::make_host_sub_allocator();
  const bool thp = std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled").good();
  for (const std::size_t bytes : {std::size_t{3} * MiB + 5, std::size_t{2} * MiB, std::size_t{100} * 1024}) {
    INFO("bytes = " << bytes);
    auto* p = static_cast<unsigned char*>(sub->alloc(bytes));
    REQUIRE(p != nullptr);
    const std::size_t len = (bytes + page - 1) / page * page;
    CHECK(reinterpret_cast<std::uintptr_t>(p) % (bytes >= huge ? huge : page) == 0);
    for (std::size_t i = 0; i < bytes; i += page) p[i] = static_cast<unsigned char>(i);
    p[bytes - 1] = 1;
    CHECK(p[0] == 0);
    const Mapping m = mapping_of(p);
    if (m.end != 0) {
      // A plain region may share its mapping with an anonymous neighbour the kernel merged it
      // with; an advised one (where the kernel has huge pages) has flags of its own, so its mapping
      // starts where it does.
      if (bytes >= huge && thp) CHECK(m.start == reinterpret_cast<std::uintptr_t>(p));
      CHECK(m.start <= reinterpret_cast<std::uintptr_t>(p));
      CHECK(m.end >= reinterpret_cast<std::uintptr_t>(p) + len);
      if (bytes >= huge && thp) CHECK_THAT(m.flags, Catch::Contains(" hg"));
      if (bytes < huge) CHECK_THAT(m.flags, !Catch::Contains(" hg"));
    } else {
      WARN("SKIPPED: no /proc/self/smaps here, the mapping's extent and advice are not checked");
    }
    sub->free(p, bytes);
    CHECK(mapping_of(p).end == 0);
  }
  if (!thp) WARN("SKIPPED: this kernel has no transparent huge pages; the advice is not checked");
}

TEST_CASE("format_bytes uses binary units with one decimal", "[memory]") {
  CHECK(tw::format_bytes(0) == "0 B");
  CHECK(tw::format_bytes(1023) == "1023 B");
  CHECK(tw::format_bytes(1024) == "1.0 KiB");
  CHECK(tw::format_bytes(1536 * KiB) == "1.5 MiB");
  CHECK(tw::format_bytes(16ull << 30) == "16.0 GiB");
}

TEST_CASE("limit_at_first_use sets the limit at the first allocation, before any region",
          "[memory]") {
  int calls = 0;
  std::size_t free_now = 64 * MiB;  // what the device has free when the pool is first used
  Pool pool(tw::BfcOptions{.device_name = "/gpu:0",
                           .limit_bytes = 256 * MiB,  // the bound shown until then
                           .allow_growth = false,
                           .limit_at_first_use = [&] {
                             ++calls;
                             return free_now - 16 * MiB;
                           }});
  CHECK(pool->stats().bytes_limit == 256 * MiB);
  CHECK(calls == 0);
  free_now = 32 * MiB;  // NCCL and cuDNN took memory between creation and first use
  void* p = pool->allocate(KiB);
  CHECK(calls == 1);
  CHECK(pool->stats().bytes_limit == 16 * MiB);
  REQUIRE(pool.log->granted.size() == 1);
  CHECK(pool.log->granted[0] == 16 * MiB);  // without growth the whole limit, no more
  void* q = pool->allocate(KiB);
  CHECK(calls == 1);
  CHECK_THROWS_AS(pool->allocate(32 * MiB), tw::OutOfMemory);
  pool->deallocate(p);
  pool->deallocate(q);
}

TEST_CASE("limit_at_first_use: a failure is the allocation's, and the next one asks again",
          "[memory]") {
  int calls = 0;
  Pool pool(tw::BfcOptions{.device_name = "/gpu:0",
                           .limit_bytes = 256 * MiB,
                           .allow_growth = false,
                           .limit_at_first_use = [&]() -> std::size_t {
                             if (++calls == 1) throw tw::OutOfMemory("/gpu:0 has no memory free");
                             return 8 * MiB;
                           }});
  CHECK_THROWS_AS(pool->allocate(KiB), tw::OutOfMemory);
  CHECK(pool.log->granted.empty());
  void* p = pool->allocate(KiB);
  CHECK(calls == 2);
  CHECK(pool->stats().bytes_limit == 8 * MiB);
  pool->deallocate(p);
  Pool tiny(tw::BfcOptions{.device_name = "/gpu:1", .limit_bytes = MiB, .allow_growth = false,
                           .limit_at_first_use = [] { return std::size_t{100}; }});
  CHECK_THROWS_AS(tiny->allocate(KiB), tw::InvalidArgument);
}
