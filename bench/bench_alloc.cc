// towerflow_bench_alloc: allocate+free pairs per second of the BFC allocator against plain
// malloc/free, and the BFC pool's overhead (peak pool bytes over peak requested bytes).
//
//   towerflow_bench_alloc                 # a fixed-width table
//   towerflow_bench_alloc --json          # the table and one JSON line per row
//   towerflow_bench_alloc --threads 4 --pairs 1000000
//
// Workloads (each thread runs its own script; all threads share one BFC pool, as the towers of
// one device would):
//   fixed:        256 KiB blocks, 128 live per thread; each pair frees a random live block and
//                 allocates a new one in its place.
//   mixed:        tensor-like sizes, log-uniform from 1 KiB to 8 MiB, in the pattern of training
//                 steps: 32 parameters live throughout; a forward pass of 64 layers keeps each
//                 layer's activation and makes and frees a workspace; the backward pass, layer by
//                 layer in reverse, makes a gradient, frees the activation, makes and frees a
//                 workspace, frees the gradient. Sizes are drawn afresh for every step, so no two
//                 steps look alike (about 110 MiB live at the peak of a step).
//   mixed-random: the same sizes, 128 live per thread, random replacement as for fixed: a harsher
//                 pattern than training makes (no stack order at all), reported for comparison.
// Scripts are drawn before timing and are identical for both allocators. Each timed run starts
// from a fresh BFC pool (growth on, default options), so region growth is part of the warm-up;
// only the operations after the first tenth are counted. Neither allocator's memory is written,
// so the figures are the allocators' own bookkeeping. The overhead comes from a separate, untimed
// replay that tallies the requested bytes.

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/memory/memory.h"

namespace tw = towerflow;

namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

enum class Pattern { Replace, Steps };

struct Workload {
  std::string name;
  std::size_t min_bytes, max_bytes;  // log-uniform between them (equal: fixed size)
  Pattern pattern;
  std::size_t live;                  // Replace: live blocks per thread; Steps: layers
};

constexpr std::size_t kFree = 0;  // an Op with bytes == kFree frees its slot

struct Op {
  std::uint32_t slot;
  std::size_t bytes;  // kFree, or a request (sizes are at least min_bytes >= 1)
};

// One thread's pre-drawn operations; ops before `warm` are warm-up.
struct Script {
  std::size_t slots = 0;
  std::vector<Op> ops;
  std::size_t warm = 0;
  std::size_t counted_pairs = 0;  // allocations after warm
};

Script make_script(const Workload& w, std::size_t pairs, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(std::log(static_cast<double>(w.min_bytes)),
                                           std::log(static_cast<double>(w.max_bytes)));
  auto draw = [&] {
    return w.min_bytes == w.max_bytes ? w.min_bytes : static_cast<std::size_t>(std::exp(u(rng)));
  };
  const std::size_t total = pairs + pairs / 10;
  std::size_t allocs = 0;
  Script s;
  auto alloc = [&](std::uint32_t slot) {
    s.ops.push_back({slot, draw()});
    if (++allocs == pairs / 10) s.warm = s.ops.size();
  };
  auto free = [&](std::uint32_t slot) { s.ops.push_back({slot, kFree}); };
  if (w.pattern == Pattern::Replace) {
    s.slots = w.live;
    for (std::uint32_t i = 0; i < w.live; ++i) alloc(i);
    while (allocs < total) {
      const auto v = static_cast<std::uint32_t>(rng() % w.live);
      free(v);
      alloc(v);
    }
  } else {
    constexpr std::uint32_t kParams = 32;
    const auto layers = static_cast<std::uint32_t>(w.live);
    const std::uint32_t workspace = kParams + layers, grad = workspace + 1;
    s.slots = grad + 1;
    for (std::uint32_t i = 0; i < kParams; ++i) alloc(i);
    while (allocs < total) {
      for (std::uint32_t l = 0; l < layers; ++l) {
        alloc(kParams + l);
        alloc(workspace);
        free(workspace);
      }
      for (std::uint32_t l = layers; l-- > 0;) {
        alloc(grad);
        free(kParams + l);
        alloc(workspace);
        free(workspace);
        free(grad);
      }
    }
  }
  s.counted_pairs = allocs - pairs / 10;
  return s;
}

