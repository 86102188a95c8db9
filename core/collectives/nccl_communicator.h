#pragma once
// NcclCommunicator: collectives among GPUs of one process with NCCL (CUDA builds only; in a CPU
// build the constructor throws DeviceError saying how to rebuild).
//
// Contract (beyond Communicator's): buffers are device memory of the participant's GPU. Before a
// call, the work that produced the buffer must have completed (the caller synchronises its
// stream), or the call is all_reduce_sum_after / all_reduce_sum_queued with an event recorded
// after that work, which the communicator's stream waits for on the GPU. Every collective first
// meets the other participants on the host and compares counts (and roots), so a mismatch raises
// InvalidArgument on every participant instead of corrupting memory or hanging. A collective
// returns once it has completed on that participant's GPU; all_reduce_sum_queued returns once
// the all-reduce is queued on the communicator's stream, so buckets are launched back to back,
// and wait_queued(participant) waits for all of them. Each participant is one CUDA device: two
// logical devices on one physical GPU cannot be joined (NCCL allows one rank per GPU); the tower
// trainer uses the parameter-device reduction there.
// Never a hang (Note [Waiting without hanging] in nccl_ranks.cc): the NCCL communicators are
// non-blocking and connected when they are created (NCCL_RUNTIME_CONNECT=0 unless the
// environment says otherwise, so their buffers exist before the trainer reserves device memory);
// no lock is held across a call that may wait for a peer; every wait polls NCCL's asynchronous
// error, abort() and a deadline (in one process TOWERFLOW_COLLECTIVE_TIMEOUT, default 5 minutes;
// across processes the process group's timeout()), sleeping between polls. An asynchronous error or a passed deadline aborts every
// rank and raises CollectiveAborted naming the rank, its device and NCCL's error string on that
// participant, and CollectiveAborted with the same reason on the others.
// abort() is callable from any thread at any time, also while participants are inside NCCL: it
// aborts every rank's NCCL communicator; participants waiting on the host or on the GPU, and
// later ones, throw CollectiveAborted; reset() (with no participant inside) builds fresh NCCL
// communicators. The destructor finalizes all ranks in one NCCL group, then destroys them, so it
// cannot hang on a healthy clique; a broken one is aborted instead.
// Across processes (a ProcessGroup of P > 1): one NCCL communicator over the GPUs of every
// process, P x devices ranks, rank `process rank * devices + i` for devices[i]; rank 0 makes the
// NCCL unique id and broadcasts it over the process group. Collectives then span every process's
// participants (a broadcast's root and an all-gather's output count them all); the host-side
// count check covers this process's participants only. Waiting also polls the process group, so
// that a failure announced by another rank (or the group's timeout) aborts the NCCL
// communicators and raises PeerFailed instead of waiting for a peer that will never come.

#include <memory>

#include "core/collectives/communicator.h"

namespace towerflow::collectives {

class NcclCommunicator final : public Communicator {
 public:
  // devices[i] runs on CUDA ordinal gpu_ordinals[i] (empty: devices[i].index).
  NcclCommunicator(std::vector<Device> devices, std::vector<int> gpu_ordinals = {},
                   ProcessGroup* processes = nullptr);
  ~NcclCommunicator() override;

  const std::vector<Device>& devices() const override { return devices_; }
  void all_reduce_sum(int participant, std::span<float> data) override;
  void all_reduce_sum_after(int participant, std::span<float> data,
                            const QueueEvent* ready) override;
  void all_reduce_sum_queued(int participant, std::span<float> data,
                             const QueueEvent* ready) override;
  void wait_queued(int participant) override;
  void broadcast(int participant, std::span<float> data, int root) override;
  void all_gather(int participant, std::span<const float> send, std::span<float> out) override;
  void barrier(int participant) override;
  void abort(const std::string& reason) override;
  void reset() override;
  std::string name() const override;

 private:
  struct Impl;
  std::vector<Device> devices_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace towerflow::collectives
