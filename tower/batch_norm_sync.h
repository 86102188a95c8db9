#pragma once
// BatchNormSyncGroup: the exchange behind synchronised batch norm across the towers of one
// process (BatchNormMode::Synchronised). One member per tower; each replica's BatchNorm2d layers
// hold their tower's member, and the towers' worker threads meet in all_gather, a barrier over
// a few per-channel doubles (see core/tensor/batch_norm_sync.h for the members' contract).
//
// Contract:
// - all_gather is valid only while the group is open (open() ... close(), around a training
//   step). Outside, a member raises InvalidArgument (a replica run in training mode outside
//   Trainer::forward_backward would otherwise wait for towers that never come).
// - abort(reason), from any thread: every member blocked in or later entering all_gather throws
//   collectives::CollectiveAborted("... reason"). reset() clears it once no member is inside.
// - Results are identical on every member: each copies every member's vector in member order.
// - Across processes: with a ProcessGroup of P > 1 processes, every process builds a group of its
//   L towers, the members are numbered rank * L + i (size() is P * L), and member 0 of each
//   process exchanges its process's vectors with the other processes (ProcessGroup::all_gather),
//   so statistics span every tower of every process. The group must be used by this exchange
//   alone (a duplicate()), as it runs while the gradients are reduced. A failure of that exchange
//   aborts the group locally and raises on member 0.

#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/tensor/batch_norm_sync.h"

namespace towerflow::collectives {
class ProcessGroup;
}

namespace towerflow::tower {

class BatchNormSyncGroup {
 public:
  // One member per device, member i for devices[i]. Throws InvalidArgument for an empty list.
  explicit BatchNormSyncGroup(std::vector<Device> devices, collectives::ProcessGroup* processes = nullptr);
  ~BatchNormSyncGroup();
  BatchNormSyncGroup(const BatchNormSyncGroup&) = delete;
  BatchNormSyncGroup& operator=(const BatchNormSyncGroup&) = delete;

  int size() const;
  BatchNormSync& member(int i);

  void open();
  void close();
  void abort(const std::string& reason);
  void reset();
  // Seconds member i has waited for the others in all_gather since the last call (the auto
  // split's compute times leave them out).
  double take_waited(int member);

 private:
  struct State;
  class Member;
  std::unique_ptr<State> state_;
  std::vector<std::unique_ptr<Member>> members_;
};

}  // namespace towerflow::tower
