// The NCCL communicator's logic (NcclRanks) against FakeNccl, a test double of NCCL's documented
// behaviour (fake_nccl.h): no GPU needed, built and run in every build. A hang here is a failure:
// run_bounded() ends the process with a message when participants do not return in time.

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "core/collectives/nccl_ranks.h"
#include "core/memory/device_free_lock.h"
#include "tests/core/collectives/fake_nccl.h"

using namespace towerflow;
using namespace towerflow::collectives;
using namespace towerflow::collectives::testing;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

std::vector<Device> gpus(int n) {
  std::vector<Device> d;
  for (int i = 0; i < n; ++i) d.push_back(Device::gpu(i));
  return d;
}

struct Clique {
  std::shared_ptr<FakeNcclWorld> world;
  std::unique_ptr<NcclRanks> comm;
};

Clique make_clique(int n, NcclRanksOptions options = {}) {
  Clique c;
  c.world = std::make_shared<FakeNcclWorld>(n);
  c.comm = std::make_unique<NcclRanks>(gpus(n), std::make_unique<FakeNccl>(c.world, n), nullptr, options);
  return c;
}

// Runs fn(i) for i in 0..n-1 on n threads and joins them. A thread still running after `bound`
// is a hang: the test reports it and ends the process (a hung thread cannot be joined).
std::vector<std::exception_ptr> run_bounded(int n, const std::function<void(int)>& fn,
                                            std::chrono::seconds bound = 20s) {
  std::vector<std::exception_ptr> errors(n);
  std::mutex mu;
  std::condition_variable cv;
  int finished = 0;
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i)
    threads.emplace_back([&, i] {
      try {
        fn(i);
      } catch (...) {
        errors[i] = std::current_exception();
      }
      std::lock_guard l(mu);
      ++finished;
      cv.notify_all();
    });
  {
    std::unique_lock l(mu);
    if (!cv.wait_for(l, bound, [&] { return finished == n; })) {
      std::fprintf(stderr, "FAILED: %d of %d threads still blocked after %lld s: the NCCL logic hangs\n",
                   n - finished, n, static_cast<long long>(bound.count()));
      std::fflush(stderr);
      std::_Exit(1);
    }
  }
  for (auto& t : threads) t.join();
  return errors;
}

std::string message_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  }
  return "";
}

template <typename E>
bool threw(const std::exception_ptr& e) {
  if (!e) return false;
  try {
    std::rethrow_exception(e);
  } catch (const E&) {
    return true;
  } catch (...) {
    return false;
  }
}

void require_no_errors(const std::vector<std::exception_ptr>& errors) {
  for (auto& e : errors)
    if (e) FAIL(message_of(e));
}

// Buffers of participant p hold p + 1 + i / count; the sum over n participants is known.
std::vector<std::vector<float>> buffers(int n, std::size_t count) {
  std::vector<std::vector<float>> b(n, std::vector<float>(count));
  for (int p = 0; p < n; ++p)
    for (std::size_t i = 0; i < count; ++i) b[p][i] = static_cast<float>(p + 1) + static_cast<float>(i % 7);
  return b;
}
float expected_sum(int n, std::size_t i) {
  return static_cast<float>(n * (n + 1) / 2) + static_cast<float>(n) * static_cast<float>(i % 7);
}

// Participants 0..n-1 each run an all-reduce while another thread waits (wait_then_abort's
// return) and then calls abort(reason) on the communicator: each participant's error and how
// long after the abort it returned.
struct AbortRun {
  std::vector<std::exception_ptr> errors;
  std::vector<Clock::duration> after_abort;
};
AbortRun abort_during_all_reduce(Clique& c, int n, const std::string& reason,
                                 const std::function<void()>& wait_then_abort) {
  auto bufs = buffers(n, 16);
  std::atomic<Clock::rep> aborted_at{0};
  std::vector<Clock::time_point> returned(n);
  auto errors = run_bounded(n + 1, [&](int i) {
    if (i == n) {
      wait_then_abort();
      aborted_at = Clock::now().time_since_epoch().count();
      c.comm->abort(reason);
      return;
    }
    try {
      c.comm->all_reduce_sum(i, bufs[i]);
    } catch (...) {
      returned[i] = Clock::now();
      throw;
    }
  });
  REQUIRE(errors[n] == nullptr);
  const Clock::time_point t0{Clock::duration(aborted_at.load())};
  AbortRun run{std::vector<std::exception_ptr>(errors.begin(), errors.begin() + n), {}};
  for (int p = 0; p < n; ++p) run.after_abort.push_back(returned[p] - t0);
  return run;
}

// The device-free gate is free again: no launch is owed (Note [Device frees and NCCL launches]).
bool free_gate_idle() {
  std::atomic<bool> got{false};
  std::thread t([&] {
    std::lock_guard l(device_free_lock());
    got = true;
  });
  for (int i = 0; i < 2000 && !got; ++i) std::this_thread::sleep_for(1ms);
  if (!got) {
    std::fprintf(stderr, "FAILED: device_free_lock() still owed launches after every collective returned\n");
    std::_Exit(1);
  }
  t.join();
  return true;
}

}  // namespace

