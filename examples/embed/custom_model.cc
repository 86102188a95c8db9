// A model of the program's own, trained by towerflow's run loop on several towers: any
// nn::Module built from towerflow's layers and ops works, not only the built-in models.
// Usage: custom_model [towers] (default 2 CPU towers).
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "core/nn/init.h"
#include "core/nn/layers.h"
#include "core/platform/registry.h"
#include "core/tensor/ops.h"
#include "data/data.h"
#include "optim/optim.h"
#include "tower/tower.h"
#include "train/train.h"

namespace tw = towerflow;

// conv3x3-16, batch norm + relu, max-pool; conv3x3-32, relu, max-pool; a linear classifier.
// Parameters and buffers take PyTorch's state_dict names (conv1.weight, bn1.running_mean, ...).
class SmallNet : public tw::nn::Module {
 public:
  SmallNet(const tw::Device& device, std::uint64_t seed) : Module(device) {
    tw::nn::InitRng rng(seed);
    conv1_ = register_module("conv1", std::make_shared<tw::nn::Conv2d>(
                                          device, tw::nn::Conv2dSpec{.in_channels = 3, .out_channels = 16,
                                                                     .kernel = 3, .padding = 1, .bias = false}, rng));
    bn1_ = register_module("bn1", std::make_shared<tw::nn::BatchNorm2d>(device, 16));
    conv2_ = register_module("conv2", std::make_shared<tw::nn::Conv2d>(
                                          device, tw::nn::Conv2dSpec{.in_channels = 16, .out_channels = 32,
                                                                     .kernel = 3, .padding = 1}, rng));
    fc_ = register_module("fc", std::make_shared<tw::nn::Linear>(device, 32 * 8 * 8, 10, rng));
  }

  tw::Tensor forward(const tw::Tensor& x) override {  // x: [n, 32, 32, 3], NHWC
    const tw::Pool2dOptions pool{.kernel = 2, .stride = 2};
    tw::Tensor y = tw::max_pool2d(bn1_->forward_relu(conv1_->forward(x)), pool);  // [n, 16, 16, 16]
    y = tw::max_pool2d(tw::relu(conv2_->forward(y)), pool);                       // [n, 8, 8, 32]
    return fc_->forward(tw::flatten(y));                                           // [n, 10]
  }

 private:
  std::shared_ptr<tw::nn::Conv2d> conv1_, conv2_;
  std::shared_ptr<tw::nn::BatchNorm2d> bn1_;
  std::shared_ptr<tw::nn::Linear> fc_;
};

int main(int argc, char** argv) {
  const int towers = argc > 1 ? std::atoi(argv[1]) : 2;
  auto devices = tw::logical_devices(tw::ProcessOptions{.device_count = {{"CPU", towers}}});
  // The tower builder calls the factory once per device; every replica then starts from replica 0.
  tw::nn::ModelFactory factory = [](const tw::Device& device) {
    auto model = std::make_shared<SmallNet>(device, /*seed=*/1);
    model->flatten();  // parameters and gradients in one buffer each: one all-reduce per step
    return model;
  };
  tw::data::Builtin train{tw::data::Split::Train, {.train_size = 2048}};
  tw::data::Builtin test{tw::data::Split::Test, {.test_size = 500}};
  tw::tower::Trainer trainer{factory, devices, {.batch_norm = tw::tower::BatchNormMode::Synchronised}};
  tw::optim::Adam adam{trainer.parameters(), {.lr = 2e-3}};
  tw::train::Reporter progress{{.title = "custom_model"}};
  auto result = tw::train::fit(trainer, adam, train, &test, {.batch = 64, .epochs = 2, .log_every = 8}, {&progress});
  std::printf("SmallNet on %d towers: test accuracy %.2f%%\n", trainer.towers(), 100 * result.test_acc);
}
