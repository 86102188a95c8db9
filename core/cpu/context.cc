#include "core/cpu/context.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "core/error.h"

namespace towerflow::cpu {

// Note [Waking the workers]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// A training step is hundreds of parallel loops, most of them well under a millisecond (a
// batch-norm pass over 2 MiB, a 1 MiB fill, a pooling). What a loop costs beyond its work is
// the time its workers take to start. A worker that sleeps in the kernel (a futex, as a
// condition variable or Eigen's ThreadPool park it) needs a wake-up, and on a virtual machine
// an idle vCPU is halted: waking it took 70-90 us on a 2-core KVM guest (Sapphire Rapids-class
// Xeon), longer than the loop. Eigen's pool spins about 5,000 polls (a few microseconds) before
// it parks, so nearly every loop paid that wake-up: a parallel_for with no work cost 30-90 us,
// one over 1 MiB 80-250 us against 18 us on the calling thread alone.
//
// So each worker, after its chunk, waits for the next loop by polling its own ticket for
// kWorkerSpin, yielding the core as it polls so that other runnable threads (the data loader)
// still get it, and only then sleeps on the ticket (std::atomic::wait). The loops of a step
// follow each other within microseconds and find their workers awake; a worker idle for
// longer, between steps or while the caller does serial work, sleeps and costs nothing. The
// caller waits for the workers' chunks the same way, for kCallerSpin before it sleeps.
//
// Polling pays only while every context's threads have a core each. When the contexts of a
// process ask for more threads than the machine has (two towers of two threads on two cores), a
// polling thread takes time from another context's thread that has work, so workers and callers
// then sleep as soon as they have nothing to do.
//
// A sleeper and its waker meet Dekker-style: the sleeper sets its flag, then reads the ticket
// (inside wait); the waker bumps the ticket, then reads the flag; both sequentially consistent,
// so at least one of them sees the other's write and no wake-up is lost.
//
// Chunk c of a loop always runs [c n / chunks, (c + 1) n / chunks), on worker c (the caller is
// chunk 0): which thread runs which chunk, and so every result, depends only on the thread count.

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kWorkerSpin = std::chrono::microseconds(300);
constexpr auto kCallerSpin = std::chrono::milliseconds(2);

// The threads of every live context in this process, against the cores.
std::atomic<int> g_context_threads{0};

// How long to poll before sleeping: `spin` while the threads have a core each, else not at all.
Clock::duration poll_for(Clock::duration spin) {
  static const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return g_context_threads.load(std::memory_order_relaxed) <= cores ? spin : Clock::duration::zero();
}

inline void relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// Polls until ready() holds or `spin` has passed, yielding the core between polls after the
// first few microseconds. True when ready() held.
template <typename Ready>
bool spin_until(Ready ready, Clock::duration spin) {
  const Clock::time_point start = Clock::now();
  for (int polls = 0;; ++polls) {
    if (ready()) return true;
    if (polls % 64 == 63) {
      const Clock::duration waited = Clock::now() - start;
      if (waited > spin) return false;
      if (waited > std::chrono::microseconds(20)) std::this_thread::yield();
    }
    relax();
  }
}

}  // namespace

struct CpuContext::Impl {
  using Chunk = std::function<void(std::int64_t)>;

  struct alignas(64) Worker {
    std::atomic<std::uint32_t> ticket{0};  // bumped for each loop this worker has a chunk of
    std::atomic<bool> sleeping{false};
    std::thread thread;
  };

  explicit Impl(int workers) : workers_(static_cast<std::size_t>(workers)) {
    g_context_threads.fetch_add(workers + 1);
    for (std::size_t i = 0; i < workers_.size(); ++i)
      workers_[i].thread = std::thread([this, i] { work(i); });
  }

  ~Impl() {
    stopping_.store(true);
    for (Worker& w : workers_) {
      w.ticket.fetch_add(1);
      w.ticket.notify_one();
    }
    for (Worker& w : workers_) w.thread.join();
    g_context_threads.fetch_sub(static_cast<int>(workers_.size()) + 1);
  }

  // Runs chunk(0) here and chunk(c) on worker c - 1 for c in [1, chunks); returns when all have.
  void run(std::int64_t chunks, const Chunk& chunk) {
    const std::lock_guard lock(mu_);
    job_ = &chunk;
    pending_.store(static_cast<std::uint32_t>(chunks - 1));
    for (std::int64_t c = 1; c < chunks; ++c) {
      Worker& w = workers_[static_cast<std::size_t>(c - 1)];
      w.ticket.fetch_add(1);
      if (w.sleeping.load()) w.ticket.notify_one();
    }
    const Impl* const outer = running_here;  // a worker of another context calling in
    running_here = this;
    chunk(0);
    if (!spin_until([&] { return pending_.load(std::memory_order_acquire) == 0; },
                    poll_for(kCallerSpin))) {
      caller_sleeping_.store(true);
      for (std::uint32_t left = pending_.load(); left != 0; left = pending_.load())
        pending_.wait(left);
      caller_sleeping_.store(false);
    }
    running_here = outer;
  }

  bool running_on_this_thread() const { return running_here == this; }

 private:
  void work(std::size_t index) {
    running_here = this;
    Worker& w = workers_[index];
    std::uint32_t seen = 0;
    for (;;) {
      if (!spin_until([&] { return w.ticket.load(std::memory_order_acquire) != seen; },
                      poll_for(kWorkerSpin))) {
        w.sleeping.store(true);
        w.ticket.wait(seen);
        w.sleeping.store(false);
      }
      seen = w.ticket.load(std::memory_order_acquire);
      if (stopping_.load()) return;
      (*job_)(static_cast<std::int64_t>(index) + 1);
      if (pending_.fetch_sub(1) == 1 && caller_sleeping_.load()) pending_.notify_one();
    }
  }

  static thread_local const Impl* running_here;  // the context whose loop this thread runs

  std::vector<Worker> workers_;
  std::mutex mu_;  // one loop at a time, whatever the callers
  const Chunk* job_ = nullptr;
  std::atomic<std::uint32_t> pending_{0};  // workers' chunks of the current loop not yet done
  std::atomic<bool> caller_sleeping_{false};
  std::atomic<bool> stopping_{false};
};

thread_local const CpuContext::Impl* CpuContext::Impl::running_here = nullptr;

CpuContext::CpuContext(int threads) : threads_(std::max(1, threads)) {
  impl_ = std::make_unique<Impl>(threads_ - 1);
}

CpuContext::~CpuContext() = default;

void CpuContext::parallel_for(std::int64_t n, std::int64_t min_chunk,
                              const std::function<void(std::int64_t, std::int64_t)>& fn) const {
  if (n <= 0) return;
  min_chunk = std::max<std::int64_t>(1, min_chunk);
  const std::int64_t chunks = std::min<std::int64_t>(threads_, n / min_chunk);
  if (chunks <= 1 || impl_->running_on_this_thread()) {
    fn(0, n);
    return;
  }
  std::exception_ptr first_error;
  std::mutex error_mu;
  impl_->run(chunks, [&](std::int64_t c) {
    const std::int64_t begin = c * n / chunks, end = (c + 1) * n / chunks;  // each >= min_chunk
    try {
      if (begin < end) fn(begin, end);
    } catch (...) {
      const std::lock_guard lock(error_mu);
      if (!first_error) first_error = std::current_exception();
    }
  });
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace towerflow::cpu