TEST_CASE("the first all-reduce of 2 and 4 ranks in one process does not deadlock on runtime connect",
          "[nccl_ranks]") {
  for (int n : {2, 4}) {
    CAPTURE(n);
    Clique c = make_clique(n);
    auto bufs = buffers(n, 1000);
    require_no_errors(run_bounded(n, [&](int p) { c.comm->all_reduce_sum(p, bufs[p]); }));
    for (int p = 0; p < n; ++p) {
      CHECK(bufs[p][0] == expected_sum(n, 0));
      CHECK(bufs[p][999] == expected_sum(n, 999));
    }
    CHECK(c.world->calls_after_abort() == 0);
    CHECK(free_gate_idle());
  }
}

TEST_CASE("collectives do not deadlock while another thread frees device memory as the allocator does",
          "[nccl_ranks]") {
  for (int n : {2, 4}) {
    CAPTURE(n);
    Clique c = make_clique(n);
    std::atomic<bool> stop{false};
    std::atomic<int> frees{0};
    // As CudaSubAllocator::free: the gate held around each cudaFree (here, a short sleep).
    std::thread freer([&] {
      while (!stop) {
        {
          std::lock_guard l(device_free_lock());
          std::this_thread::sleep_for(200us);
          ++frees;
        }
        std::this_thread::sleep_for(100us);
      }
    });
    auto bufs = buffers(n, 64);
    std::vector<float> gathered_template(64 * n);
    auto errors = run_bounded(n, [&](int p) {
      for (int step = 0; step < 20; ++step) {
        std::vector<float> b = bufs[p];
        c.comm->all_reduce_sum(p, b);
        if (b[5] != expected_sum(n, 5)) throw std::runtime_error("wrong sum");
        c.comm->barrier(p);
        std::vector<float> out(64 * n);
        c.comm->all_gather(p, bufs[p], out);
        if (out[64 * (n - 1)] != bufs[n - 1][0]) throw std::runtime_error("wrong gather");
        std::vector<float> root = bufs[p];
        c.comm->broadcast(p, root, n - 1);
        if (root[3] != bufs[n - 1][3]) throw std::runtime_error("wrong broadcast");
      }
    });
    stop = true;
    freer.join();
    require_no_errors(errors);
    CHECK(frees > 0);
    CHECK(free_gate_idle());
  }
}

TEST_CASE("abort() from another thread reaches ranks blocked inside their first launch", "[nccl_ranks]") {
  // A peer of another process never arrives: both local ranks block inside the launch (runtime
  // connect), where only ncclCommAbort releases them.
  Clique c = make_clique(2);
  c.world->set_absent_peers(1);
  const AbortRun run = abort_during_all_reduce(c, 2, "tower 1 failed (test)", [&] {
    while (c.world->blocked_in_first_launch() < 2) std::this_thread::sleep_for(1ms);
    std::this_thread::sleep_for(50ms);
  });
  for (int p = 0; p < 2; ++p) {
    CAPTURE(p);
    CHECK(threw<CollectiveAborted>(run.errors[p]));
    CHECK_THAT(message_of(run.errors[p]), Catch::Contains("tower 1 failed (test)"));
    CHECK(run.after_abort[p] < 2s);
  }
  CHECK(c.world->calls_after_abort() == 0);
  CHECK(free_gate_idle());
}

TEST_CASE("abort() from another thread reaches ranks waiting for a collective that never completes",
          "[nccl_ranks]") {
  Clique c = make_clique(2);
  auto bufs = buffers(2, 16);
  require_no_errors(run_bounded(2, [&](int p) { c.comm->all_reduce_sum(p, bufs[p]); }));  // connected
  c.world->set_never_complete(true);
  const AbortRun run = abort_during_all_reduce(c, 2, "tower 0 failed (test)", [] { std::this_thread::sleep_for(200ms); });
  for (int p = 0; p < 2; ++p) {
    CAPTURE(p);
    CHECK(threw<CollectiveAborted>(run.errors[p]));
    CHECK(run.after_abort[p] < 2s);
    CHECK(c.world->aborted(p));
  }
  CHECK(c.world->calls_after_abort() == 0);
}

TEST_CASE("the deadline ends a wait for a collective that never completes", "[nccl_ranks]") {
  Clique c = make_clique(2, {.timeout = 300ms});
  c.world->set_never_complete(true);
  auto bufs = buffers(2, 16);
  const auto t0 = Clock::now();
  auto errors = run_bounded(2, [&](int p) { c.comm->all_reduce_sum(p, bufs[p]); });
  CHECK(Clock::now() - t0 < 5s);
  for (int p = 0; p < 2; ++p) {
    CAPTURE(p, message_of(errors[p]));
    CHECK(threw<CollectiveAborted>(errors[p]));
    CHECK_THAT(message_of(errors[p]), Catch::Contains("did not complete within 0.3 s"));
    CHECK(c.world->aborted(p));
  }
  CHECK(c.world->calls_after_abort() == 0);
}

