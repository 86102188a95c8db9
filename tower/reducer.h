#pragma once
// GradientReducer (private to tower/): one reduction strategy (reduction.h) as an object. The
// trainer's step calls it at fixed points; everything a strategy needs happens behind them.
//
//   trainer thread                 tower i's thread (DeviceWorkers)
//   --------------                 --------------------------------
//                                  before_forward(i)      e.g. the parameter device's values in
//                                  ... forward passes ...
//                                  backward_hooks(i)      before the last micro-batch's backward
//                                  ... backward passes ...
//                                  after_backward(i)      this tower's gradients handed over
//   finish()                                              the rest, after every tower's part
//   [abort(reason) from any thread when a tower fails; reset() on the trainer thread after]
//
// Contract:
// - After finish(), the gradients the optimizer reads (parameters().copies[c].grads) hold the sum
//   over every tower of every process of the towers' gradients (the global-batch mean, Note [Why
//   towers scale loss by B] in trainer.cc), the same bits on every copy, and reduced_gradients()
//   is one of them.
// - after_backward(i) may block until the other towers reach theirs (a collective). abort()
//   makes every tower blocked in, or later entering, the reducer's collectives throw
//   CollectiveAborted; it is callable from any thread at any time and is idempotent. reset() runs
//   on the trainer's thread once no tower runs, and leaves the reducer ready for the next step.
// - A reducer holds no thread of its own per step: helpers (the bucketed reducer's communication
//   workers) live as long as it does.
// - parameters(): what an optimizer steps (optim/parameters.h), slots excepted; sync() makes every
//   replica hold the parameters the optimizer updated; take_replica0() makes replica 0's
//   parameters the truth (after a checkpoint was loaded into it and copied to the replicas).
//
// Adding a strategy: a class in its own reducer_*.cc, and its maker declared and called in
// make_reducer (reducer.cc).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/nn/module.h"
#include "core/tensor/autograd.h"
#include "optim/parameters.h"
#include "tower/reduction.h"

namespace towerflow::collectives {
class Communicator;
class ProcessGroup;
}  // namespace towerflow::collectives

namespace towerflow::tower {

class DeviceWorkers;

// What every reducer works on: the towers of this process and the job's processes.
struct ReducerSetup {
  std::vector<Device> devices;                          // tower i runs on devices[i]
  std::vector<std::shared_ptr<nn::Module>>* replicas;   // replica i on devices[i], flat
  DeviceWorkers* workers;                               // tower i's thread
  collectives::ProcessGroup* processes;
  std::size_t numel = 0;                                // elements of a flat parameter buffer
};

class GradientReducer {
 public:
  virtual ~GradientReducer() = default;

  // "all_reduce over local shared-memory (2 CPU participants)"
  virtual std::string describe() const = 0;

  virtual void before_forward(int tower) { (void)tower; }
  virtual BackwardHooks backward_hooks(int tower) { (void)tower; return {}; }
  virtual void after_backward(int tower) = 0;
  virtual void finish() {}
  virtual void abort(const std::string& reason) = 0;
  virtual void reset() = 0;

  // The reduction's cost not hidden behind backward, from the towers' after_backward times and
  // finish()'s: by default the fastest tower's (its wait for slower towers is not reduction).
  virtual double exposed_seconds(std::span<const double> towers, double finish) const;

  virtual Tensor reduced_gradients() = 0;
  // Multiplies the reduced gradients, wherever the optimizer reads them, by `factor`.
  virtual void scale_gradients(float factor) = 0;

  virtual optim::ParameterSet parameters() = 0;
  virtual void sync() {}
  virtual void take_replica0() {}

  // Buckets whose reduction started before their tower's backward() returned, since
  // construction, summed over towers (the bucketed reducer; 0 for the others).
  virtual std::int64_t reduced_during_backward() const { return 0; }

  // The towers' last collectives (Communicator::recent_collectives of the reducer's communicator).
  virtual std::string recent_collectives() const { return "[]"; }
};

// The communicator a strategy needs, built before the replicas so that NCCL connects before the
// devices' memory is reserved (nccl_communicator.h), and the strategy in effect after the
// fallbacks reduction.h describes (logged).
struct ReductionChoice {
  Reduction reduction;
  std::unique_ptr<collectives::Communicator> communicator;  // null for the parameter device
};
ReductionChoice choose_reduction(const Reduction& asked, const std::vector<Device>& devices,
                                 collectives::ProcessGroup& processes);

std::unique_ptr<GradientReducer> make_reducer(ReductionChoice choice, const ReducerSetup& setup);

// Replica-copy helpers the all-reduce strategies share: one optimizer copy per replica, run on
// the towers' threads.
optim::ParameterSet replica_parameter_set(const ReducerSetup& setup);
void scale_replica_gradients(const ReducerSetup& setup, float factor);

}  // namespace towerflow::tower
