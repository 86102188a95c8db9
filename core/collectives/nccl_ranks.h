#pragma once
// Private to the collectives module: the NCCL communicator's logic (locking, host rendezvous,
// waiting, abort, reset), free of CUDA and compiled in every build, written against NcclBackend,
// the few NCCL and CUDA calls it needs. nccl_communicator.cc binds NcclBackend to NCCL and the
// CUDA runtime (CUDA builds); tests/core/collectives/fake_nccl.h binds it to a test double of
// NCCL's documented behaviour, so the logic is tested on any machine.
//
// Contract of NcclRanks (beyond Communicator's; nccl_communicator.h states it for users):
// - Every collective meets the other participants of this process on the host and compares
//   counts (and roots) first, so a mismatch raises InvalidArgument on every participant.
// - No lock is held across a backend call that may wait for a peer rank: a participant's thread
//   holds nothing while it launches, and abort() takes no lock that a launching or waiting
//   thread holds (Note [Waiting without hanging] in nccl_ranks.cc).
// - Every wait (communicator creation, a launch still in progress, a collective's completion)
//   polls, between short sleeps: abort(), the rank's asynchronous error, the process group's
//   failure notes (across processes), and a deadline: the process group's timeout() across
//   processes, NcclRanksOptions::timeout in one process. An asynchronous error or a passed
//   deadline aborts every rank of this process and raises CollectiveAborted (PeerFailed across
//   processes) naming the rank, its device and the cause; the other participants raise
//   CollectiveAborted with the same reason.
// - Launches are announced to device_free_lock() (Note [Device frees and NCCL launches]).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "core/collectives/communicator.h"

namespace towerflow::collectives {

class ProcessGroup;

// What a backend call or poll says about a rank: done, still in progress (NCCL's ncclInProgress;
// a collective not yet complete), or failed with the library's error string.
struct NcclState {
  enum Code { kSuccess, kInProgress, kError } code = kSuccess;
  std::string error;  // kError: what NCCL or CUDA said (ncclGetErrorString, cudaGetErrorString)

  static NcclState success() { return {}; }
  static NcclState in_progress() { return {kInProgress, {}}; }
  static NcclState failed(std::string e) { return {kError, std::move(e)}; }
  bool ok() const { return code == kSuccess; }
};

// The NCCL and CUDA calls of NcclRanks, one object per communicator, for `ranks()` local ranks.
// Threading: calls for rank p come from one thread at a time, except abort(p), which may come
// from any thread while another call on rank p is in flight (a non-blocking communicator allows
// it: Note [Waiting without hanging]); after abort(p) no call on rank p is made until init().
class NcclBackend {
 public:
  virtual ~NcclBackend() = default;
  virtual int ranks() const = 0;

  // A fresh NCCL unique id (ncclGetUniqueId), as bytes to broadcast to the other processes.
  virtual std::vector<std::byte> unique_id() = 0;
  // Starts creating every local rank's communicator: non-blocking communicators, local rank p is
  // global rank first_rank + p of total_ranks, joined by `id` (from unique_id() on process 0).
  // Completion is polled with async_error(p).
  virtual NcclState init(std::span<const std::byte> id, int total_ranks, int first_rank) = 0;

  // Queue a collective on rank p's stream (after `ready` for the all-reduce; null: no wait).
  // kInProgress: NCCL is still enqueuing it; poll async_error(p) until it is kSuccess.
  virtual NcclState all_reduce(int p, std::span<float> data, const QueueEvent* ready) = 0;
  virtual NcclState broadcast(int p, std::span<float> data, int root) = 0;
  virtual NcclState all_gather(int p, std::span<const float> send, std::span<float> out) = 0;
  virtual NcclState barrier(int p) = 0;  // a one-float all-reduce on the backend's own scratch

  // Marks "everything queued so far on rank p" (an event recorded on its stream) ...
  virtual NcclState record_done(int p) = 0;
  // ... and asks whether the stream has passed the last mark: kSuccess, kInProgress, or kError.
  virtual NcclState query_done(int p) = 0;
  // ncclCommGetAsyncError: kSuccess, kInProgress (init, a launch or a finalize still running), or
  // kError with NCCL's error string.
  virtual NcclState async_error(int p) = 0;

