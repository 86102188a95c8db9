#pragma once
// LocalCommunicator: collectives among the threads of one process over host memory.
//
// The all-reduce is a reduce-scatter fused with an all-gather (Note [Fused shared-memory
// all-reduce] in local_communicator.cc): participant i owns the i-th of n contiguous shards, sums
// that shard over every participant's buffer and writes the sum straight back into every buffer.
// Each byte is read once and written once, the least memory traffic an all-reduce of buffers that
// live in one address space can have, and the work is spread over all n participants' threads.
//
// Waits: a participant that has waited stall_warning for the others logs who has not arrived,
// with the collective and its step and bucket (CollectiveContext), and again after twice as long
// each time; at the timeout every waiter raises CollectiveAborted naming the absent participants.
//
// Contract (beyond Communicator's): buffers must stay valid and untouched by anyone else from a
// participant's call until every participant has returned from that collective. With contexts,
// participant i sums its shard on contexts[i]'s threads as well as its own (a logical CPU device
// with several intra-op threads); without, on the calling thread only.

#include <chrono>
#include <memory>
#include <optional>

#include "core/collectives/communicator.h"

namespace towerflow::cpu {
class CpuContext;
}

namespace towerflow::collectives {

struct LocalCommunicatorOptions {
  // Optional, one per participant (nullptr entries allowed): the device's intra-op threads.
  std::vector<const cpu::CpuContext*> contexts;
  // Spin iterations before a waiting participant sleeps on a futex. Spinning keeps a
  // one-thread-per-core step fast; sleeping keeps an oversubscribed machine usable.
  int spin_iterations = 4000;
  // How long a collective waits for a missing participant before the first stall report, and
  // before it gives up (Note [Stall reports among towers] in tower_waits.cc); unset:
  // TOWERFLOW_STALL_WARNING (5 s) and TOWERFLOW_COLLECTIVE_TIMEOUT (300 s).
  std::optional<std::chrono::milliseconds> stall_warning, timeout;
};

class LocalCommunicator final : public Communicator {
 public:
  // Throws InvalidArgument for an empty device list or a contexts list of the wrong length.
  explicit LocalCommunicator(std::vector<Device> devices, LocalCommunicatorOptions options = {});
  ~LocalCommunicator() override;

  const std::vector<Device>& devices() const override { return devices_; }
  void all_reduce_sum(int participant, std::span<float> data) override;
  void broadcast(int participant, std::span<float> data, int root) override;
  void all_gather(int participant, std::span<const float> send, std::span<float> out) override;
  void barrier(int participant) override;
  void abort(const std::string& reason) override;
  void reset() override;
  std::string name() const override;
  std::string recent_collectives() const override;

 private:
  struct State;
  std::vector<Device> devices_;
  std::unique_ptr<State> state_;
};

}  // namespace towerflow::collectives
