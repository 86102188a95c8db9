#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"
#include "core/tensor/device_ops.h"
#include "core/tensor/tensor.h"

namespace towerflow::optim {

ParameterSet ParameterSet::single(std::span<float> params, std::span<const float> grads,
                                  std::vector<ParameterSlot> slots) {
  if (params.size() != grads.size())
    raise<InvalidArgument>("parameters (", params.size(), " floats) and gradients (", grads.size(),
                           " floats) must have the same size");
  if (slots.empty()) slots.push_back({.name = "params", .offset = 0, .size = params.size(),
                                      .shape = {static_cast<std::int64_t>(params.size())}});
  ParameterSet set;
  set.slots = std::move(slots);
  set.copies.push_back({.device = Device::cpu(0), .params = params, .grads = grads});
  return set;
}

// State buffers of one copy: host vectors for a CPU copy, tensors of the copy's device otherwise
// (their memory returns to its allocator, stream-ordered, with the optimizer).
struct Optimizer::CopyState {
  Device device;
  std::vector<std::vector<float>> host;  // a CPU copy's buffers
  std::vector<Tensor> tensors;           // another device's buffers, [n] float32 each
  std::vector<std::span<float>> buffers;  // [state], over host[k] or tensors[k]

  void read(std::size_t k, std::size_t offset, std::size_t n, float* out) const {
    if (tensors.empty()) {
      std::copy_n(host[k].begin() + static_cast<std::ptrdiff_t>(offset), n, out);
    } else {
      const auto begin = static_cast<std::int64_t>(offset);
      tensors[k].slice(begin, begin + static_cast<std::int64_t>(n)).to_host(std::span<float>(out, n));
    }
  }
  void write(std::size_t k, std::size_t offset, const std::vector<float>& v) {
    if (tensors.empty()) {
      std::copy(v.begin(), v.end(), host[k].begin() + static_cast<std::ptrdiff_t>(offset));
    } else {
      const auto begin = static_cast<std::int64_t>(offset);
      tensors[k].slice(begin, begin + static_cast<std::int64_t>(v.size())).copy_from_host(std::span<const float>(v));
      synchronize(device);
    }
  }
};

Optimizer::~Optimizer() = default;

Optimizer::Optimizer(ParameterSet params, double lr, double weight_decay,
                     std::vector<std::string> state_names, std::vector<ParameterGroup> groups)
    : params_(std::move(params)), lr_(lr), weight_decay_(weight_decay), state_names_(std::move(state_names)) {
  set_lr(lr);
  if (params_.copies.empty())
    raise<InvalidArgument>("an optimizer needs at least one parameter copy; the parameter set is empty");
  const std::size_t n = params_.numel();
  for (const ParameterCopy& c : params_.copies) {
    if (c.params.size() != n || c.grads.size() != n)
      raise<InvalidArgument>("parameter copy on ", c.device, " has ", c.params.size(),
                             " parameters and ", c.grads.size(), " gradients; every copy needs ", n);
  }
  const std::vector<ParameterSlot>& slots = params_.slots;
  for (const ParameterSlot& s : slots) {
    if (s.offset + s.size > n)
      raise<InvalidArgument>("parameter slot '", s.name, "' [", s.offset, ", ", s.offset + s.size,
                             ") lies outside the flat buffer of ", n, " floats");
  }
  // The runs of step() walk the slots by offset; a float in two slots would be updated twice.
  order_.resize(slots.size());
  for (std::size_t i = 0; i < order_.size(); ++i) order_[i] = i;
  std::stable_sort(order_.begin(), order_.end(),
                   [&](std::size_t a, std::size_t b) { return slots[a].offset < slots[b].offset; });
  for (std::size_t k = 1; k < order_.size(); ++k) {
    const ParameterSlot& a = slots[order_[k - 1]];
    const ParameterSlot& b = slots[order_[k]];
    if (a.size > 0 && b.size > 0 && b.offset < a.offset + a.size)
      raise<InvalidArgument>("parameter slots '", a.name, "' [", a.offset, ", ", a.offset + a.size,
                             ") and '", b.name, "' [", b.offset, ", ", b.offset + b.size,
                             ") overlap; every float of the flat buffer belongs to at most one slot");
  }
  slot_steps_.assign(slots.size(), 0);
  slot_group_.assign(slots.size(), 0);
  set_groups(std::move(groups));
  // State lives with its copy: host memory for CPU copies, device memory for GPU copies.
  for (const ParameterCopy& c : params_.copies) {
    // The device's fused update (in a build without CUDA, a GPU copy raises DeviceError,
    // "rebuild with -DTOWERFLOW_CUDA=ON").
    if (!has_kernel(c.device, OpKind::kOptimizerUpdate))
      raise<DeviceError>("an optimizer cannot update parameters on ", c.device, ": its backend (",
                         backend_name(c.device), ") has no fused optimizer update");
    auto st = std::make_unique<CopyState>();
    st->device = c.device;
    const auto rows = static_cast<std::int64_t>(n);
    for (std::size_t k = 0; k < state_names_.size(); ++k) {
      if (c.device.is_cpu()) {
        st->buffers.push_back(st->host.emplace_back(n, 0.f));
      } else {
        const Tensor& t = st->tensors.emplace_back(Tensor::zeros({rows}, c.device));
        st->buffers.push_back({t.data<float>(), n});
      }
    }
    if (!c.device.is_cpu()) synchronize(c.device);
    state_.push_back(std::move(st));
  }
}

void Optimizer::set_lr(double lr) {
  if (!std::isfinite(lr) || lr < 0)
    raise<InvalidArgument>("learning rate ", lr, " is invalid; use a finite value >= 0 (e.g. 0.1)");
  lr_ = lr;
}

void Optimizer::set_schedule(LrSchedule schedule) { schedule_ = std::move(schedule); }

void Optimizer::set_groups(std::vector<ParameterGroup> groups) {
  std::vector<std::size_t> of = assign_groups(params_.slots, groups);  // validates, changes nothing
  groups_ = std::move(groups);
  slot_group_ = std::move(of);
}

ParameterGroup& Optimizer::find_group(std::string_view name) {
  for (ParameterGroup& g : groups_)
    if (g.name == name) return g;
  std::string known;
  for (const ParameterGroup& g : groups_) known += (known.empty() ? "'" : ", '") + g.name + "'";
  raise<InvalidArgument>("no parameter group '", name, "'; the groups are ",
                         known.empty() ? std::string("none") : known,
                         " (the default group cannot be changed; set the optimizer's options, or "
                         "add a group with set_groups)");
}

void Optimizer::set_group_frozen(std::string_view group, bool frozen) { find_group(group).frozen = frozen; }

void Optimizer::set_group_lr_scale(std::string_view group, double lr_scale) {
  ParameterGroup& g = find_group(group);
  ParameterGroup changed{.name = g.name, .lr_scale = lr_scale};
  check_group_values(changed);
  g.lr_scale = lr_scale;
}

std::string_view Optimizer::group_of(std::string_view slot) const {
  for (std::size_t i = 0; i < params_.slots.size(); ++i)
    if (params_.slots[i].name == slot)
      return slot_group_[i] == groups_.size() ? kDefaultGroup : std::string_view(groups_[slot_group_[i]].name);
  raise<InvalidArgument>("'", slot, "' is not a parameter slot of this optimizer; slot names are as "
                         "the model names its parameters (\"conv1.weight\")");
}

// Note [Runs of one group]
// A run is a contiguous range of the flat buffer whose floats share a group and an update count:
// one apply() each, so one fused update per run on every copy. Without groups (or with groups
// over contiguous slots) that is one or a few calls per step; the counts differ only after a
// group was frozen, and then only between that group's slots and the others. Floats outside every
// slot go with the default group, whose count is the step count (it is never frozen).
std::vector<Optimizer::Run> Optimizer::plan_runs() const {
  const std::size_t kDefault = groups_.size();
  std::vector<Run> runs;
  auto add = [&](std::size_t begin, std::size_t end, std::size_t group, std::int64_t updates) {
    if (begin == end) return;
    if (group != kDefault && groups_[group].frozen) return;  // a gap: no run continues past it
    if (!runs.empty() && runs.back().end == begin && runs.back().group == group &&
        runs.back().updates == updates) {
      runs.back().end = end;
    } else {
      runs.push_back({.begin = begin, .end = end, .group = group, .updates = updates});
    }
  };
  std::size_t at = 0;
  for (std::size_t i : order_) {
    const ParameterSlot& s = params_.slots[i];
    if (s.size == 0) continue;
    add(at, s.offset, kDefault, step_);
    add(s.offset, s.offset + s.size, slot_group_[i], slot_steps_[i]);
    at = s.offset + s.size;
  }
  add(at, params_.numel(), kDefault, step_);
  return runs;
}

void Optimizer::step() {
  if (params_.skip_step && params_.skip_step()) return;  // ParameterSet::skip_step
  if (schedule_) set_lr(schedule_(step_));
  const std::vector<Run> runs = plan_runs();  // Note [Runs of one group]
  std::vector<GroupStep> values;
  for (const Run& r : runs) {
    if (r.group == groups_.size()) {  // the default group
      values.push_back({.lr = lr_, .weight_decay = weight_decay_, .step = r.updates + 1});
      continue;
    }
    const ParameterGroup& g = groups_[r.group];
    values.push_back({.lr = lr_ * g.lr_scale, .weight_decay = g.weight_decay.value_or(weight_decay_),
                      .step = r.updates + 1});
  }
  auto one = [&](int i) {
    CopyState& cs = *state_[i];
    const ParameterCopy& c = params_.copies[i];
    std::vector<std::span<float>> state(cs.buffers.size());
    for (std::size_t r = 0; r < runs.size(); ++r) {
      const std::size_t begin = runs[r].begin, size = runs[r].end - runs[r].begin;
      for (std::size_t k = 0; k < state.size(); ++k) state[k] = cs.buffers[k].subspan(begin, size);
      apply(c.device, c.params.subspan(begin, size), c.grads.subspan(begin, size), state, values[r]);
    }
    // The next forward runs on the same queue and would see the update anyway; waiting keeps
    // step()'s promise (complete on return) and reports a failure of the update here.
    synchronize(c.device);
  };
  if (params_.for_each_copy) {
    params_.for_each_copy(one);
  } else {
    for (int i = 0; i < static_cast<int>(params_.copies.size()); ++i) one(i);
  }
  for (std::size_t i = 0; i < slot_steps_.size(); ++i)
    if (slot_group_[i] == groups_.size() || !groups_[slot_group_[i]].frozen) ++slot_steps_[i];
  ++step_;
}

OptimizerState Optimizer::state() const {
  OptimizerState out;
  out.step = step_;
  for (std::size_t i = 0; i < slot_steps_.size(); ++i)
    if (slot_steps_[i] != step_) out.slot_steps[params_.slots[i].name] = slot_steps_[i];
  for (std::size_t k = 0; k < state_names_.size(); ++k)
    for (const ParameterSlot& s : params_.slots) {
      std::vector<float> values(s.size);
      state_[0]->read(k, s.offset, s.size, values.data());
      out.tensors.push_back({.name = s.name + "." + state_names_[k], .values = std::move(values)});
    }
  return out;
}

void Optimizer::load_state(const OptimizerState& state) {
  if (state.step < 0)
    raise<InvalidArgument>("optimizer state has step ", state.step, "; a step count is >= 0");
  std::map<std::string, const NamedState*> by_name;
  for (const NamedState& t : state.tensors) by_name[t.name] = &t;
  // Validate everything before changing anything.
  std::size_t expected = 0;
  for (std::size_t k = 0; k < state_names_.size(); ++k)
    for (const ParameterSlot& s : params_.slots) {
      const std::string name = s.name + "." + state_names_[k];
      auto it = by_name.find(name);
      if (it == by_name.end())
        raise<InvalidArgument>(this->name(), " state has no tensor '", name,
                               "'; the checkpoint was saved by a different optimizer or model");
      if (it->second->values.size() != s.size)
        raise<InvalidArgument>(this->name(), " state tensor '", name, "' has ",
                               it->second->values.size(), " values but the parameter has ", s.size);
      ++expected;
    }
  if (by_name.size() != expected) {
    for (const auto& [name, t] : by_name) {
      bool known = false;
      for (std::size_t k = 0; k < state_names_.size() && !known; ++k)
        for (const ParameterSlot& s : params_.slots)
          if (name == s.name + "." + state_names_[k]) known = true;
      if (!known)
        raise<InvalidArgument>(this->name(), " state has an unexpected tensor '", name,
                               "'; the checkpoint was saved by a different optimizer or model");
    }
  }
  std::vector<std::int64_t> slot_steps(params_.slots.size(), state.step);
  for (const auto& [name, updates] : state.slot_steps) {
    const auto it = std::find_if(params_.slots.begin(), params_.slots.end(),
                                 [&](const ParameterSlot& s) { return s.name == name; });
    if (it == params_.slots.end())
      raise<InvalidArgument>(this->name(), " state counts updates of '", name,
                             "', which is not a parameter slot; the checkpoint was saved for a different model");
    if (updates < 0 || updates > state.step)
      raise<InvalidArgument>(this->name(), " state says slot '", name, "' received ", updates,
                             " updates in ", state.step, " steps; a count is in [0, steps]: the state is damaged");
    slot_steps[static_cast<std::size_t>(it - params_.slots.begin())] = updates;
  }
  for (auto& per_copy : state_)
    for (std::size_t k = 0; k < state_names_.size(); ++k)
      for (const ParameterSlot& s : params_.slots)
        per_copy->write(k, s.offset, by_name.at(s.name + "." + state_names_[k])->values);
  step_ = state.step;
  slot_steps_ = std::move(slot_steps);
}

}  // namespace towerflow::optim
