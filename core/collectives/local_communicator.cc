#include "core/collectives/local_communicator.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <array>
#include <chrono>
#include <condition_variable>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/collectives/tower_waits.h"
#include "core/cpu/context.h"
#include "core/log.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define TW_CPU_RELAX() _mm_pause()
#else
#define TW_CPU_RELAX() ((void)0)
#endif

namespace towerflow::collectives {

// Note [Fused shared-memory all-reduce]
// The textbook all-reduce is a reduce-scatter (participant i sums shard i into its own buffer)
// followed by an all-gather (every participant copies every other shard). In one address space
// the all-gather can be folded into the reduce-scatter: the owner of shard i, having summed it,
// writes the sum into every participant's buffer itself. Per element that is n reads and n
// writes, the least any all-reduce can do, against 2n reads and n + (n-1) writes for the two-step
// version. Shards are summed in L1-sized blocks so that each buffer's cache lines are read once
// and written back while still in cache. Every element is summed in the order 0, 1, ..., n-1
// whoever owns it, so the result does not depend on n's sharding and is identical in every buffer.

namespace {

constexpr std::int64_t kBlock = 2048;               // floats per block: 8 KiB per buffer
constexpr std::int64_t kMinParallelChunk = 1 << 15; // floats a context thread gets at least

// A reusable barrier for n threads that spins briefly, then sleeps on a condition variable, and
// can be aborted: an aborted barrier releases every waiter and reports false. Each arrival is
// marked, and the first participant to arrive sleeps with a deadline so that it can say who is
// missing (Note [Stall reports among towers] in tower_waits.cc); the last to arrive takes the lock
// to wake the others only when someone sleeps.
class Barrier {
 public:
  using Clock = std::chrono::steady_clock;
  Barrier(int n, int spin) : n_(n), spin_(spin), arrived_in_(static_cast<std::size_t>(n)) {}

  // Returns false when the barrier was aborted (before or while waiting). The first participant
  // to arrive calls on_long_wait(schedule, arrived) at each of the schedule's times, without the
  // lock; it reports, or aborts the barrier.
  template <class OnLongWait>
  bool arrive_and_wait(int participant, const WaitLimits& limits, OnLongWait&& on_long_wait) {
    const std::uint32_t gen = generation_.load(std::memory_order_acquire);
    if (aborted_.load(std::memory_order_acquire)) return false;
    arrived_in_[participant].store(gen + 1, std::memory_order_relaxed);
    const int before = arrived_.fetch_add(1, std::memory_order_acq_rel);
    if (before == n_ - 1) {
      arrived_.store(0, std::memory_order_relaxed);  // before the release below: no one passes yet
      release();
      return !aborted_.load(std::memory_order_acquire);
    }
    const auto start = before == 0 ? Clock::now() : Clock::time_point{};
    for (int i = 0; i < spin_ && generation_.load(std::memory_order_acquire) == gen; ++i) TW_CPU_RELAX();
    if (generation_.load(std::memory_order_acquire) != gen) return !aborted_.load(std::memory_order_acquire);

    const auto released = [&] { return generation_.load(std::memory_order_seq_cst) != gen; };
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    {
      std::unique_lock lock(mu_);
      if (before != 0) {
        cv_.wait(lock, released);
      } else {
        StallSchedule schedule(limits, start);
        while (!cv_.wait_until(lock, schedule.next(), released)) {
          lock.unlock();
          std::vector<bool> arrived(static_cast<std::size_t>(n_));
          for (int i = 0; i < n_; ++i)
            arrived[i] = arrived_in_[i].load(std::memory_order_relaxed) == gen + 1;
          on_long_wait(schedule, arrived);
          lock.lock();
        }
      }
    }
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
    return !aborted_.load(std::memory_order_acquire);
  }

  void abort() {
    aborted_.store(true, std::memory_order_release);
    release();
  }

  void reset() {
    arrived_.store(0, std::memory_order_relaxed);
    aborted_.store(false, std::memory_order_release);
  }

  bool aborted() const { return aborted_.load(std::memory_order_acquire); }

 private:
  // A sleeper counts itself before it checks the generation, and the releaser bumps the
  // generation before it reads the count (both sequentially consistent): either the releaser
  // sees the sleeper and wakes it under the lock, or the sleeper sees the new generation.
  void release() {
    generation_.fetch_add(1, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard lock(mu_);
      cv_.notify_all();
    }
  }

