#include "optim/optimizer.h"

#include <cmath>
#include <map>

#include "core/error.h"

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

Optimizer::Optimizer(ParameterSet params, double lr, std::vector<std::string> state_names)
    : params_(std::move(params)), lr_(lr), state_names_(std::move(state_names)) {
  set_lr(lr);
  if (params_.copies.empty())
    raise<InvalidArgument>("an optimizer needs at least one parameter copy; the parameter set is empty");
  const std::size_t n = params_.numel();
  for (const ParameterCopy& c : params_.copies) {
    if (c.params.size() != n || c.grads.size() != n)
      raise<InvalidArgument>("parameter copy on ", c.device, " has ", c.params.size(),
                             " parameters and ", c.grads.size(), " gradients; every copy needs ", n);
    if (!c.device.is_cpu())
      raise<DeviceError>("optimizer update on ", c.device, " needs the CUDA optimizer kernels, which "
                         "this build does not have; reduce on a CPU parameter device "
                         "(reduction parameter_device:/cpu:0)");
  }
  std::size_t covered = 0;
  for (const ParameterSlot& s : params_.slots) {
    if (s.offset + s.size > n)
      raise<InvalidArgument>("parameter slot '", s.name, "' [", s.offset, ", ", s.offset + s.size,
                             ") lies outside the flat buffer of ", n, " floats");
    covered += s.size;
  }
  TW_CHECK(covered <= n, "slots cover ", covered, " of ", n, " floats");
  // State lives with its copy: host memory for CPU copies.
  state_.resize(params_.copies.size());
  for (auto& per_copy : state_)
    per_copy.assign(state_names_.size(), std::vector<float>(n, 0.f));
}

void Optimizer::set_lr(double lr) {
  if (!std::isfinite(lr) || lr < 0)
    raise<InvalidArgument>("learning rate ", lr, " is invalid; use a finite value >= 0 (e.g. 0.1)");
  lr_ = lr;
}

void Optimizer::set_schedule(LrSchedule schedule) { schedule_ = std::move(schedule); }

void Optimizer::step() {
  if (schedule_) set_lr(schedule_(step_));
  const double lr = lr_;
  const std::int64_t t = step_ + 1;
  auto one = [&](int i) {
    std::vector<std::span<float>> st;
    for (auto& buf : state_[i]) st.emplace_back(buf);
    update(params_.copies[i].params, params_.copies[i].grads, st, lr, t);
  };
  if (params_.for_each_copy) {
    params_.for_each_copy(one);
  } else {
    for (int i = 0; i < static_cast<int>(params_.copies.size()); ++i) one(i);
  }
  step_ = t;
}

OptimizerState Optimizer::state() const {
  OptimizerState out;
  out.step = step_;
  for (std::size_t k = 0; k < state_names_.size(); ++k)
    for (const ParameterSlot& s : params_.slots) {
      const auto& buf = state_[0][k];
      out.tensors.push_back({.name = s.name + "." + state_names_[k],
                             .values = std::vector<float>(buf.begin() + s.offset,
                                                          buf.begin() + s.offset + s.size)});
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
  for (auto& per_copy : state_)
    for (std::size_t k = 0; k < state_names_.size(); ++k)
      for (const ParameterSlot& s : params_.slots) {
        const auto& v = by_name.at(s.name + "." + state_names_[k])->values;
        std::copy(v.begin(), v.end(), per_copy[k].begin() + s.offset);
      }
  step_ = state.step;
}

}  // namespace towerflow::optim
