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
  }
  std::size_t covered = 0;
  for (const ParameterSlot& s : params_.slots) {
    if (s.offset + s.size > n)
      raise<InvalidArgument>("parameter slot '", s.name, "' [", s.offset, ", ", s.offset + s.size,
                             ") lies outside the flat buffer of ", n, " floats");
    covered += s.size;
  }
  TW_CHECK(covered <= n, "slots cover ", covered, " of ", n, " floats");
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

void Optimizer::step() {
  if (params_.skip_step && params_.skip_step()) return;  // ParameterSet::skip_step
  if (schedule_) set_lr(schedule_(step_));
  const double lr = lr_;
  const std::int64_t t = step_ + 1;
  auto one = [&](int i) {
    CopyState& cs = *state_[i];
    const ParameterCopy& c = params_.copies[i];
    apply(c.device, c.params, c.grads, cs.buffers, lr, t);
    // The next forward runs on the same queue and would see the update anyway; waiting keeps
    // step()'s promise (complete on return) and reports a failure of the update here.
    synchronize(c.device);
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
  for (auto& per_copy : state_)
    for (std::size_t k = 0; k < state_names_.size(); ++k)
      for (const ParameterSlot& s : params_.slots)
        per_copy->write(k, s.offset, by_name.at(s.name + "." + state_names_[k])->values);
  step_ = state.step;
}

}  // namespace towerflow::optim
