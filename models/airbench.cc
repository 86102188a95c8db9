#include "models/airbench.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/nn/whitening.h"

namespace towerflow::models {

namespace {

// PyTorch's default initialisation of Conv2d and Linear weights (kaiming_uniform with a = sqrt 5):
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
void default_uniform(const Tensor& w, nn::InitRng& rng) {
  const double fan_in = static_cast<double>(w.numel() / w.dim(0));
  nn::uniform_init(w, 1.0 / std::sqrt(fan_in), rng);
}

std::shared_ptr<nn::Conv2d> dirac_conv(const Device& device, nn::Conv2dSpec spec, nn::InitRng& rng) {
  auto conv = std::make_shared<nn::Conv2d>(device, spec, rng);
  default_uniform(conv->weight(), rng);
  nn::dirac_init(conv->weight(), std::min(spec.in_channels, spec.out_channels));
  return conv;
}

}  // namespace

// conv1 -> max-pool 2 -> norm1 -> GELU -> conv2 -> norm2 -> GELU.
class Airbench94::ConvGroup : public nn::Module {
 public:
  ConvGroup(const Device& device, int in, int out, nn::BatchNorm2dSpec norm, nn::InitRng& rng)
      : Module(device) {
    conv1_ = register_module(
        "conv1", dirac_conv(device, {.in_channels = in, .out_channels = out, .padding = 1, .bias = false}, rng));
    norm1_ = register_module("norm1", std::make_shared<nn::BatchNorm2d>(device, out, norm));
    conv2_ = register_module(
        "conv2", dirac_conv(device, {.in_channels = out, .out_channels = out, .padding = 1, .bias = false}, rng));
    norm2_ = register_module("norm2", std::make_shared<nn::BatchNorm2d>(device, out, norm));
  }
  Tensor forward(const Tensor& x) override {
    Tensor y;
    {
      OpScope scope(path() + ".pool");
      y = max_pool2d(conv1_->forward(x), {.kernel = 2, .stride = 2});
    }
    y = norm1_->forward(y);
    {
      OpScope scope(path() + ".activ");
      y = gelu(y);
    }
    y = norm2_->forward(conv2_->forward(y));
    OpScope scope(path() + ".activ");
    return gelu(y);
  }

 private:
  std::shared_ptr<nn::Conv2d> conv1_, conv2_;
  std::shared_ptr<nn::BatchNorm2d> norm1_, norm2_;
};

Airbench94::Airbench94(const Device& device, Airbench94Options options, nn::InitRng& rng)
    : Module(device), options_(options) {
  if (options.num_classes < 1)
    raise<InvalidArgument>("airbench94: num_classes ", options.num_classes, " must be at least 1");
  for (int w : options.widths)
    if (w < 1) raise<InvalidArgument>("airbench94: group width ", w, " must be at least 1");
  whiten_ = register_module("0", dirac_conv(device,
                                            {.in_channels = 3, .out_channels = 24, .kernel = 2,
                                             .padding = 0, .bias = true, .learn_weight = false},
                                            rng));
  whiten_->bias().copy_(Tensor::zeros({24}, device));
  const nn::BatchNorm2dSpec norm{.eps = options.batch_norm_eps,
                                 .momentum = options.batch_norm_momentum,
                                 .learn_scale = false};
  int in = 24;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const int out = options.widths[g];
    groups_[g] = register_module(std::to_string(g + 2),
                                 std::make_shared<ConvGroup>(device, in, out, norm, rng));
    in = out;
  }
  head_ = register_module("7", std::make_shared<nn::Linear>(device, in, options.num_classes, rng,
                                                           /*bias=*/false));
  default_uniform(head_->weight(), rng);
}

Tensor Airbench94::forward(const Tensor& x) {
  Tensor y = whiten_->forward(x);
  {
    OpScope scope("1");
    y = gelu(y);
  }
  for (const auto& group : groups_) y = group->forward(y);
  {
    OpScope scope("5");
    y = towerflow::flatten(max_pool2d(y, {.kernel = 3, .stride = 3}));
  }
  y = head_->forward(y);
  OpScope scope("8");
  return scale(y, options_.logit_scale);
}

void Airbench94::whiten(const Tensor& images, double eps) {
  const nn::Whitening w = nn::patch_whitening(images, {.kernel = 2, .eps = eps});
  whiten_->weight().copy_(w.weight);
}

Airbench94* as_airbench94(nn::Module& model) { return dynamic_cast<Airbench94*>(&model); }

}  // namespace towerflow::models
