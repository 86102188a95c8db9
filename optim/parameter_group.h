#pragma once
// Parameter groups: slots that take their own learning rate and weight decay, or no update at all
// (torch.optim's param_groups, and a parameter whose grad is None).
//
// A group names the slots it takes with a predicate on the slot (parameters.h). Every slot belongs
// to the first group that takes it, else to the default group ("default": the optimizer's lr and
// weight decay). A group's slots are updated with
//   lr           = the optimizer's lr of the step (its schedule's value) * lr_scale
//   weight decay = the group's weight_decay, or the optimizer's when unset
// and a frozen group's slots are not touched at all: neither parameters nor state (momentum,
// moments) change, and the step does not count for them (Adam's bias correction and SGD's first
// momentum step count the updates each slot received, as PyTorch counts per parameter). An
// lr_scale of 0 is not frozen: as torch.optim with lr = 0, the parameters keep their values (for
// finite gradients) while the state moves on.
//
//   optim::Sgd sgd{trainer.parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-4},
//                  {{.name = "bn_scale", .slots = optim::slots_named({"bn1.weight"}), .frozen = true},
//                   {.name = "norm", .slots = optim::slots_containing("bn"), .lr_scale = 64,
//                    .weight_decay = 5e-4 / 64}}};
//   ...
//   sgd.set_group_frozen("bn_scale", false);   // any time between steps (optimizer.h)
//
// Validation (assign_groups, and Optimizer::set_groups through it) throws InvalidArgument naming
// the group for: an empty name, "default", a name used twice, no predicate, a negative or
// non-finite lr_scale or weight decay, and a group that takes no slot. Unlike torch.optim, which
// accepts an empty group, an empty group is refused: it is almost always a predicate that misses
// (a typo in a name), and training on with the optimizer's values would hide it; the message
// lists the slots.

#include <cstddef>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "optim/parameters.h"

namespace towerflow::optim {

using SlotPredicate = std::function<bool(const ParameterSlot& slot)>;

// Slots whose name contains `text` ("norm" takes "norm.weight" and "layer1.norm.bias").
SlotPredicate slots_containing(std::string text);
// Slots with exactly one of these names.
SlotPredicate slots_named(std::vector<std::string> names);

struct ParameterGroup {
  std::string name;                    // "norm": in messages and in Optimizer::set_group_*
  SlotPredicate slots;                 // which slots it takes (those no earlier group took)
  double lr_scale = 1.0;               // its lr: the optimizer's lr of the step * lr_scale
  std::optional<double> weight_decay;  // its weight decay; unset: the optimizer's
  bool frozen = false;                 // true: its slots are left alone (see above)
};

inline constexpr std::string_view kDefaultGroup = "default";

// InvalidArgument naming the group for a negative or non-finite lr_scale or weight decay.
void check_group_values(const ParameterGroup& group);

// Each slot's group: the index of the first group that takes it, or groups.size() for the
// default group. Validates the groups (see above); changes nothing.
std::vector<std::size_t> assign_groups(std::span<const ParameterSlot> slots,
                                       std::span<const ParameterGroup> groups);

}  // namespace towerflow::optim
