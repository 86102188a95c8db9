#pragma once
// Module: a layer or a model. Named, ordered parameters and buffers (PyTorch's state_dict names),
// child modules, train/eval mode, one device.
//
// Contract:
// - Names are dotted paths in registration order, exactly as PyTorch's state_dict lists them:
//   "conv1.weight", "bn1.running_mean", "layer2.0.downsample.0.weight", "fc.bias".
//   (BatchNorm's num_batches_tracked is not kept: momentum is fixed, so it is never read.)
// - Every parameter and buffer of a module lives on device(); a module is built on a device
//   (ModelFactory) and never moves: copy_state_from() copies values between modules on any
//   devices instead.
// - After flatten() (make_model does it), all parameters live in one contiguous float32 buffer
//   and all gradients in another, each parameter and gradient a view at the same offset, in
//   named_parameters() order, packed without gaps. An optimizer or all-reduce may work on
//   flat_parameters() / flat_gradients() directly; the per-parameter tensors see the change.
// - backward() accumulates into gradients; zero_grad() zeroes them.
// - A module is used by one thread at a time; distinct modules (on distinct devices) may be used
//   from distinct threads concurrently.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/device.h"
#include "core/tensor/tensor.h"

namespace towerflow::nn {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Module {
 public:
  explicit Module(const Device& device) : device_(device) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The module's computation. Layers document their input and output shapes.
  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x) { return forward(x); }

  const Device& device() const { return device_; }

  // Recursive, in registration order, with dotted names.
  NamedTensors named_parameters() const;
  NamedTensors named_buffers() const;
  std::vector<Tensor> parameters() const;
  std::int64_t num_parameters() const;  // elements

  // Train (batch statistics, dropout on) or eval mode, for this module and its children.
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Puts every parameter into one buffer and every gradient into another (idempotent). Values are
  // kept; gradients start at zero. Parameters registered later are not covered: call it on the
  // finished model.
  void flatten();
  bool is_flat() const { return flat_params_.defined(); }
  // The flat buffers, 1-D [num_parameters()]. Throw InvalidArgument when flatten() was not called.
  Tensor flat_parameters() const;
  Tensor flat_gradients() const;

  // Sets every parameter's gradient to zero (allocating gradients that do not exist yet).
  void zero_grad();

  // Copies every parameter and buffer value from `other` (any device). Names and shapes must
  // match one to one (InvalidArgument naming the first difference). Gradients are not copied.
  void copy_state_from(const Module& other);

  // Calls fn on this module, then on every descendant, depth first in registration order
  // (PyTorch's Module.apply): to reach layers of a kind, e.g. every BatchNorm2d.
  void apply(const std::function<void(Module&)>& fn);

  // Dotted name of this module inside its root ("layer1.0.conv1"; "" for the root): the op
  // scope its ops log under.
  const std::string& path() const { return path_; }

 protected:
  // Registration, in the order state_dict lists them. Return the stored tensor.
  Tensor& register_parameter(const std::string& name, Tensor t);
  Tensor& register_buffer(const std::string& name, Tensor t);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    register_child(name, m);
    return m;
  }

 private:
  void register_child(const std::string& name, std::shared_ptr<Module> m);
  void set_path(const std::string& path);
  void collect(const std::string& prefix, bool buffers, NamedTensors& out) const;

  Device device_;
  bool training_ = true;
  std::string path_;
  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  Tensor flat_params_;
  Tensor flat_grads_;
};

// Builds a module on a device. The tower builder calls it once per device.
using ModelFactory = std::function<std::shared_ptr<Module>(const Device&)>;

}  // namespace towerflow::nn

namespace towerflow {
using nn::ModelFactory;
using nn::Module;
}  // namespace towerflow
