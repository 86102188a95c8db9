#include "core/nn/module.h"

#include "core/error.h"
#include "core/tensor/backend_impl.h"

namespace towerflow::nn {

Tensor& Module::register_parameter(const std::string& name, Tensor t) {
  TW_CHECK(t.defined(), "parameter ", name, " is undefined");
  TW_CHECK(t.device() == device_, "parameter ", name, " on ", t.device(), " for a module on ",
           device_);
  TW_CHECK(!is_flat(), "parameter ", name, " registered after flatten()");
  t.set_requires_grad(true);
  params_.emplace_back(name, std::move(t));
  return params_.back().second;
}

Tensor& Module::register_buffer(const std::string& name, Tensor t) {
  TW_CHECK(t.defined() && t.device() == device_, "buffer ", name, " must live on ", device_);
  buffers_.emplace_back(name, std::move(t));
  return buffers_.back().second;
}

void Module::register_child(const std::string& name, std::shared_ptr<Module> m) {
  TW_CHECK(m != nullptr, "child module ", name, " is null");
  if (m->device() != device_)
    raise<InvalidArgument>("child module ", name, " lives on ", m->device(),
                           " but its parent is on ", device_,
                           "; build every layer of a model on the model's device");
  m->set_path(path_.empty() ? name : path_ + "." + name);
  children_.emplace_back(name, std::move(m));
}

void Module::set_path(const std::string& path) {
  path_ = path;
  for (auto& [name, child] : children_) child->set_path(path_ + "." + name);
}

void Module::collect(const std::string& prefix, bool buffers, NamedTensors& out) const {
  for (const auto& [name, t] : buffers ? buffers_ : params_) out.emplace_back(prefix + name, t);
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", buffers, out);
}

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  collect("", false, out);
  return out;
}

NamedTensors Module::named_buffers() const {
  NamedTensors out;
  collect("", true, out);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters()) out.push_back(t);
  return out;
}

std::int64_t Module::num_parameters() const {
  std::int64_t n = 0;
  for (auto& [name, t] : named_parameters()) n += t.numel();
  return n;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

void Module::apply(const std::function<void(Module&)>& fn) {
  fn(*this);
  for (auto& [name, child] : children_) child->apply(fn);
}

void Module::flatten() {
  if (is_flat()) return;
  const NamedTensors params = named_parameters();
  const std::int64_t total = num_parameters();
  Tensor flat = Tensor::empty({total}, device_);
  Tensor flat_grads = Tensor::zeros({total}, device_);
  std::int64_t offset = 0;
  for (const auto& [name, p] : params) {
    const std::int64_t n = p.numel();
    Tensor dst = flat.slice(offset, offset + n).view(p.shape());
    dst.copy_(p);
    // Re-point the parameter itself (every handle shares its TensorImpl) at the flat buffer.
    TensorImpl* impl = p.impl();
    impl->storage = dst.impl()->storage;
    impl->offset = dst.impl()->offset;
    Tensor(p).set_grad(flat_grads.slice(offset, offset + n).view(p.shape()));
    offset += n;
  }
  flat_params_ = flat;
  flat_grads_ = flat_grads;
}

Tensor Module::flat_parameters() const {
  if (!is_flat())
    raise<InvalidArgument>("flat_parameters(): the module on ", device_,
                           " is not flattened; call flatten() once the model is built");
  return flat_params_;
}

Tensor Module::flat_gradients() const {
  if (!is_flat())
    raise<InvalidArgument>("flat_gradients(): the module on ", device_,
                           " is not flattened; call flatten() once the model is built");
  return flat_grads_;
}

void Module::zero_grad() {
  if (is_flat()) {
    backend_for(device_).fill(flat_grads_.numel(), 0.0f, flat_grads_.data<float>());
    return;
  }
  for (auto& [name, p] : named_parameters()) {
    if (p.grad().defined()) backend_for(device_).fill(p.numel(), 0.0f, p.grad().data<float>());
    else Tensor(p).set_grad(Tensor::zeros(p.shape(), device_));
  }
}

namespace {
void copy_named(const char* what, const NamedTensors& dst, const NamedTensors& src) {
  if (dst.size() != src.size())
    raise<InvalidArgument>("copy_state_from: the modules have ", dst.size(), " and ", src.size(),
                           " ", what, "; they must be the same architecture");
  for (std::size_t i = 0; i < dst.size(); ++i) {
    if (dst[i].first != src[i].first || dst[i].second.shape() != src[i].second.shape())
      raise<InvalidArgument>("copy_state_from: ", what, " ", i, " is ", dst[i].first, " ",
                             shape_str(dst[i].second.shape()), " here but ", src[i].first, " ",
                             shape_str(src[i].second.shape()), " in the source");
  }
  for (std::size_t i = 0; i < dst.size(); ++i) dst[i].second.copy_(src[i].second);
}
}  // namespace

void Module::copy_state_from(const Module& other) {
  NoGradGuard no_grad;
  const NamedTensors dst = named_parameters(), src = other.named_parameters();
  if (is_flat() && other.is_flat() && dst.size() == src.size() &&
      flat_params_.numel() == other.flat_params_.numel()) {
    // One copy for all parameters; names and shapes are still checked first.
    bool same = true;
    for (std::size_t i = 0; i < dst.size() && same; ++i)
      same = dst[i].first == src[i].first && dst[i].second.shape() == src[i].second.shape();
    if (same) flat_params_.copy_(other.flat_params_);
    else copy_named("parameters", dst, src);
  } else {
    copy_named("parameters", dst, src);
  }
  copy_named("buffers", named_buffers(), other.named_buffers());
}

}  // namespace towerflow::nn
