#include "tower/batch_norm_sync.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <utility>

#include "core/collectives/process_group.h"
#include "core/collectives/tower_waits.h"
#include "core/error.h"
#include "core/log.h"

namespace towerflow::tower {

// The exchange is a handful of doubles per batch-norm layer, a few dozen times per step: a
// mutex and a condition variable are ample, and sleeping waiters leave the cores to the towers
// still computing. Each all_gather is two barrier phases: after the first every member's send is
// published, after the second everyone has copied it, so a send buffer may be reused at once.

struct BatchNormSyncGroup::State {
  State(std::vector<Device> d, collectives::ProcessGroup* p)
      : devices(std::move(d)),
        processes(p),
        limits(collectives::WaitLimits::from_environment()),
        sends(devices.size()),
        arrived_in(devices.size(), 0),
        exchanges(devices.size(), 0),
        waited(devices.size(), 0.0) {}

  std::vector<Device> devices;
  collectives::ProcessGroup* processes;  // null: this process's towers only
  collectives::WaitLimits limits;        // Note [Stall reports among towers] in core/collectives/tower_waits.cc
  std::vector<double> block, gathered;   // member 0's exchange across processes
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  std::uint64_t generation = 0;
  bool open = false;
  bool aborted = false;
  std::string reason;
  std::vector<std::span<const double>> sends;
  std::vector<std::uint64_t> arrived_in;  // per member: the generation + 1 it waits in
  std::vector<std::int64_t> exchanges;    // per member: all_gather calls so far
  std::vector<double> waited;             // per member: seconds spent waiting for the others

  [[noreturn]] void throw_aborted() const {
    raise<collectives::CollectiveAborted>(
        "synchronised batch norm aborted: ", reason.empty() ? "another tower failed" : reason);
  }

  // Returns when every member has arrived (the last one to arrive releases the others). The first
  // to arrive reports a stall and, at the timeout, aborts the exchange naming the absent members.
  void wait(std::unique_lock<std::mutex>& lock, int rank) {
    if (aborted) throw_aborted();
    const std::uint64_t gen = generation;
    arrived_in[rank] = gen + 1;
    if (++arrived == static_cast<int>(devices.size())) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    const auto released = [&] { return aborted || generation != gen; };
    const auto start = collectives::StallSchedule::Clock::now();
    struct Waited {  // counted however the wait ends
      double& total;
      collectives::StallSchedule::Clock::time_point start;
      ~Waited() { total += std::chrono::duration<double>(collectives::StallSchedule::Clock::now() - start).count(); }
    } count_wait{waited[rank], start};
    if (arrived > 1) {
      cv.wait(lock, released);
    } else {
      collectives::StallSchedule schedule(limits, start);
      while (!cv.wait_until(lock, schedule.next(), released)) {
        std::vector<bool> here(devices.size());
        for (std::size_t i = 0; i < devices.size(); ++i) here[i] = arrived_in[i] == gen + 1;
        const std::string what = str("synchronised batch norm's exchange #", exchanges[rank]);
        const collectives::TowerWait wait{.what = what, .context = collectives::current_context(),
                                          .devices = devices, .arrived = here};
        const auto now = collectives::StallSchedule::Clock::now();
        if (schedule.timed_out(now)) {
          reason = collectives::timeout_reason(wait, schedule.waited_s(now));
          aborted = true;
          cv.notify_all();
          log_error(reason);
        } else {
          log_warning(collectives::stall_report(wait, schedule.waited_s(now), limits));
          schedule.reported();
        }
      }
    }
    if (aborted) throw_aborted();
  }

  int processes_size() const { return processes ? processes->size() : 1; }
  int first_member() const { return processes ? processes->rank() * static_cast<int>(devices.size()) : 0; }

