#pragma once
// ProcessGroup: the processes of one training job (one per node or per GPU, started by mpirun,
// srun or another MPI launcher), and the collectives between them. The tower trainer reduces
// inside a process with a Communicator and across processes with a ProcessGroup
// (HierarchicalCommunicator), so a job of P processes with L devices each trains P x L towers.
//
//   auto& world = collectives::world();      // MPI's world under mpirun, else a world of one
//   if (world.rank() == 0) print_progress();
//
// Contract:
// - world() is the job's group, made on first use: MPI's MPI_COMM_WORLD when the process was
//   started by an MPI launcher (launched_by_mpi()) and the build has MPI (TOWERFLOW_MPI), else a
//   world of one process, whose collectives return at once (the same code path: a world of one
//   needs no special case in callers). It is process-wide, as MPI is: MPI_Init_thread
//   (MPI_THREAD_MULTIPLE) on first use, MPI_Finalize at exit. Started by mpirun in a build
//   without MPI, world() raises DeviceError saying how to rebuild.
// - Collectives: every rank calls the same ones in the same order with the same sizes. Results
//   are identical on every rank. Calls on one group are made by one thread at a time; a group
//   from duplicate() is independent (its own MPI communicator) and may be used concurrently
//   from another thread (the batch-norm exchange runs while gradients are reduced).
// - Never a hang. A collective waits at most timeout() (options, or TOWERFLOW_COLLECTIVE_TIMEOUT
//   in seconds; default 30 s) and then raises PeerFailed naming the collective and the timeout:
//   a rank died, hangs, or is far behind. A rank that fails calls announce_failure(reason)
//   (train::fit and the command-line programs do) before it exits: every other rank's current
//   or next collective raises PeerFailed("rank R failed: reason"). A rank killed outright is
//   noticed by the launcher (mpirun ends the job) or, failing that, by the timeout. After
//   PeerFailed a group is broken: every later collective raises PeerFailed again at once.
// - Stalls are reported while they happen (Note [Stall reports] in mpi_process_group.cc): a
//   collective that has waited stall_warning() (TOWERFLOW_STALL_WARNING in seconds; default 5 s)
//   logs a warning on every waiting rank naming the collective (its group, number, kind and
//   bytes), the ranks waiting in it too and the ranks that have not arrived, and again after
//   twice as long each time, until it completes or the timeout ends it.
// - recent_collectives(): the last collectives this rank entered, as JSON, for a post-mortem
//   (train::fit writes it into the train dir when a run across processes fails).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/collectives/communicator.h"

namespace towerflow::collectives {

// Another rank failed, died or did not take part in a collective in time.
class PeerFailed : public CollectiveAborted {
 public:
  using CollectiveAborted::CollectiveAborted;
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  virtual int rank() const = 0;        // 0 .. size() - 1
  virtual int size() const = 0;        // processes in the job
  virtual int local_rank() const = 0;  // among the job's processes on this host
  virtual int local_size() const = 0;

  virtual void all_reduce_sum(std::span<float> data) = 0;
  virtual void all_reduce_sum(std::span<double> data) = 0;
  virtual void all_reduce_max(std::span<std::int64_t> data) = 0;
  // data <- root's data on every rank.
  virtual void broadcast(std::span<std::byte> data, int root) = 0;
  // out[r * send.size() .. ) <- rank r's send.
  virtual void all_gather(std::span<const std::byte> send, std::span<std::byte> out) = 0;
  virtual void barrier() = 0;

  // Raises PeerFailed if another rank has announced a failure (or the group is broken); for
  // waits outside the group's own collectives (an NCCL collective across processes).
  virtual void check_peers() {}
  // A group over the same processes whose collectives do not interleave with this one's.
  virtual std::unique_ptr<ProcessGroup> duplicate() = 0;
  // Tells every other rank that this one failed (see the contract); waits a moment for them to
  // take note, never longer than a few seconds. Idempotent; a no-op in a world of one.
  virtual void announce_failure(const std::string& reason) = 0;

  // "MPI (Open MPI v4.1.4), 2 processes on 1 host" or "one process".
  virtual std::string name() const = 0;
  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }
  std::chrono::milliseconds stall_warning() const { return stall_warning_; }
  void set_stall_warning(std::chrono::milliseconds t) { stall_warning_ = t; }

  // The last collectives this rank entered (up to 64, oldest first), as a JSON array of objects
  // {"group", "seq", "op", "bytes", "started_s" (since the group's start), "waited_s", "done"};
  // "[]" in a world of one.
  virtual std::string recent_collectives() const { return "[]"; }

  // Helpers on the collectives above.
  std::string broadcast(std::string value, int root);  // root's string on every rank
  std::vector<std::string> all_gather(const std::string& value);  // every rank's string, by rank

 protected:
  std::chrono::milliseconds timeout_{30'000};
  std::chrono::milliseconds stall_warning_{5'000};
};

// Environment variables of MPI launchers (Open MPI, MPICH/Hydra, PMIx, Slurm's srun with PMI)
// that say this process is one of several.
bool launched_by_mpi();

// The job's processes (see the contract). TOWERFLOW_COLLECTIVE_TIMEOUT (seconds, > 0) sets the
// initial timeout; a bad value raises InvalidArgument naming it.
ProcessGroup& world();

// TOWERFLOW_COLLECTIVE_TIMEOUT when set, else `fallback`: the deadline of a collective's wait
// (the process group's, 30 s by default; the local and NCCL communicators' and synchronised batch
// norm's among the towers of one process, 5 minutes by default). InvalidArgument naming a bad value.
std::chrono::milliseconds collective_timeout(std::chrono::milliseconds fallback);

// TOWERFLOW_STALL_WARNING when set, else `fallback`: how long a collective waits before its first
// stall report. InvalidArgument naming a bad value.
std::chrono::milliseconds stall_warning(std::chrono::milliseconds fallback);

// A world of one process: every collective returns at once.
std::unique_ptr<ProcessGroup> make_single_process_group();

// Raises InvalidArgument on every rank when `value` differs between ranks:
//   "the ranks disagree on <what>: rank 0 has X, rank 1 has Y; <fix>"
void check_same_on_every_rank(ProcessGroup& group, std::string_view what, const std::string& value,
                              std::string_view fix);

// Communicator over every participant of every process: `local`'s participants (this process's
// devices) reduce among themselves, participant 0 reduces the result across processes with
// `processes`, and the sum is broadcast back to the local participants. Participants are
// numbered globally rank * local->size() + i for collectives with a root; calls take the local
// index as every Communicator does. Host buffers only (CPU devices).
std::unique_ptr<Communicator> make_hierarchical_communicator(std::unique_ptr<Communicator> local,
                                                             ProcessGroup& processes);

}  // namespace towerflow::collectives
