// towerflow_bench_allreduce: the local shared-memory all-reduce between logical CPU devices.
//
// Prints nccl-tests-style rows: size, time, algbw = S / t, busbw = algbw * 2(n-1)/n, the maximum
// error against a reference sum, and the machine's memory-traffic bound. An all-reduce of S bytes
// over n buffers in one address space must read nS and write nS bytes; the bound is the time n
// threads (one per participant, as in the all-reduce) take to memcpy S bytes each, which reads and
// writes exactly that much. `pct_bound` = bound time / all-reduce time.
//
//   towerflow_bench_allreduce --devices 2 --json
//
// Under mpirun the participants are every process's devices, reduced as the tower trainer
// reduces them (collectives::make_hierarchical_communicator: inside each process, then across
// processes over MPI), and each row adds the time of Open MPI's own MPI_Allreduce on one buffer
// per process, called directly (mpi_us) and the ratio (pct_mpi = mpi_us / time_us): what the
// process group's non-blocking, time-limited collective costs against the plain MPI call. There
// the memcpy bound is not measured (it says nothing about the link between processes).
//
//   mpirun -np 2 towerflow_bench_allreduce --devices 1 --json
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "core/collectives/local_communicator.h"
#include "core/collectives/process_group.h"

#ifdef TOWERFLOW_HAVE_MPI
#include <mpi.h>
#endif
using namespace towerflow;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Touches every page so first-touch faults are not timed.
std::vector<std::vector<float>> make_buffers(int n, std::size_t count) {
  std::vector<std::vector<float>> b(n);
  for (auto& x : b) x.assign(count, 0.f);
  return b;
}

// Runs body(p, iter) on n persistent threads for iters iterations, each iteration starting
// together; returns participant 0's per-iteration times (the collective ends in a barrier, so
// participant 0's time is the collective's).
// A spinning barrier, so that every participant starts an iteration at the same moment (a
// sleeping barrier would add a thread's wake-up latency to the first collective's time).
class SpinBarrier {
 public:
  explicit SpinBarrier(int n) : n_(n) {}
  void arrive_and_wait() {
    const int gen = gen_.load(std::memory_order_acquire);
    if (count_.fetch_add(1, std::memory_order_acq_rel) == n_ - 1) {
      count_.store(0, std::memory_order_relaxed);
      gen_.fetch_add(1, std::memory_order_release);
    } else {
      while (gen_.load(std::memory_order_acquire) == gen) std::this_thread::yield();
    }
  }

 private:
  const int n_;
  std::atomic<int> count_{0}, gen_{0};
};

