// NcclRanks: the NCCL communicator's logic, free of CUDA (the calls go through NcclBackend).
//
// Note [Waiting without hanging]
// NCCL's documentation fixes the rules this file follows ("Creating a communicator with options",
// "Error handling and communicator abort", "Asynchronous errors and error handling", "Fault
// Tolerance", "Thread Safety"):
// - Communicators are created non-blocking (ncclConfig_t::blocking = 0): NCCL calls then return
//   ncclInProgress instead of blocking, and ncclCommGetAsyncError says when the call is done.
//   "All NCCL calls can be non-blocking to ensure ncclCommAbort can be called at any point,
//   during initialization, communication or when finalizing the communicator" (Fault
//   Tolerance). So abort() calls the backend's abort(p) from its own thread, even while the
//   rank's thread is inside a call, and never waits for a lock that such a thread holds.
// - "Operations experiencing an asynchronous error will usually not progress and never
//   complete ... When waiting for NCCL operations to complete, applications should call
//   ncclCommGetAsyncError and destroy the communicator when an error happens" (Asynchronous
//   errors). So no wait here blocks in CUDA or NCCL: wait() polls the completion, the rank's
//   asynchronous error, abort(), the process group's failure notes and a deadline, sleeping
//   20 us doubling to 1 ms between polls (a core is not spun per tower, and a finished
//   collective is noticed within a millisecond).
// - A communicator is used by one thread at a time (Thread Safety): rank p's calls come from
//   participant p's thread. abort(p) is the one call made from another thread, and after it no
//   call on rank p starts: each call enters the rank (Rank::users, under Rank::mu) and a closed
//   rank cannot be entered. A rank that no thread is inside is aborted at once; one with a call
//   in flight is aborted by that thread as it leaves the call, or, if the call has not returned
//   within kAbortGrace (it is blocked inside NCCL, waiting for a peer), by abort() itself, as
//   NCCL allows for non-blocking communicators. Rank::mu is held only to count and to abort.
// - An error that is fatal for one rank is fatal for the clique (error table, note 5/6): any
//   failure aborts every rank of this process, so the participants waiting for the failed one
//   are released, and raise CollectiveAborted with the first failure's reason.
// - Finalize is collective: the destructor finalizes every rank in one group (the backend) and
//   polls each until it is done, then destroys them (a local operation once finalized); a broken
//   clique is aborted instead.
// Launches and device frees: Note [Device frees and NCCL launches] in
// core/memory/device_free_lock.h. No lock is held across a launch.
#include "core/collectives/nccl_ranks.h"

#include <algorithm>
#include <thread>

#include "core/collectives/process_group.h"
#include "core/log.h"
#include "core/memory/device_free_lock.h"

namespace towerflow::collectives {

namespace {

using Clock = std::chrono::steady_clock;

// How long abort() lets a call in flight return before it aborts the rank under it.
constexpr auto kAbortGrace = std::chrono::milliseconds(100);

double seconds(std::chrono::milliseconds t) { return static_cast<double>(t.count()) / 1000.0; }

}  // namespace

// One participant's share of a round announced to device_free_lock() by rendezvous().
class NcclRanks::LaunchTicket {
 public:
  LaunchTicket() = default;
  LaunchTicket(const LaunchTicket&) = delete;
  LaunchTicket& operator=(const LaunchTicket&) = delete;
  ~LaunchTicket() { done(); }
  void done() {
    if (!done_) device_free_lock().launch_done();
    done_ = true;
  }

