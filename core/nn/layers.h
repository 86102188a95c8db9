#pragma once
// Layers: Modules wrapping the op set, named and shaped as their PyTorch counterparts
// (nn.Conv2d, nn.BatchNorm2d, nn.Linear, nn.Sequential, ...), so state_dict names and layouts
// match. Activations are NHWC; see core/tensor/ops.h for each op's contract.
//
// Initialisation (from an InitRng, so a model is a pure function of its seed): Conv2d weights
// Kaiming-normal (fan_out, ReLU), biases and Linear U(+-1/sqrt(fan_in)) (PyTorch's default);
// BatchNorm2d gamma 1, beta 0, running mean 0, running var 1.

#include <cstdint>
#include <memory>
#include <vector>

#include "core/nn/init.h"
#include "core/nn/module.h"
#include "core/tensor/ops.h"

namespace towerflow::nn {

struct Conv2dSpec {
  int in_channels;
  int out_channels;
  int kernel = 3;
  int stride = 1;
  int padding = 0;
  bool bias = true;
  // false: the weight is a buffer, not a parameter (frozen, as PyTorch's requires_grad = False):
  // no gradient, no optimizer update; set it by copying into weight() (e.g. patch_whitening).
  bool learn_weight = true;
};

// [n, h, w, in] -> [n, oh, ow, out]. Parameters: weight [out, in, k, k] (OIHW), bias [out].
// Initialisation: see the file's head; models may re-initialise (uniform_init, dirac_init).
class Conv2d : public Module {
 public:
  Conv2d(const Device& device, Conv2dSpec spec, InitRng& rng);
  Tensor forward(const Tensor& x) override;
  // With OutputReaders::kBatchNorm (only a batch norm reads the result), bf16 precision may store
  // it in bf16 (Conv2dOptions::readers).
  Tensor forward(const Tensor& x, OutputReaders readers);
  // max_pool2d_relu(forward(x), pool) as one op (conv2d_max_pool2d_relu): the bias's gradient
  // comes from the pool's backward pass.
  Tensor forward_max_pool_relu(const Tensor& x, Pool2dOptions pool);
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }
  const Conv2dSpec& spec() const { return spec_; }

 private:
  Conv2dSpec spec_;
  Tensor weight_, bias_;
};

// Over the channel (last) dimension. Parameters weight (gamma), bias (beta) [c]; buffers
// running_mean, running_var [c] (and weight, with BatchNorm2dSpec::learn_scale false). Training mode uses batch statistics and updates the running
// averages; eval mode uses the running averages.
//
// set_sync(member) makes training mode use the statistics of a whole group of such layers, one
// per replica (synchronised batch norm; see BatchNormOptions::sync): the tower trainer sets it
// on every replica for BatchNormMode::Synchronised. The member must outlive its use; nullptr
// (the default) is this layer's own batch.
struct BatchNorm2dSpec {
  float eps = 1e-5f;
  float momentum = 0.1f;  // PyTorch's convention (see BatchNormOptions)
  // false: the scale (gamma, "weight") stays at 1 and is a buffer, not a parameter (PyTorch's
  // weight.requires_grad = False): no optimizer updates it and it has no gradient.
  bool learn_scale = true;
};

class BatchNorm2d : public Module {
 public:
  BatchNorm2d(const Device& device, int channels, float eps = 1e-5f, float momentum = 0.1f);
  BatchNorm2d(const Device& device, int channels, BatchNorm2dSpec spec);
  Tensor forward(const Tensor& x) override;
  // relu(bn(x)), fused. With OutputReaders::kConvolutions or kConvolutionsAndResidual (only
  // convolutions, or they and fused batch norms that add it, read the result), stored as bf16
  // under bf16 precision where the device can (BatchNormOptions::readers).
  Tensor forward_relu(const Tensor& x, OutputReaders readers = OutputReaders::kAny);
  // relu(bn(x) + r), fused. With OutputReaders::kConvolutionsAndResidual (only convolutions and
  // fused batch norms that add it read the result), stored as bf16 under bf16 precision where the
  // device can (BatchNormOptions::readers).
  Tensor forward_add_relu(const Tensor& x, const Tensor& residual,
                          OutputReaders readers = OutputReaders::kAny);
  void set_sync(BatchNormSync* member) { sync_ = member; }
  BatchNormSync* sync() const { return sync_; }

 private:
  BatchNormOptions options() const;
  BatchNormSync* sync_ = nullptr;
  float eps_, momentum_;
  Tensor weight_, bias_, running_mean_, running_var_;
};

// [n, in] -> [n, out]. Parameters weight [out, in], bias [out].
class Linear : public Module {
 public:
  Linear(const Device& device, int in_features, int out_features, InitRng& rng, bool bias = true);
  Tensor forward(const Tensor& x) override;
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }

 private:
  Tensor weight_, bias_;
};

class ReLU : public Module {
 public:
  explicit ReLU(const Device& device) : Module(device) {}
  Tensor forward(const Tensor& x) override;
};

// torch.nn.GELU() (the exact, erf form).
class GELU : public Module {
 public:
  explicit GELU(const Device& device) : Module(device) {}
  Tensor forward(const Tensor& x) override;
};

class MaxPool2d : public Module {
 public:
  MaxPool2d(const Device& device, Pool2dOptions opts) : Module(device), opts_(opts) {}
  Tensor forward(const Tensor& x) override;

 private:
  Pool2dOptions opts_;
};

// [n, h, w, c] -> [n, c].
class GlobalAvgPool : public Module {
 public:
  explicit GlobalAvgPool(const Device& device) : Module(device) {}
  Tensor forward(const Tensor& x) override;
};

// [n, ...] -> [n, prod(...)], PyTorch's (c, h, w) order for NHWC input (see ops.h flatten).
class Flatten : public Module {
 public:
  explicit Flatten(const Device& device) : Module(device) {}
  Tensor forward(const Tensor& x) override;
};

// Inverted dropout in training mode, identity in eval mode. Each call draws a fresh mask: the
// offset advances by the element count, so masks are a pure function of (seed, call sequence).
class Dropout : public Module {
 public:
  Dropout(const Device& device, float p, std::uint64_t seed);
  Tensor forward(const Tensor& x) override;

 private:
  float p_;
  std::uint64_t seed_;
  std::uint64_t offset_ = 0;
};

// Children named "0", "1", ... run in order.
class Sequential : public Module {
 public:
  explicit Sequential(const Device& device) : Module(device) {}
  void push_back(std::shared_ptr<Module> m);
  Tensor forward(const Tensor& x) override;
  std::size_t size() const { return layers_.size(); }
  const std::shared_ptr<Module>& operator[](std::size_t i) const { return layers_[i]; }

 private:
  std::vector<std::shared_ptr<Module>> layers_;
};

}  // namespace towerflow::nn
