#pragma once
// NcclCommunicator: collectives among GPUs of one process with NCCL (CUDA builds only; in a CPU
// build the constructor throws DeviceError saying how to rebuild).
//
// Contract (beyond Communicator's): buffers are device memory of the participant's GPU. Before a
// call, the work that produced the buffer must have completed (the caller synchronises its
// stream); the call returns once the collective has completed on that participant's GPU. Each
// participant is one CUDA device: two logical devices on one physical GPU cannot be joined (NCCL
// allows one rank per GPU); the tower trainer uses the parameter-device reduction there.
// After abort(), waiting participants abort their NCCL communicators and throw
// CollectiveAborted; reset() builds fresh NCCL communicators.

#include <memory>

#include "core/collectives/communicator.h"

namespace towerflow::collectives {

class NcclCommunicator final : public Communicator {
 public:
  // devices[i] runs on CUDA ordinal gpu_ordinals[i] (empty: devices[i].index).
  NcclCommunicator(std::vector<Device> devices, std::vector<int> gpu_ordinals = {});
  ~NcclCommunicator() override;

  const std::vector<Device>& devices() const override { return devices_; }
  void all_reduce_sum(int participant, std::span<float> data) override;
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
