#pragma once
// Optimizer: applies gradients to every copy of a ParameterSet (see parameters.h).
//
// step() computes the learning rate (the schedule's value at step_count(), or the fixed lr), then
// updates every copy in place from its gradients, each copy on its own device's thread through
// ParameterSet::for_each_copy, and counts the step. Every copy gets the same arithmetic, so copies
// that start identical with identical gradients stay bit-identical.
//
// State (momentum, Adam's moments) lives with the copy it belongs to: one set of buffers per copy,
// allocated on the copy's device. state() and load_state() exchange it by name for checkpoints,
// as "<slot name>.<state name>" ("conv1.weight.momentum_buffer"), with the step count; load_state
// writes the same values into every copy.
//
// Every copy is updated by its device's fused update (sgd_update_ / adam_update_ of
// core/tensor/device_ops.h, one formula and one validation for every device): on a GPU, on the
// same stream as the device's tensor ops, with state in tensors from the same allocator; on a
// CPU, in host memory outside the device's allocator (the memory a run reports is the model's). A copy's device must exist: the device registry initialises with default options
// at the first use of a device, as for tensors (core/platform/registry.h). optim/ sees no CUDA.
// step() returns once the update is complete on the device.
// The gradients must be complete when step() is called (the tower trainer's forward_backward
// returns only then). In a build without CUDA, an optimizer over a GPU copy raises DeviceError; a
// device whose backend has no fused update raises it too.
//
// Thread-safety: an optimizer is driven from one thread (the training loop).

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "optim/parameters.h"
#include "optim/schedule.h"

namespace towerflow::optim {

struct NamedState {
  std::string name;           // "conv1.weight.exp_avg"
  std::vector<float> values;
};

struct OptimizerState {
  std::int64_t step = 0;      // optimizer steps taken
  std::vector<NamedState> tensors;
};

class Optimizer {
 public:
  virtual ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  void step();

  double lr() const { return lr_; }                 // the rate of the last step (or the fixed one)
  void set_lr(double lr);                           // InvalidArgument unless finite and >= 0
  void set_schedule(LrSchedule schedule);           // empty: back to the fixed lr
  const LrSchedule& schedule() const { return schedule_; }
  std::int64_t step_count() const { return step_; }

  // Copy 0's state (all copies are identical), named per slot.
  OptimizerState state() const;
  // InvalidArgument naming the first missing, unexpected or wrongly-sized tensor; changes nothing
  // then.
  void load_state(const OptimizerState& state);

  const ParameterSet& parameters() const { return params_; }
  virtual std::string name() const = 0;

 protected:
  Optimizer(ParameterSet params, double lr, std::vector<std::string> state_names);

  // Queues one copy's update on `device` (its fused update, core/tensor/device_ops.h): as many
  // floats of parameters, gradients and every state buffer (state_names() order), all in that
  // device's memory. step is 1 for the first update.
  virtual void apply(const Device& device, std::span<float> p, std::span<const float> g,
                     std::span<const std::span<float>> state, double lr, std::int64_t step) = 0;

 private:
  struct CopyState;  // one copy's state buffers, on its device
  ParameterSet params_;
  double lr_;
  LrSchedule schedule_;
  std::int64_t step_ = 0;
  std::vector<std::string> state_names_;
  std::vector<std::unique_ptr<CopyState>> state_;  // [copy]
};

}  // namespace towerflow::optim