// With processes: participant 0 of every process meets the other processes first, so that
// every process starts the iteration together.
template <typename Body>
std::vector<double> time_on_threads(int n, int iters, Body body, collectives::ProcessGroup* processes = nullptr) {
  std::vector<double> times(iters);
  SpinBarrier sync(n);
  std::vector<std::thread> threads;
  for (int p = 0; p < n; ++p)
    threads.emplace_back([&, p] {
      for (int i = 0; i < iters; ++i) {
        if (p == 0 && processes != nullptr) processes->barrier();
        sync.arrive_and_wait();
        auto t0 = Clock::now();
        body(p, i);
        if (p != 0) sync.arrive_and_wait();
        else {
          sync.arrive_and_wait();  // everyone done: the operation is complete
          times[i] = seconds_since(t0);
        }
      }
    });
  for (auto& t : threads) t.join();
  return times;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"towerflow_bench_allreduce: the CPU all-reduce between logical devices"};
  int devices = 2;
  std::size_t min_bytes = 1024, max_bytes = 64u << 20;
  double seconds_per_size = 0.3;
  bool json = false;
  app.add_option("--devices,-n", devices, "logical CPU devices (participants, one thread each)")
      ->check(CLI::Range(1, 64));
  app.add_option("--min_bytes", min_bytes, "smallest buffer");
  app.add_option("--max_bytes", max_bytes, "largest buffer (sizes double from min_bytes)");
  app.add_option("--seconds", seconds_per_size, "time budget per size");
  app.add_flag("--json", json, "also print one JSON line per size");
  CLI11_PARSE(app, argc, argv);

  std::vector<Device> devs;
  for (int i = 0; i < devices; ++i) devs.push_back(Device::cpu(i));
  collectives::ProcessGroup& world = collectives::world();
  const bool across = world.size() > 1;
  std::unique_ptr<collectives::Communicator> comm_owner = std::make_unique<collectives::LocalCommunicator>(devs);
  if (across) comm_owner = collectives::make_hierarchical_communicator(std::move(comm_owner), world);
  collectives::Communicator& comm = *comm_owner;
  collectives::ProcessGroup* processes = across ? &world : nullptr;
  const int local = devices;
  const int n = devices * world.size();  // participants in all
  const int first = devices * world.rank();  // this process's first participant
  const bool report = world.rank() == 0;
  // Open MPI's own all-reduce of one buffer per process, for comparison.
  auto mpi_time = [&](std::vector<float>& buf, int iters) -> double {
#ifdef TOWERFLOW_HAVE_MPI
    std::vector<double> t;
    for (int i = 0; i < iters; ++i) {
      MPI_Barrier(MPI_COMM_WORLD);
      const auto t0 = Clock::now();
      MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(buf.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      t.push_back(seconds_since(t0));
    }
    double m = median(t);
    MPI_Bcast(&m, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);  // rank 0's figure, as for towerflow's
    return m;
#else
    (void)buf;
    (void)iters;
    return 0;
#endif
  };

  if (report) {
    std::printf("# towerflow_bench_allreduce: %s, float32 sum, in place\n", comm.name().c_str());
    if (across) {
      std::printf("# %d participants (%d per process); mpi_us: MPI_Allreduce called directly on one buffer per process\n",
                  n, local);
      std::printf("%12s %10s %10s %10s %10s %10s %9s\n", "bytes", "time_us", "algbw_gbps", "busbw_gbps", "max_err",
                  "mpi_us", "pct_mpi");
    } else {
      std::printf("# bound: %d threads each memcpy S bytes (reads nS, writes nS, as the all-reduce must)\n", n);
      std::printf("%12s %10s %10s %10s %10s %11s %10s %9s\n", "bytes", "time_us", "algbw_gbps",
                  "busbw_gbps", "max_err", "bound_us", "bound_gbps", "pct_bound");
    }
  }
  bool all_ok = true;
  for (std::size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
    const std::size_t count = bytes / sizeof(float);
    auto bufs = make_buffers(local, count);

    // Correctness: participant g holds g + 1 + (j % 7) / 8; the sum is exact in float.
    for (int p = 0; p < local; ++p)
      for (std::size_t j = 0; j < count; ++j) bufs[p][j] = static_cast<float>(first + p + 1) + (j % 7) / 8.f;
    time_on_threads(local, 1, [&](int p, int) { comm.all_reduce_sum(p, bufs[p]); }, processes);
    double max_err = 0;
    for (int p = 0; p < local; ++p)
      for (std::size_t j = 0; j < count; ++j) {
        const double expect = n * (n + 1) / 2.0 + n * ((j % 7) / 8.0);
        max_err = std::max(max_err, std::abs(bufs[p][j] - expect));
      }
    world.all_reduce_sum(std::span<double>(&max_err, 1));  // zero everywhere, or not
    all_ok = all_ok && max_err == 0;

    // Timing, on zeros (repeated sums of data would overflow; the speed does not depend on it).
    // Every process runs the same number of iterations: rank 0's probe decides.
    for (auto& b : bufs) std::fill(b.begin(), b.end(), 0.f);
    auto probe = time_on_threads(local, 3, [&](int p, int) { comm.all_reduce_sum(p, bufs[p]); }, processes);
    double probe_s = median(probe);
    world.broadcast(std::as_writable_bytes(std::span<double>(&probe_s, 1)), 0);
    const int iters = std::clamp(static_cast<int>(seconds_per_size / 2 / std::max(1e-7, probe_s)), 5, 2000);
    double t = median(time_on_threads(local, iters, [&](int p, int) { comm.all_reduce_sum(p, bufs[p]); }, processes));
    world.broadcast(std::as_writable_bytes(std::span<double>(&t, 1)), 0);
    const double algbw = bytes / t / 1e9;
    const double busbw = algbw * (n > 1 ? 2.0 * (n - 1) / n : 1.0);
    if (across) {
      const double mpi = mpi_time(bufs[0], iters);
      if (report) {
        std::printf("%12zu %10.1f %10.2f %10.2f %10.2g %10.1f %8.1f%%\n", bytes, t * 1e6, algbw, busbw, max_err,
                    mpi * 1e6, 100.0 * mpi / t);
        if (json) {
          nlohmann::json row = {{"bench", "allreduce"}, {"devices", n},  {"processes", world.size()},
                                {"devices_per_process", local},       {"bytes", bytes},
                                {"time_us", t * 1e6},  {"algbw_gbps", algbw}, {"busbw_gbps", busbw},
                                {"max_err", max_err},  {"mpi_allreduce_us", mpi * 1e6},
                                {"pct_of_mpi", 100.0 * mpi / t}, {"iters", iters}};
          std::printf("%s\n", row.dump().c_str());
        }
        std::fflush(stdout);
      }
      continue;
    }

    auto dst = make_buffers(n, count);
    time_on_threads(n, 2, [&](int p, int) { std::memcpy(dst[p].data(), bufs[p].data(), bytes); });
    const double bound = median(time_on_threads(n, iters, [&](int p, int) {
      std::memcpy(dst[p].data(), bufs[p].data(), bytes);
    }));

    const double bound_gbps = static_cast<double>(n) * bytes / bound / 1e9;  // bytes copied per s
    const double pct = 100.0 * bound / t;
    std::printf("%12zu %10.1f %10.2f %10.2f %10.2g %11.1f %10.2f %8.1f%%\n", bytes, t * 1e6, algbw,
                busbw, max_err, bound * 1e6, bound_gbps, pct);
    if (json) {
      nlohmann::json row = {{"bench", "allreduce"},   {"devices", n},
                            {"bytes", bytes},         {"time_us", t * 1e6},
                            {"algbw_gbps", algbw},    {"busbw_gbps", busbw},
                            {"max_err", max_err},     {"bound_us", bound * 1e6},
                            {"bound_memcpy_gbps", bound_gbps}, {"pct_of_bound", pct},
                            {"iters", iters}};
      std::printf("%s\n", row.dump().c_str());
    }
    std::fflush(stdout);
  }
  return all_ok ? 0 : 1;
}
