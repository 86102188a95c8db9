#include "optim/optimizer.h"

#include <cmath>
#include <map>

#include "core/error.h"
#include "core/memory/allocator.h"
#include "core/tensor/backend_impl.h"

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

// State buffers of one copy, updated, read and written through the copy's device's tensor
// backend: host vectors for a CPU copy, buffers from the device's allocator otherwise.
struct Optimizer::CopyState {
  Backend* backend = nullptr;
  std::vector<std::vector<float>> host;  // a CPU copy's buffers
  std::vector<float*> buffers;           // [state], host[k].data() or device memory
  bool in_device_memory = false;         // buffers are the backend allocator's

  CopyState() = default;
  CopyState(const CopyState&) = delete;
  CopyState& operator=(const CopyState&) = delete;
  ~CopyState() {
    // Stream-ordered frees (Note [Stream-ordered frees] in core/cuda/context.cc): later work on
    // the backend's queue is the memory's next user.
    if (in_device_memory)
      for (float* p : buffers) backend->allocator().deallocate(p);
  }

  void read(std::size_t k, std::size_t offset, std::size_t n, float* out) const {
    backend->copy_to_host(out, buffers[k] + offset, n * sizeof(float));
  }
  void write(std::size_t k, std::size_t offset, const std::vector<float>& v) {
    backend->copy_from_host(buffers[k] + offset, v.data(), v.size() * sizeof(float));
    backend->synchronize();
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
    // The device's own backend: its queue, its allocator (in a build without CUDA, a GPU copy
    // raises DeviceError, "rebuild with -DTOWERFLOW_CUDA=ON").
    Backend& be = backend_for(c.device);
    if (!be.supports(OpKind::kOptimizerUpdate))
      raise<DeviceError>("an optimizer cannot update parameters on ", c.device, ": its backend (",
                         be.name(), ") has no fused optimizer update");
    auto st = std::make_unique<CopyState>();
    st->backend = &be;
    if (c.device.is_cpu()) {
      st->host.assign(state_names_.size(), std::vector<float>(n, 0.f));
      for (auto& h : st->host) st->buffers.push_back(h.data());
    } else {
      st->in_device_memory = true;
      for (std::size_t k = 0; k < state_names_.size(); ++k) {
        st->buffers.push_back(static_cast<float*>(
            be.allocator().allocate(std::max<std::size_t>(1, n) * sizeof(float))));
        be.fill(static_cast<std::int64_t>(n), 0.0f, st->buffers.back());
      }
      be.synchronize();
    }
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
    apply(*cs.backend, static_cast<std::int64_t>(c.params.size()), c.params.data(), c.grads.data(),
          cs.buffers.data(), lr, t);
    // The next forward runs on the same queue and would see the update anyway; waiting keeps
    // step()'s promise (complete on return) and reports a failure of the update here.
    cs.backend->synchronize();
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