  const int n_;
  const int spin_;
  std::atomic<int> arrived_{0};
  std::atomic<std::uint32_t> generation_{0};
  std::atomic<bool> aborted_{false};
  std::atomic<int> sleepers_{0};
  std::vector<std::atomic<std::uint32_t>> arrived_in_;  // per participant: the generation + 1 it waits in
  std::mutex mu_;
  std::condition_variable cv_;
};

// The last collectives a participant entered, for the post-mortem (recent_collectives()).
struct Entered {
  std::int64_t seq = 0;
  const char* op = "";  // literals and the thread's context: entering allocates nothing
  std::size_t bytes = 0;
  CollectiveContext context;
  double started_s = 0, waited_s = 0;
  bool done = false;
};
constexpr std::size_t kRecent = 64;

struct Recent {
  std::mutex mu;
  std::array<Entered, kRecent> ring;
  std::int64_t entered = 0;  // collectives entered: the next one is ring[entered % kRecent]
};

// What a participant publishes for the collective in flight.
struct Slot {
  float* data = nullptr;
  const float* send = nullptr;
  std::size_t count = 0;
  std::size_t out_count = 0;
  int root = 0;
  char pad[64 - 2 * sizeof(void*) - 2 * sizeof(std::size_t) - sizeof(int)];  // one line each
};
static_assert(sizeof(Slot) == 64);

// Sums block [b, e) of every buffer in order 0..n-1 and stores the sum into every buffer.
void reduce_block(float* const* bufs, int n, std::int64_t b, std::int64_t e) {
  if (n == 2) {
    float* __restrict x = bufs[0];
    float* __restrict y = bufs[1];
    for (std::int64_t j = b; j < e; ++j) {
      const float s = x[j] + y[j];
      x[j] = s;
      y[j] = s;
    }
    return;
  }
  alignas(64) float acc[kBlock];
  for (std::int64_t s = b; s < e; s += kBlock) {
    const std::int64_t len = std::min(kBlock, e - s);
    {
      const float* __restrict x = bufs[0] + s;
      const float* __restrict y = bufs[1] + s;
      for (std::int64_t j = 0; j < len; ++j) acc[j] = x[j] + y[j];
    }
    for (int k = 2; k < n; ++k) {
      const float* __restrict z = bufs[k] + s;
      for (std::int64_t j = 0; j < len; ++j) acc[j] += z[j];
    }
    for (int k = 0; k < n; ++k) std::memcpy(bufs[k] + s, acc, static_cast<std::size_t>(len) * 4);
  }
}

}  // namespace

struct LocalCommunicator::State {
  State(const std::vector<Device>& d, LocalCommunicatorOptions o)
      : devices(d),
        options(std::move(o)),
        limits(WaitLimits::from_environment()),
        barrier(static_cast<int>(d.size()), options.spin_iterations),
        slots(d.size()),
        recent(d.size()) {
    if (options.stall_warning) limits.stall_warning = *options.stall_warning;
    if (options.timeout) limits.timeout = *options.timeout;
  }
  const std::vector<Device>& devices;
  LocalCommunicatorOptions options;
  WaitLimits limits;
  const std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  Barrier barrier;
  std::vector<Slot> slots;
  std::vector<Recent> recent;
  std::mutex reason_mu;
  std::string reason;

  [[noreturn]] void throw_aborted() {
    std::lock_guard lock(reason_mu);
    raise<CollectiveAborted>("collective aborted: ", reason.empty() ? "another participant failed" : reason);
  }

  void abort(const std::string& why) {
    {
      std::lock_guard lock(reason_mu);
      if (reason.empty()) reason = why;
    }
    barrier.abort();
  }

  double since_start() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  // Participant p enters collective `op` of `bytes`: its entry in the recent collectives.
  void enter(int p, const char* op, std::size_t bytes) {
    Recent& r = recent[p];
    std::lock_guard lock(r.mu);
    r.ring[r.entered % kRecent] = {.seq = r.entered + 1, .op = op, .bytes = bytes, .context = current_context(),
                                   .started_s = since_start()};
    ++r.entered;
  }
  void leave(int p) {
    Recent& r = recent[p];
    std::lock_guard lock(r.mu);
    Entered& e = r.ring[(r.entered - 1) % kRecent];
    e.waited_s = since_start() - e.started_s;
    e.done = true;
  }