  // ncclCommAbort: stops whatever rank p has in flight and frees its communicator.
  virtual void abort(int p) = 0;
  // ncclCommFinalize of every rank in one group (completion polled with async_error), then ...
  virtual NcclState finalize_all() = 0;
  // ... ncclCommDestroy of rank p (local once finalized).
  virtual void destroy(int p) = 0;
  // "NCCL 2.28.9".
  virtual std::string version() const = 0;
};

struct NcclRanksOptions {
  // The deadline of every wait in one process (across processes: the process group's timeout()).
  // Five minutes: far beyond any healthy collective or communicator creation, so it only ends a
  // hang (a lost rank, a wedged GPU), never a slow step. The NCCL communicator takes
  // TOWERFLOW_COLLECTIVE_TIMEOUT instead when it is set (process_group.h: collective_timeout).
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
};

class NcclRanks final : public Communicator {
 public:
  // Creates the communicators (and waits for them, as every wait does). Across processes
  // (processes with size() > 1), process 0's unique id is broadcast over `processes`.
  NcclRanks(std::vector<Device> devices, std::unique_ptr<NcclBackend> backend,
            ProcessGroup* processes = nullptr, NcclRanksOptions options = {});
  ~NcclRanks() override;

  const std::vector<Device>& devices() const override { return devices_; }
  void all_reduce_sum(int participant, std::span<float> data) override;
  void all_reduce_sum_after(int participant, std::span<float> data, const QueueEvent* ready) override;
  void all_reduce_sum_queued(int participant, std::span<float> data, const QueueEvent* ready) override;
  void wait_queued(int participant) override;
  void broadcast(int participant, std::span<float> data, int root) override;
  void all_gather(int participant, std::span<const float> send, std::span<float> out) override;
  void barrier(int participant) override;
  void abort(const std::string& reason) override;
  void reset() override;
  std::string name() const override;

  bool across() const;
  int total_ranks() const;  // NCCL ranks in all processes

 private:
  struct Call {
    std::size_t count = 0;
    int root = 0;
  };
  class LaunchTicket;
  template <typename Launch>
  void launch(int p, LaunchTicket& ticket, const char* what, Launch launch_fn);
  template <typename Poll>
  void wait(int p, const char* what, Poll poll);
  std::vector<Call> rendezvous(int p, Call call);
  void init_ranks();
  [[noreturn]] void throw_aborted();
  [[noreturn]] void fail(int p, const std::string& reason, bool peer_failed);
  void abort_ranks();
  bool enter(int p);
  void leave(int p);
  void check_participant(int p) const;
  std::chrono::milliseconds timeout() const;

  std::vector<Device> devices_;
  std::unique_ptr<NcclBackend> backend_;
  ProcessGroup* processes_;
  NcclRanksOptions options_;

  // Per rank (Note [Waiting without hanging] in nccl_ranks.cc): how many threads are inside a
  // backend call on it, whether it is closed to new calls (aborted, until reset()), and whether
  // the backend's abort(p) has been called. `mu` is never held across a backend call other than
  // abort(p) itself.
  struct Rank {
    std::mutex mu;
    int users = 0;
    bool closed = false;
    bool abort_pending = false;  // closed while a call was in flight: its leave() aborts
    bool abort_issued = false;
  };
  void abort_rank_locked(int p);
  std::unique_ptr<Rank[]> ranks_;
  std::vector<int> queued_;  // per participant: collectives queued and not yet waited for
  int first_rank_ = 0;       // this process's first NCCL rank

  // The host rendezvous and the abort state.
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> aborted_{false};
  std::string reason_;
  std::vector<Call> posted_;
  std::vector<Call> round_;
  int arrived_ = 0;
  std::uint64_t generation_ = 0;
};

}  // namespace towerflow::collectives