 private:
  bool done_ = false;
};

NcclRanks::NcclRanks(std::vector<Device> devices, std::unique_ptr<NcclBackend> backend,
                     ProcessGroup* processes, NcclRanksOptions options)
    : devices_(std::move(devices)), backend_(std::move(backend)), processes_(processes),
      options_(options) {
  const int n = static_cast<int>(devices_.size());
  if (n == 0) raise<InvalidArgument>("a communicator needs at least one device; got an empty device list");
  if (backend_->ranks() != n)
    raise<InternalError>("NCCL backend has ", backend_->ranks(), " ranks for ", n, " devices");
  if (options_.timeout <= std::chrono::milliseconds(0))
    raise<InvalidArgument>("NCCL communicator timeout ", options_.timeout.count(),
                           " ms is not positive; use a deadline above 0 (default: 5 minutes)");
  ranks_ = std::make_unique<Rank[]>(n);
  queued_.assign(n, 0);
  posted_.resize(n);
  first_rank_ = across() ? processes_->rank() * n : 0;
  init_ranks();
}

NcclRanks::~NcclRanks() {
  const int n = size();
  bool broken = false;
  for (int p = 0; p < n; ++p) {
    std::lock_guard l(ranks_[p].mu);
    broken = broken || ranks_[p].closed;
  }
  if (!broken) {
    try {
      const NcclState s = backend_->finalize_all();
      if (!s.ok() && s.code != NcclState::kInProgress)
        fail(0, str("ncclCommFinalize failed: ", s.error), false);
      for (int p = 0; p < n; ++p)
        wait(p, "ncclCommFinalize", [&] { return backend_->async_error(p); });
      for (int p = 0; p < n; ++p) backend_->destroy(p);
      return;
    } catch (const std::exception& e) {
      log_warning(str("finalizing the NCCL communicators failed (", e.what(), "); aborted them instead"));
    }
  }
  abort_ranks();  // a broken clique cannot finalize: its peers are gone
}

bool NcclRanks::across() const { return processes_ != nullptr && processes_->size() > 1; }
int NcclRanks::total_ranks() const { return across() ? size() * processes_->size() : size(); }

std::chrono::milliseconds NcclRanks::timeout() const {
  return across() ? processes_->timeout() : options_.timeout;
}

std::string NcclRanks::name() const {
  return str(backend_->version(), " (", size(),
             across() ? str(" GPUs in each of ", processes_->size(), " processes)") : std::string(" GPUs)"));
}

void NcclRanks::init_ranks() {
  std::vector<std::byte> id;
  if (!across() || processes_->rank() == 0) id = backend_->unique_id();
  if (across()) {
    std::uint64_t bytes = id.size();
    processes_->broadcast(std::as_writable_bytes(std::span<std::uint64_t>(&bytes, 1)), 0);
    id.resize(bytes);
    processes_->broadcast(id, 0);
  }
  for (int p = 0; p < size(); ++p) {
    Rank& r = ranks_[p];
    std::lock_guard l(r.mu);
    r.users = 0;
    r.closed = r.abort_pending = r.abort_issued = false;
  }
  const NcclState s = backend_->init(id, total_ranks(), first_rank_);
  if (s.code == NcclState::kError)
    fail(0, str("ncclCommInitRankConfig failed: ", s.error), false);
  for (int p = 0; p < size(); ++p)
    wait(p, "ncclCommInitRankConfig", [&] { return backend_->async_error(p); });
}

void NcclRanks::check_participant(int p) const {
  if (p < 0 || p >= size())
    raise<InvalidArgument>("participant ", p, " does not exist; this NCCL communicator has ", size(),
                           " (0..", size() - 1, ")");
}

bool NcclRanks::enter(int p) {
  std::lock_guard l(ranks_[p].mu);
  if (ranks_[p].closed) return false;
  ++ranks_[p].users;
  return true;
}

void NcclRanks::leave(int p) {
  Rank& r = ranks_[p];
  std::lock_guard l(r.mu);
  --r.users;
  if (r.users == 0 && r.abort_pending && !r.abort_issued) abort_rank_locked(p);
}

void NcclRanks::abort_rank_locked(int p) {
  ranks_[p].abort_issued = true;
  ranks_[p].abort_pending = false;
  backend_->abort(p);
}

void NcclRanks::abort_ranks() {
  // Note [Waiting without hanging]: close every rank; abort the idle ones now, and give a call
  // in flight kAbortGrace to return before aborting under it.
  std::vector<int> in_flight;
  for (int p = 0; p < size(); ++p) {
    Rank& r = ranks_[p];
    std::lock_guard l(r.mu);
    if (r.closed && (r.abort_issued || r.abort_pending)) continue;
    r.closed = true;
    if (r.users == 0)
      abort_rank_locked(p);
    else
      r.abort_pending = true, in_flight.push_back(p);
  }
  const auto give_up = Clock::now() + kAbortGrace;
  for (int p : in_flight) {
    for (;;) {
      bool mine = false;
      {
        std::lock_guard l(ranks_[p].mu);
        if (ranks_[p].abort_issued) break;  // the call returned and its leave() aborted
        if (Clock::now() >= give_up) {
          ranks_[p].abort_issued = true;
          ranks_[p].abort_pending = false;
          mine = true;
        }
      }
      if (mine) {
        // Blocked inside NCCL: abort under the call, as a non-blocking communicator allows; outside
        // Rank::mu, so the call may return and leave() meanwhile.
        backend_->abort(p);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
}

[[noreturn]] void NcclRanks::throw_aborted() {
  std::lock_guard lock(mu_);
  raise<CollectiveAborted>("collective aborted: ", reason_.empty() ? "another participant failed" : reason_);
}

[[noreturn]] void NcclRanks::fail(int p, const std::string& cause, bool peer_failed) {
  const std::string where =
      across() ? str("NCCL rank ", first_rank_ + p, " of ", total_ranks(), " (process ", processes_->rank(),
                     ", ", devices_[p], ")")
               : str("NCCL rank ", p, " (", devices_[p], ")");
  const std::string reason = str(where, ": ", cause);
  {
    std::lock_guard lock(mu_);
    if (reason_.empty()) reason_ = reason;
    aborted_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
  abort_ranks();
  if (peer_failed) raise<PeerFailed>(reason);
  raise<CollectiveAborted>(reason);
}

template <typename Poll>
void NcclRanks::wait(int p, const char* what, Poll poll) {
  const auto start = Clock::now();
  auto pause = std::chrono::microseconds(20);
  for (;;) {
    if (aborted_.load(std::memory_order_acquire)) throw_aborted();
    if (!enter(p)) throw_aborted();
    const NcclState s = poll();
    const NcclState async = s.code == NcclState::kInProgress ? backend_->async_error(p) : NcclState{};
    leave(p);
    if (s.ok()) return;
    // An error from a rank aborted meanwhile is the abort's doing: report the abort's reason.
    if (aborted_.load(std::memory_order_acquire)) throw_aborted();
    if (s.code == NcclState::kError) fail(p, str(what, " failed: ", s.error), false);
    if (async.code == NcclState::kError)
      fail(p, str("NCCL reported an asynchronous error during ", what, ": ", async.error), false);
    if (across()) {
      try {
        processes_->check_peers();
      } catch (const std::exception& e) {
        fail(p, e.what(), true);
      }
    }
    if (Clock::now() - start > timeout()) {
      if (across())
        fail(p, str(what, " across processes did not complete within ", seconds(timeout()),
                    " s (the process group's timeout): another rank died, hangs or is far behind"),
             true);
      fail(p, str(what, " did not complete within ", seconds(timeout()),
                  " s: a GPU or a peer rank hangs (set TOWERFLOW_COLLECTIVE_TIMEOUT, in seconds, to wait longer)"),
           false);
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

template <typename Launch>
void NcclRanks::launch(int p, LaunchTicket& ticket, const char* what, Launch launch_fn) {
  // Note [Device frees and NCCL launches]: not while a free that began before this round runs.
  const auto start = Clock::now();
  while (!device_free_lock().wait_launch_allowed_for(std::chrono::milliseconds(1))) {
    if (aborted_.load(std::memory_order_acquire)) throw_aborted();
    if (Clock::now() - start > timeout())
      fail(p, str(what, " could not start within ", seconds(timeout()), " s: a device free did not return"),
           across());
  }
  if (aborted_.load(std::memory_order_acquire) || !enter(p)) throw_aborted();
  const NcclState s = launch_fn();  // may wait for peers (a first collective): no lock is held
  leave(p);
  if (!s.ok() && aborted_.load(std::memory_order_acquire)) throw_aborted();  // released by abort()
  if (s.code == NcclState::kError) fail(p, str(what, " failed: ", s.error), false);
  if (s.code == NcclState::kInProgress) wait(p, what, [&] { return backend_->async_error(p); });
  ticket.done();
  if (!enter(p)) throw_aborted();
  const NcclState r = backend_->record_done(p);
  leave(p);
  if (!r.ok() && aborted_.load(std::memory_order_acquire)) throw_aborted();
  if (!r.ok()) fail(p, str("recording the end of ", what, " failed: ", r.error), false);
  ++queued_[p];
}

std::vector<NcclRanks::Call> NcclRanks::rendezvous(int p, Call call) {
  std::unique_lock lock(mu_);
  if (aborted_.load(std::memory_order_acquire)) {
    lock.unlock();
    throw_aborted();
  }
  const std::uint64_t g = generation_;
  posted_[p] = call;
  if (++arrived_ == size()) {
    round_ = posted_;
    arrived_ = 0;
    ++generation_;
    device_free_lock().launches_begin(size());  // never blocks; each participant's ticket settles one
    cv_.notify_all();
  } else {
    cv_.wait(lock, [&] { return generation_ != g || aborted_.load(std::memory_order_acquire); });
    if (generation_ == g) {
      lock.unlock();
      throw_aborted();
    }
  }
  return round_;  // not overwritten before every participant of this round has read it
}

void NcclRanks::all_reduce_sum(int p, std::span<float> data) { all_reduce_sum_after(p, data, nullptr); }

void NcclRanks::all_reduce_sum_after(int p, std::span<float> data, const QueueEvent* ready) {
  all_reduce_sum_queued(p, data, ready);
  wait_queued(p);
}

void NcclRanks::all_reduce_sum_queued(int p, std::span<float> data, const QueueEvent* ready) {
  check_participant(p);
  const std::vector<Call> calls = rendezvous(p, {.count = data.size()});
  LaunchTicket ticket;  // this participant's launch, announced by rendezvous()
  for (int i = 0; i < size(); ++i)
    if (calls[i].count != data.size())
      raise<InvalidArgument>("all_reduce_sum: participant ", i, " (", devices_[i], ") sums ", calls[i].count,
                             " floats but participant ", p, " (", devices_[p], ") sums ", data.size(),
                             "; every participant must pass the same count");
  launch(p, ticket, "ncclAllReduce", [&] { return backend_->all_reduce(p, data, ready); });
}

void NcclRanks::wait_queued(int p) {
  check_participant(p);
  if (queued_[p] == 0) return;
  queued_[p] = 0;  // waited for now, or aborted with every rank if the wait fails
  wait(p, "an NCCL collective", [&] { return backend_->query_done(p); });
}

void NcclRanks::broadcast(int p, std::span<float> data, int root) {
  check_participant(p);
  const int total = total_ranks();
  if (root < 0 || root >= total)
    raise<InvalidArgument>("broadcast root ", root, " is not a participant; use 0..", total - 1);
  const std::vector<Call> calls = rendezvous(p, {.count = data.size(), .root = root});
  LaunchTicket ticket;
  for (int i = 0; i < size(); ++i)
    if (calls[i].count != data.size() || calls[i].root != root)
      raise<InvalidArgument>("broadcast: participant ", i, " (", devices_[i], ") expects ", calls[i].count,
                             " floats from root ", calls[i].root, " but participant ", p, " (", devices_[p],
                             ") expects ", data.size(), " from root ", root,
                             "; every participant must pass the same count and root");
  launch(p, ticket, "ncclBroadcast", [&] { return backend_->broadcast(p, data, root); });
  wait_queued(p);
}

void NcclRanks::all_gather(int p, std::span<const float> send, std::span<float> out) {
  check_participant(p);
  const std::size_t total = static_cast<std::size_t>(total_ranks());
  if (out.size() != send.size() * total)
    raise<InvalidArgument>("all_gather: the output holds ", out.size(), " floats but ", total,
                           " participants sending ", send.size(), " each need ", send.size() * total);
  const std::vector<Call> calls = rendezvous(p, {.count = send.size()});
  LaunchTicket ticket;
  for (int i = 0; i < size(); ++i)
    if (calls[i].count != send.size())
      raise<InvalidArgument>("all_gather: participant ", i, " (", devices_[i], ") sends ", calls[i].count,
                             " floats but participant ", p, " (", devices_[p], ") sends ", send.size(),
                             "; every participant must send the same count");
  launch(p, ticket, "ncclAllGather", [&] { return backend_->all_gather(p, send, out); });
  wait_queued(p);
}

void NcclRanks::barrier(int p) {
  // The host rendezvous plus a one-element all-reduce, so the GPUs pass the barrier too.
  check_participant(p);
  rendezvous(p, {.count = 1});
  LaunchTicket ticket;  // this participant's launch, announced by rendezvous()
  launch(p, ticket, "ncclAllReduce (barrier)", [&] { return backend_->barrier(p); });
  wait_queued(p);
}

void NcclRanks::abort(const std::string& reason) {
  {
    std::lock_guard lock(mu_);
    if (reason_.empty()) reason_ = reason;
    aborted_.store(true, std::memory_order_release);
  }
  cv_.notify_all();  // participants waiting for the others on the host
  abort_ranks();     // participants inside NCCL or waiting on the GPU: Note [Waiting without hanging]
}

void NcclRanks::reset() {
  bool closed = false;
  for (int p = 0; p < size(); ++p) {
    std::lock_guard l(ranks_[p].mu);
    closed = closed || ranks_[p].closed;
  }
  {
    std::lock_guard lock(mu_);
    reason_.clear();
    arrived_ = 0;
    aborted_.store(false, std::memory_order_release);
  }
  std::fill(queued_.begin(), queued_.end(), 0);
  if (closed) {
    abort_ranks();  // any rank not aborted yet: the clique is rebuilt whole
    init_ranks();
  }
}

}  // namespace towerflow::collectives