// The allocator under test, as two function objects (the same indirection for both).
struct Api {
  std::function<void*(std::size_t)> alloc;
  std::function<void(void*)> free;
};

// Tallies requested bytes across threads (only in the untimed overhead replay).
struct Tally {
  std::atomic<std::size_t> live{0};
  std::atomic<std::size_t> peak{0};
  void add(std::size_t b) {
    const std::size_t now = live.fetch_add(b, std::memory_order_relaxed) + b;
    std::size_t p = peak.load(std::memory_order_relaxed);
    while (now > p && !peak.compare_exchange_weak(p, now, std::memory_order_relaxed)) {
    }
  }
  void sub(std::size_t b) { live.fetch_sub(b, std::memory_order_relaxed); }
};

struct RunResult {
  double seconds = 0;        // wall time of the timed pairs (all threads)
  std::uintptr_t misaligned = 0;
};

// Runs the scripts on one thread each; returns the wall time of the counted operations.
RunResult run(const Api& api, const std::vector<Script>& scripts, Tally* tally) {
  const std::size_t threads = scripts.size();
  std::barrier start(static_cast<std::ptrdiff_t>(threads) + 1);
  std::barrier stop(static_cast<std::ptrdiff_t>(threads) + 1);
  std::atomic<std::uintptr_t> misaligned{0};
  std::vector<std::thread> pool;
  for (std::size_t t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      const Script& s = scripts[t];
      std::vector<void*> ptr(s.slots, nullptr);
      std::vector<std::size_t> bytes(s.slots, 0);
      std::uintptr_t bits = 0;
      auto ops = [&](std::size_t begin, std::size_t end) {
        for (std::size_t i = begin; i < end; ++i) {
          const Op& op = s.ops[i];
          if (op.bytes == kFree) {
            api.free(ptr[op.slot]);
            ptr[op.slot] = nullptr;
            if (tally) tally->sub(bytes[op.slot]);
          } else {
            ptr[op.slot] = api.alloc(op.bytes);
            bytes[op.slot] = op.bytes;
            if (tally) tally->add(op.bytes);
            bits |= reinterpret_cast<std::uintptr_t>(ptr[op.slot]);
          }
        }
      };
      ops(0, s.warm);
      start.arrive_and_wait();
      ops(s.warm, s.ops.size());
      stop.arrive_and_wait();
      for (std::size_t i = 0; i < ptr.size(); ++i)
        if (ptr[i] != nullptr) api.free(ptr[i]);
      misaligned.fetch_or(bits, std::memory_order_relaxed);
    });
  }
  start.arrive_and_wait();
  const auto t0 = std::chrono::steady_clock::now();
  stop.arrive_and_wait();
  const auto t1 = std::chrono::steady_clock::now();
  for (auto& th : pool) th.join();
  return {std::chrono::duration<double>(t1 - t0).count(), misaligned.load()};
}

std::unique_ptr<tw::Allocator> fresh_bfc() {
  return tw::make_bfc_allocator(tw::make_host_sub_allocator(),
                                {.device_name = "/cpu:0", .limit_bytes = std::size_t{64} << 30,
                                 .allow_growth = true});
}

Api bfc_api(tw::Allocator& a) {
  return {[&a](std::size_t b) { return a.allocate(b); }, [&a](void* p) { a.deallocate(p); }};
}