  void all_gather(int rank, std::span<const double> send, std::span<double> out) {
    const std::size_t n = devices.size();
    const int p = processes_size();
    if (out.size() != n * static_cast<std::size_t>(p) * send.size())
      raise<InvalidArgument>("synchronised batch norm: member ", rank, " (", devices[rank],
                             ") has an output of ", out.size(), " values for ", n * p, " members of ",
                             send.size());
    std::unique_lock lock(mu);
    if (aborted) throw_aborted();
    if (!open)
      raise<InvalidArgument>("synchronised batch norm on ", devices[rank],
                             " ran outside a training step of its tower::Trainer: its towers "
                             "exchange statistics only inside forward_backward; put the replica "
                             "in eval mode to run it alone");
    sends[rank] = send;
    ++exchanges[rank];
    wait(lock, rank);
    for (std::size_t i = 0; i < n; ++i)  // the same decision on every member
      if (sends[i].size() != send.size())
        raise<InvalidArgument>("synchronised batch norm: member ", i, " (", devices[i], ") sent ",
                               sends[i].size(), " values but member ", rank, " (", devices[rank],
                               ") sent ", send.size(), "; the replicas' layers differ");
    if (p == 1) {
      for (std::size_t i = 0; i < n; ++i)
        std::copy(sends[i].begin(), sends[i].end(), out.begin() + static_cast<std::ptrdiff_t>(i * send.size()));
      wait(lock, rank);
      return;
    }
    // Across processes: member 0 sends this process's vectors and receives every process's;
    // the others copy the result once it is there (the next call's first wait keeps it intact
    // until every member has copied it).
    if (rank == 0) {
      block.clear();
      for (std::size_t i = 0; i < n; ++i) block.insert(block.end(), sends[i].begin(), sends[i].end());
      gathered.resize(block.size() * static_cast<std::size_t>(p));
      lock.unlock();
      try {
        processes->all_gather(std::as_bytes(std::span<const double>(block)),
                              std::as_writable_bytes(std::span<double>(gathered)));
      } catch (const std::exception& e) {
        lock.lock();
        if (!aborted) reason = e.what();
        aborted = true;
        cv.notify_all();
        throw;
      }
      lock.lock();
    }
    wait(lock, rank);
    std::copy(gathered.begin(), gathered.end(), out.begin());
  }
};

class BatchNormSyncGroup::Member final : public BatchNormSync {
 public:
  Member(State& state, int rank) : state_(state), rank_(rank) {}
  int size() const override { return static_cast<int>(state_.devices.size()) * state_.processes_size(); }
  int rank() const override { return state_.first_member() + rank_; }
  void all_gather(std::span<const double> send, std::span<double> out) override {
    state_.all_gather(rank_, send, out);
  }

 private:
  State& state_;
  int rank_;
};

BatchNormSyncGroup::BatchNormSyncGroup(std::vector<Device> devices, collectives::ProcessGroup* processes)
    : state_(std::make_unique<State>(std::move(devices), processes)) {
  if (state_->devices.empty())
    raise<InvalidArgument>("synchronised batch norm needs at least one device; the list is empty");
  for (int i = 0; i < size(); ++i) members_.push_back(std::make_unique<Member>(*state_, i));
}

BatchNormSyncGroup::~BatchNormSyncGroup() = default;

double BatchNormSyncGroup::take_waited(int member) {
  std::lock_guard lock(state_->mu);
  return std::exchange(state_->waited.at(static_cast<std::size_t>(member)), 0.0);
}

int BatchNormSyncGroup::size() const { return static_cast<int>(state_->devices.size()); }

BatchNormSync& BatchNormSyncGroup::member(int i) {
  TW_CHECK(i >= 0 && i < size(), "member ", i, " of ", size());
  return *members_[i];
}

void BatchNormSyncGroup::open() {
  std::lock_guard lock(state_->mu);
  state_->open = true;
}

void BatchNormSyncGroup::close() {
  std::lock_guard lock(state_->mu);
  state_->open = false;
}

void BatchNormSyncGroup::abort(const std::string& reason) {
  {
    std::lock_guard lock(state_->mu);
    if (!state_->aborted) state_->reason = reason;
    state_->aborted = true;
  }
  state_->cv.notify_all();
}

void BatchNormSyncGroup::reset() {
  std::lock_guard lock(state_->mu);
  state_->aborted = false;
  state_->reason.clear();
  state_->arrived = 0;
}

}  // namespace towerflow::tower