TEST_CASE("an asynchronous NCCL error on rank 1 raises CollectiveAborted naming rank 1 on every participant",
          "[nccl_ranks]") {
  for (int n : {2, 4}) {
    CAPTURE(n);
    Clique c = make_clique(n);
    auto bufs = buffers(n, 16);
    require_no_errors(run_bounded(n, [&](int p) { c.comm->all_reduce_sum(p, bufs[p]); }));
    c.world->set_async_error(1, "remote process exited or there was a network error");
    auto errors = run_bounded(n, [&](int p) { c.comm->all_reduce_sum(p, bufs[p]); });
    for (int p = 0; p < n; ++p) {
      CAPTURE(p, message_of(errors[p]));
      CHECK(threw<CollectiveAborted>(errors[p]));
      CHECK_THAT(message_of(errors[p]), Catch::Contains("NCCL rank 1 (/gpu:1)"));
      CHECK_THAT(message_of(errors[p]), Catch::Contains("remote process exited or there was a network error"));
      CHECK(c.world->aborted(p));  // every rank aborted, so the peers are released
    }
    CHECK(c.world->calls_after_abort() == 0);
  }
}

TEST_CASE("queued all-reduces are launched back to back and wait_queued gives every bucket's sum",
          "[nccl_ranks]") {
  for (int n : {2, 4}) {
    CAPTURE(n);
    Clique c = make_clique(n);
    const std::vector<std::size_t> sizes = {1000, 17, 4096, 1, 333};
    std::vector<std::vector<std::vector<float>>> bufs;  // [bucket][participant]
    for (std::size_t s : sizes) bufs.push_back(buffers(n, s));
    require_no_errors(run_bounded(n, [&](int p) {
      for (std::size_t b = 0; b < sizes.size(); ++b) c.comm->all_reduce_sum_queued(p, bufs[b][p], nullptr);
      c.comm->wait_queued(p);
    }));
    for (std::size_t b = 0; b < sizes.size(); ++b)
      for (int p = 0; p < n; ++p) {
        CAPTURE(b, p);
        CHECK(bufs[b][p][0] == expected_sum(n, 0));
        CHECK(bufs[b][p][sizes[b] - 1] == expected_sum(n, sizes[b] - 1));
      }
    // The rank saw every launch before any completion query: no wait between the buckets.
    for (int p = 0; p < n; ++p) {
      const auto log = c.world->log(p);
      const auto last_launch = std::find(log.rbegin(), log.rend(), "launch");
      const auto first_query = std::find(log.begin(), log.end(), "query");
      CHECK(std::count(log.begin(), log.end(), "launch") == static_cast<long>(sizes.size()));
      REQUIRE(first_query != log.end());
      CHECK(first_query - log.begin() > log.rend() - last_launch - 1);
    }
    CHECK(free_gate_idle());
  }
}

TEST_CASE("reset() after an abort builds fresh communicators that work", "[nccl_ranks]") {
  Clique c = make_clique(2);
  c.world->set_absent_peers(1);
  auto bufs = buffers(2, 8);
  auto errors = run_bounded(3, [&](int i) {
    if (i == 2) {
      while (c.world->blocked_in_first_launch() < 2) std::this_thread::sleep_for(1ms);
      c.comm->abort("test abort");
      return;
    }
    c.comm->all_reduce_sum(i, bufs[i]);
  });
  CHECK(threw<CollectiveAborted>(errors[0]));
  CHECK(threw<CollectiveAborted>(errors[1]));
  // Later calls raise too, until reset().
  errors = run_bounded(2, [&](int p) { c.comm->all_reduce_sum(p, bufs[p]); });
  CHECK(threw<CollectiveAborted>(errors[0]));
  c.world->clear_faults();
  c.comm->reset();
  CHECK(c.world->inits() == 2);
  bufs = buffers(2, 8);
  require_no_errors(run_bounded(2, [&](int p) { c.comm->all_reduce_sum(p, bufs[p]); }));
  CHECK(bufs[0][3] == expected_sum(2, 3));
  CHECK(bufs[1][3] == expected_sum(2, 3));
  CHECK(c.world->calls_after_abort() == 0);
  CHECK(free_gate_idle());
}

TEST_CASE("a count mismatch raises InvalidArgument on every participant and leaves the clique usable",
          "[nccl_ranks]") {
  Clique c = make_clique(2);
  std::vector<std::vector<float>> bufs = {std::vector<float>(100, 1.f), std::vector<float>(200, 1.f)};
  auto errors = run_bounded(2, [&](int p) { c.comm->all_reduce_sum(p, bufs[p]); });
  CHECK(threw<InvalidArgument>(errors[0]));
  CHECK(threw<InvalidArgument>(errors[1]));
  CHECK(free_gate_idle());
  bufs = buffers(2, 10);
  require_no_errors(run_bounded(2, [&](int p) { c.comm->all_reduce_sum(p, bufs[p]); }));
  CHECK(bufs[1][9] == expected_sum(2, 9));
}