Api malloc_api() {
  return {[](std::size_t b) { return std::malloc(b); }, [](void* p) { std::free(p); }};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"towerflow_bench_alloc: BFC allocator against malloc/free"};
  bool json = false;
  std::size_t pairs = 500000;
  unsigned threads = std::min(4u, std::max(2u, std::thread::hardware_concurrency()));
  std::uint64_t seed = 1;
  std::string only = "all";
  app.add_option("--workload", only, "fixed, mixed, mixed-random or all")->check(CLI::IsMember({"fixed", "mixed", "mixed-random", "all"}));
  app.add_flag("--json", json, "also print one JSON line per row");
  app.add_option("--pairs", pairs, "counted allocate+free pairs per thread (a tenth more are warm-up)")
      ->check(CLI::Range(std::size_t{1000}, std::size_t{100000000}));
  app.add_option("--threads", threads, "threads of the multi-threaded rows")->check(CLI::Range(2u, 256u));
  app.add_option("--seed", seed, "seed of the drawn sizes and victims");
  CLI11_PARSE(app, argc, argv);

  const std::vector<Workload> workloads = {{"fixed", 256 * KiB, 256 * KiB, Pattern::Replace, 128},
                                           {"mixed", 1 * KiB, 8 * MiB, Pattern::Steps, 64},
                                           {"mixed-random", 1 * KiB, 8 * MiB, Pattern::Replace, 128}};
  std::printf("%-12s %7s %10s %14s %14s %10s %9s %12s %12s %6s\n", "workload", "threads", "pairs/thr",
              "bfc pairs/s", "malloc pairs/s", "bfc/malloc", "overhead", "peak pool", "peak request",
              "check");
  for (const Workload& w : workloads) {
    if (only != "all" && only != w.name) continue;
    for (unsigned n : {1u, threads}) {
      std::vector<Script> scripts;
      std::size_t counted = 0, allocations = 0;
      for (unsigned t = 0; t < n; ++t) {
        scripts.push_back(make_script(w, pairs, seed * 1000 + t));
        counted += scripts.back().counted_pairs;
        for (const Op& op : scripts.back().ops) allocations += op.bytes != kFree;
      }

      // Timed: malloc first and BFC second, then BFC and malloc again; the better of each.
      double bfc_s = 1e30, malloc_s = 1e30;
      bool ok = true;
      for (int rep = 0; rep < 2; ++rep) {
        auto timed_bfc = [&] {
          auto a = fresh_bfc();
          const RunResult r = run(bfc_api(*a), scripts, nullptr);
          const auto st = a->stats();
          ok = ok && r.misaligned % tw::kAllocatorAlignment == 0 && st.bytes_in_use == 0 && st.live_allocs == 0 &&
               st.num_allocs == allocations;
          bfc_s = std::min(bfc_s, r.seconds);
        };
        auto timed_malloc = [&] { malloc_s = std::min(malloc_s, run(malloc_api(), scripts, nullptr).seconds); };
        if (rep == 0) {
          timed_malloc();
          timed_bfc();
        } else {
          timed_bfc();
          timed_malloc();
        }
      }

      // Untimed: the overhead. The pool never shrinks here (no region is refused, nothing is
      // released), so its final size is its peak.
      Tally tally;
      auto a = fresh_bfc();
      run(bfc_api(*a), scripts, &tally);
      const std::size_t peak_pool = a->stats().pool_bytes;
      const std::size_t peak_req = tally.peak.load();
      const double overhead = static_cast<double>(peak_pool) / static_cast<double>(peak_req);

      const double bfc_rate = static_cast<double>(counted) / bfc_s;
      const double malloc_rate = static_cast<double>(counted) / malloc_s;
      std::printf("%-12s %7u %10zu %14.3e %14.3e %10.2f %9.3f %12s %12s %6s\n", w.name.c_str(), n, pairs,
                  bfc_rate, malloc_rate, bfc_rate / malloc_rate, overhead, tw::format_bytes(peak_pool).c_str(),
                  tw::format_bytes(peak_req).c_str(), ok ? "ok" : "FAIL");
      if (json) {
        nlohmann::json row = {{"bench", "alloc"},
                              {"workload", w.name},
                              {"threads", n},
                              {"pairs_per_thread", pairs},
                              {"pattern", w.pattern == Pattern::Steps ? "steps" : "replace"},
                              {"min_bytes", w.min_bytes},
                              {"max_bytes", w.max_bytes},
                              {"bfc_pairs_per_s", bfc_rate},
                              {"malloc_pairs_per_s", malloc_rate},
                              {"bfc_over_malloc", bfc_rate / malloc_rate},
                              {"overhead", overhead},
                              {"peak_pool_bytes", peak_pool},
                              {"peak_requested_bytes", peak_req},
                              {"ok", ok}};
        row[w.pattern == Pattern::Steps ? "layers" : "live_per_thread"] = w.live;
        std::printf("%s\n", row.dump().c_str());
      }
      std::fflush(stdout);
      if (!ok) return 1;
    }
  }
  return 0;
}
