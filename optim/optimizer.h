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
// as "<slot name>.<state name>" ("conv1.weight.momentum_buffer"), with the step count (and the
// update counts of slots that missed steps, OptimizerState::slot_steps); load_state writes the
// same values into every copy.
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
// Parameter groups (parameter_group.h) give slots their own lr scale and weight decay, or freeze
// them. step() updates the buffer in runs: one apply() per contiguous range of slots that share a
// group and an update count (floats outside every slot go with the default group), so a model
// without groups is one apply() over the whole buffer as before, and every copy still gets the
// same arithmetic (the fused updates are element-wise: splitting a buffer changes no bit). A
// frozen group's runs are skipped. Slots must not overlap (InvalidArgument at construction).
//
// Thread-safety: an optimizer is driven from one thread (the training loop); set_groups and
// set_group_* between steps.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "optim/parameter_group.h"
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
  // The updates a slot received, for the slots that missed some (a frozen group); every other
  // slot received `step`. A state without it (a checkpoint that keeps only the step and the
  // tensors) resumes every slot at `step`. That is exact for SGD without dampening; under Adam
  // (bias correction) or a dampened SGD (first momentum step), a slot that had missed steps goes
  // on as if it had received them all.
  std::map<std::string, std::int64_t> slot_steps;
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

  // Parameter groups (parameter_group.h). set_groups replaces them all and assigns every slot
  // anew (InvalidArgument naming the group, see assign_groups; nothing changes then); state and
  // update counts stay with the slots. set_group_frozen and set_group_lr_scale change one group
  // from the next step on: InvalidArgument for a name that is not a group (listing the groups)
  // or an invalid lr_scale.
  void set_groups(std::vector<ParameterGroup> groups);
  const std::vector<ParameterGroup>& groups() const { return groups_; }
  void set_group_frozen(std::string_view group, bool frozen);
  void set_group_lr_scale(std::string_view group, double lr_scale);
  // The group of a slot: its name, or "default" (kDefaultGroup); InvalidArgument for a name that
  // is not a slot.
  std::string_view group_of(std::string_view slot) const;

  const ParameterSet& parameters() const { return params_; }
  virtual std::string name() const = 0;

 protected:
  // weight_decay: the optimizer's own, for the default group and groups without one.
  Optimizer(ParameterSet params, double lr, double weight_decay, std::vector<std::string> state_names,
            std::vector<ParameterGroup> groups);

  // The values of one apply(): a group's, for a run of its slots.
  struct GroupStep {
    double lr = 0;               // the step's lr * the group's lr_scale
    double weight_decay = 0;     // the group's, else the optimizer's
    std::int64_t step = 1;       // the update count of these slots, 1 for their first update
  };

  // Queues the update of one run of one copy on `device` (its fused update,
  // core/tensor/device_ops.h): as many floats of parameters, gradients and every state buffer
  // (state_names() order), all in that device's memory.
  virtual void apply(const Device& device, std::span<float> p, std::span<const float> g,
                     std::span<const std::span<float>> state, const GroupStep& u) = 0;

 private:
  struct CopyState;  // one copy's state buffers, on its device
  struct Run {       // [begin, end) of the flat buffer, updated by one apply()
    std::size_t begin = 0, end = 0;
    std::size_t group = 0;  // index into groups_, groups_.size() for the default group
    std::int64_t updates = 0;
  };
  std::vector<Run> plan_runs() const;
  ParameterGroup& find_group(std::string_view name);

  ParameterSet params_;
  double lr_;
  double weight_decay_;
  LrSchedule schedule_;
  std::int64_t step_ = 0;
  std::vector<std::string> state_names_;
  std::vector<std::unique_ptr<CopyState>> state_;  // [copy]
  std::vector<ParameterGroup> groups_;
  std::vector<std::size_t> order_;          // slot indices by offset
  std::vector<std::size_t> slot_group_;     // [slot] index into groups_, groups_.size(): default
  std::vector<std::int64_t> slot_steps_;    // [slot] updates received
};

}  // namespace towerflow::optim
