#pragma once
// ReplicaBuffers (private to tower/): the replicas' float buffers (batch-norm running averages),
// kept identical on every replica between steps, and put back when a step fails.
//
// Contract:
// - snapshot() holds the values every replica has between steps; take_snapshot() reads them from
//   replica 0 (after construction, a checkpoint load, or a step that left them identical).
// - During a step, gather(i) on tower i's thread reads replica i's values after its forward
//   passes; average(weights) on the caller's thread replaces every replica's values by the sum
//   of weights[i] * tower i's values, summed over every process too (weights are rows_i / B, so
//   the sum over all towers is 1), and makes that the snapshot.
// - restore() writes the snapshot back into every replica (after a failed step).
// - A model without float buffers makes all of these no-ops.

#include <cstddef>
#include <memory>
#include <vector>

#include "core/nn/module.h"

namespace towerflow::collectives {
class ProcessGroup;
}

namespace towerflow::tower {

class DeviceWorkers;

class ReplicaBuffers {
 public:
  ReplicaBuffers(std::vector<std::shared_ptr<nn::Module>>& replicas, DeviceWorkers& workers,
                 collectives::ProcessGroup& processes);

  std::size_t numel() const { return numel_; }
  const std::vector<float>& snapshot() const { return snapshot_; }
  void take_snapshot();
  void gather(int tower);
  void average(const std::vector<float>& weights);
  void restore();

  // Every float buffer of a module, in order, and reading/writing them as one vector.
  static std::vector<Tensor> of(const nn::Module& m);
  void read(const nn::Module& m, std::vector<float>& out) const;
  void write(nn::Module& m, const std::vector<float>& in) const;

 private:
  std::vector<std::shared_ptr<nn::Module>>* replicas_;
  DeviceWorkers* workers_;
  collectives::ProcessGroup* processes_;
  std::size_t numel_ = 0;
  std::vector<float> snapshot_;
  std::vector<std::vector<float>> gathered_;  // per tower
};

}  // namespace towerflow::tower
