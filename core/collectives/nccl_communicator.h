#pragma once
// NcclCommunicator: collectives among GPUs of one process with NCCL (CUDA builds only; in a CPU
// build the constructor throws DeviceError saying how to rebuild).
//
// Contract (beyond Communicator's): buffers are device memory of the participant's GPU. Before a
// call, the work that produced the buffer must have completed (the caller synchronises its
// stream), or the call is all_reduce_sum_after with an event recorded after that work, which the
// communicator's stream waits for on the GPU. Every collective first meets the other
// participants on the host and compares counts (and roots), so a mismatch raises InvalidArgument
// on every participant instead of corrupting memory or hanging. The call returns once the
// collective has completed on that participant's GPU; the thread sleeps meanwhile (a
// blocking-sync event, not a spin). Each participant is one CUDA device: two logical devices on
// one physical GPU cannot be joined (NCCL allows one rank per GPU); the tower trainer uses the
// parameter-device reduction there.
// abort() aborts every rank's NCCL communicator at once (Note [NCCL abort and shutdown] in
// nccl_communicator.cc): participants waiting on the host or on the GPU, and later ones, throw
// CollectiveAborted; reset() (with no participant inside) builds fresh NCCL communicators. The
// destructor finalizes all ranks in one NCCL group, then destroys them, so it cannot hang on a
// healthy clique; a broken one is aborted instead.
// Across processes (a ProcessGroup of P > 1): one NCCL communicator over the GPUs of every
// process, P x devices ranks, rank `process rank * devices + i` for devices[i]; rank 0 makes the
// NCCL unique id and broadcasts it over the process group (ncclCommInitRank inside one NCCL
// group per process). Collectives then span every process's participants (a broadcast's root
// and an all-gather's output count them all); the host-side count check covers this process's
// participants only. Waiting for a collective polls the GPU and the process group, so that a
// failure announced by another rank (or the group's timeout) aborts the NCCL communicators and
// raises PeerFailed instead of waiting for a peer that will never come.

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