  // Every wait of participant p inside its current collective (Note [Stall reports among towers]).
  void wait(int p) {
    const auto on_long_wait = [&](StallSchedule& schedule, const std::vector<bool>& arrived) {
      Entered e;
      {
        std::lock_guard lock(recent[p].mu);
        e = recent[p].ring[(recent[p].entered - 1) % kRecent];
      }
      const std::string what = str(e.op, " #", e.seq, " of the local communicator",
                                   e.bytes > 0 ? str(" (", e.bytes, " bytes)") : std::string());
      const TowerWait wait{.what = what, .context = e.context, .devices = devices, .arrived = arrived};
      const auto now = std::chrono::steady_clock::now();
      if (schedule.timed_out(now)) {
        const std::string why = timeout_reason(wait, schedule.waited_s(now));
        log_error(why);
        abort(why);
      } else {
        log_warning(stall_report(wait, schedule.waited_s(now), limits));
        schedule.reported();
      }
    };
    if (!barrier.arrive_and_wait(p, limits, on_long_wait)) throw_aborted();
  }
};

LocalCommunicator::LocalCommunicator(std::vector<Device> devices, LocalCommunicatorOptions options)
    : devices_(std::move(devices)) {
  if (devices_.empty())
    raise<InvalidArgument>("a communicator needs at least one device; got an empty device list");
  std::set<Device> seen;
  for (const Device& d : devices_) {
    if (!seen.insert(d).second)
      raise<InvalidArgument>("device ", d, " appears twice in the communicator's device list; "
                             "list each logical device once");
  }
  if (!options.contexts.empty() && options.contexts.size() != devices_.size())
    raise<InvalidArgument>("LocalCommunicatorOptions.contexts has ", options.contexts.size(),
                           " entries for ", devices_.size(), " devices; give one per device or none");
  for (const auto& [name, limit] : {std::pair{"stall_warning", options.stall_warning}, std::pair{"timeout", options.timeout}})
    if (limit && limit->count() <= 0)
      raise<InvalidArgument>("LocalCommunicatorOptions.", name, " is ", limit->count(),
                             " ms; give a positive duration, or leave it unset for the environment's or the default");
  state_ = std::make_unique<State>(devices_, std::move(options));
}

LocalCommunicator::~LocalCommunicator() = default;

std::string LocalCommunicator::name() const {
  return str("local shared-memory (", devices_.size(), " CPU participant",
             devices_.size() == 1 ? "" : "s", ")");
}

void LocalCommunicator::abort(const std::string& reason) { state_->abort(reason); }

void LocalCommunicator::reset() {
  std::lock_guard lock(state_->reason_mu);
  state_->reason.clear();
  state_->barrier.reset();
}

void LocalCommunicator::barrier(int participant) {
  TW_CHECK(participant >= 0 && participant < size(), "participant ", participant, " of ", size());
  state_->enter(participant, "barrier", 0);
  state_->wait(participant);
  state_->leave(participant);
}

void LocalCommunicator::all_reduce_sum(int participant, std::span<float> data) {
  const int n = size();
  TW_CHECK(participant >= 0 && participant < n, "participant ", participant, " of ", n);
  State& st = *state_;
  if (st.barrier.aborted()) st.throw_aborted();
  st.enter(participant, "all-reduce", data.size_bytes());
  st.slots[participant].data = data.data();
  st.slots[participant].count = data.size();
  st.wait(participant);
  // Every participant sees every slot now; all make the same decision about mismatches.
  for (int i = 0; i < n; ++i) {
    if (st.slots[i].count != data.size())
      raise<InvalidArgument>("all_reduce_sum: participant ", i, " (", devices_[i], ") passed ",
                             st.slots[i].count, " floats but participant ", participant, " (",
                             devices_[participant], ") passed ", data.size(),
                             "; every participant must reduce buffers of the same size");
  }
  float* bufs[64];
  std::vector<float*> many;
  float** b = bufs;
  if (n > 64) {
    many.resize(n);
    b = many.data();
  }
  for (int i = 0; i < n; ++i) b[i] = st.slots[i].data;

  if (n > 1 && !data.empty()) {
    const std::int64_t count = static_cast<std::int64_t>(data.size());
    // Shards are multiples of 16 floats (64 bytes) so that no cache line is written by two owners.
    const std::int64_t lines = (count + 15) / 16;
    const std::int64_t begin = std::min(count, lines * participant / n * 16);
    const std::int64_t end = std::min(count, lines * (participant + 1) / n * 16);
    const cpu::CpuContext* ctx =
        st.options.contexts.empty() ? nullptr : st.options.contexts[participant];
    if (ctx && ctx->threads() > 1 && end - begin >= 2 * kMinParallelChunk) {
      ctx->parallel_for((end - begin + 15) / 16, kMinParallelChunk / 16,
                        [&](std::int64_t lb, std::int64_t le) {
                          reduce_block(b, n, begin + lb * 16, std::min(end, begin + le * 16));
                        });
    } else if (begin < end) {
      reduce_block(b, n, begin, end);
    }
  }
  st.wait(participant);
  st.leave(participant);
}

void LocalCommunicator::broadcast(int participant, std::span<float> data, int root) {
  const int n = size();
  TW_CHECK(participant >= 0 && participant < n, "participant ", participant, " of ", n);
  State& st = *state_;
  if (st.barrier.aborted()) st.throw_aborted();
  st.slots[participant].data = data.data();
  st.slots[participant].count = data.size();
  st.slots[participant].root = root;
  st.enter(participant, "broadcast", data.size_bytes());
  st.wait(participant);
  if (root < 0 || root >= n)
    raise<InvalidArgument>("broadcast root ", root, " is not a participant; use 0..", n - 1);
  for (int i = 0; i < n; ++i) {
    if (st.slots[i].count != data.size() || st.slots[i].root != root)
      raise<InvalidArgument>("broadcast: participant ", i, " (", devices_[i], ") passed ",
                             st.slots[i].count, " floats from root ", st.slots[i].root,
                             " but participant ", participant, " passed ", data.size(),
                             " floats from root ", root, "; every participant must agree");
  }
  if (participant != root && !data.empty())
    std::memcpy(data.data(), st.slots[root].data, data.size() * sizeof(float));
  st.wait(participant);
  st.leave(participant);
}

void LocalCommunicator::all_gather(int participant, std::span<const float> send,
                                   std::span<float> out) {
  const int n = size();
  TW_CHECK(participant >= 0 && participant < n, "participant ", participant, " of ", n);
  State& st = *state_;
  if (st.barrier.aborted()) st.throw_aborted();
  st.slots[participant].send = send.data();
  st.slots[participant].count = send.size();
  st.slots[participant].out_count = out.size();
  st.enter(participant, "all-gather", send.size_bytes());
  st.wait(participant);
  // Checked after the entry barrier, on every participant alike, so that no one is left waiting.
  for (int i = 0; i < n; ++i) {
    if (st.slots[i].out_count != st.slots[i].count * static_cast<std::size_t>(n))
      raise<InvalidArgument>("all_gather: participant ", i, " (", devices_[i], ") has an output of ",
                             st.slots[i].out_count, " floats but ", n, " participants sending ",
                             st.slots[i].count, " each need ",
                             st.slots[i].count * static_cast<std::size_t>(n));
  }
  for (int i = 0; i < n; ++i) {
    if (st.slots[i].count != send.size())
      raise<InvalidArgument>("all_gather: participant ", i, " (", devices_[i], ") sends ",
                             st.slots[i].count, " floats but participant ", participant,
                             " sends ", send.size(), "; every participant must send the same count");
  }
  for (int i = 0; i < n && !send.empty(); ++i)
    std::memcpy(out.data() + static_cast<std::size_t>(i) * send.size(), st.slots[i].send,
                send.size() * sizeof(float));
  st.wait(participant);
  st.leave(participant);
}

std::string LocalCommunicator::recent_collectives() const {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (int p = 0; p < size(); ++p) {
    Recent& r = state_->recent[p];
    nlohmann::ordered_json entries = nlohmann::ordered_json::array();
    std::lock_guard lock(r.mu);
    for (std::int64_t k = std::max<std::int64_t>(0, r.entered - static_cast<std::int64_t>(kRecent)); k < r.entered; ++k) {
      const Entered& e = r.ring[k % kRecent];
      nlohmann::ordered_json entry = {{"seq", e.seq}, {"op", e.op}, {"bytes", e.bytes}};
      if (e.context.step > 0) entry["step"] = e.context.step;
      if (e.context.purpose) entry["purpose"] = describe({.purpose = e.context.purpose, .index = e.context.index});
      entry.update({{"started_s", e.started_s}, {"waited_s", e.waited_s}, {"done", e.done}});
      entries.push_back(std::move(entry));
    }
    out.push_back({{"participant", p}, {"device", str(devices_[p])}, {"recent", std::move(entries)}});
  }
  return out.dump();
}

}  // namespace towerflow::collectives
