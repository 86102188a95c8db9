// Module mechanics: ordered names, flat parameter and gradient buffers with views, zero_grad,
// train/eval, copies between devices, dropout masks, and log_device_placement of a model.

#include <catch2/catch.hpp>

#include <mutex>

#include "core/error.h"
#include "core/log.h"
#include "core/nn/layers.h"
#include "core/platform/registry.h"

namespace towerflow::nn {
namespace {

// Every test here runs under one configuration: two CPU devices, placement logging on. The log
// lines are captured (and kept off stderr) for the placement test.
std::mutex g_mu;
std::vector<std::string> g_lines;

void init_devices() {
  static const bool once = [] {
    set_log_sink([](LogLevel, std::string_view m) {
      std::lock_guard lock(g_mu);
      g_lines.emplace_back(m);
    });
    return true;
  }();
  (void)once;
  initialise_devices(
      ProcessOptions{.device_count = {{"CPU", 2}}, .log_device_placement = true});
}

class TinyNet : public Module {
 public:
  TinyNet(const Device& d, InitRng& rng) : Module(d) {
    conv = register_module(
        "conv", std::make_shared<Conv2d>(d, Conv2dSpec{.in_channels = 3, .out_channels = 4,
                                                       .kernel = 3, .padding = 1},
                                         rng));
    bn = register_module("bn", std::make_shared<BatchNorm2d>(d, 4));
    head = register_module("head", std::make_shared<Sequential>(d));
    head->push_back(std::make_shared<Flatten>(d));
    head->push_back(std::make_shared<Linear>(d, 4 * 4 * 4, 3, rng));
  }
  Tensor forward(const Tensor& x) override { return head->forward(bn->forward_relu(conv->forward(x))); }
  std::shared_ptr<Conv2d> conv;
  std::shared_ptr<BatchNorm2d> bn;
  std::shared_ptr<Sequential> head;
};

Tensor batch(const Device& d) {
  std::vector<float> v(2 * 4 * 4 * 3);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37f * static_cast<float>(i));
  return Tensor::from_host(std::span<const float>(v), {2, 4, 4, 3}, d);
}

std::vector<std::string> names(const NamedTensors& nt) {
  std::vector<std::string> out;
  for (const auto& [n, t] : nt) out.push_back(n);
  return out;
}

}  // namespace

TEST_CASE("module: parameters and buffers in registration order with dotted names", "[nn]") {
  init_devices();
  InitRng rng(1);
  TinyNet net(Device::cpu(), rng);
  CHECK(names(net.named_parameters()) ==
        std::vector<std::string>{"conv.weight", "conv.bias", "bn.weight", "bn.bias",
                                 "head.1.weight", "head.1.bias"});
  CHECK(names(net.named_buffers()) == std::vector<std::string>{"bn.running_mean", "bn.running_var"});
  CHECK(net.num_parameters() == 4 * 3 * 9 + 4 + 4 + 4 + 3 * 64 + 3);
  CHECK(net.head->path() == "head");
  CHECK((*net.head)[1]->path() == "head.1");
  for (const auto& p : net.parameters()) CHECK(p.requires_grad());
  net.eval();
  CHECK_FALSE(net.bn->is_training());
  net.train();
  CHECK(net.bn->is_training());
}

TEST_CASE("module: flat buffers hold every parameter and gradient as views", "[nn]") {
  init_devices();
  InitRng rng(2);
  TinyNet net(Device::cpu(), rng);
  CHECK_THROWS_AS(net.flat_parameters(), InvalidArgument);
  std::vector<float> before;
  for (const auto& p : net.parameters())
    for (float v : p.to_host()) before.push_back(v);
  net.flatten();
  Tensor flat = net.flat_parameters();
  CHECK(flat.numel() == net.num_parameters());
  CHECK(flat.to_host() == before);  // values kept, packed in order without gaps
  // Writing the flat buffer changes the parameters the layers use.
  std::vector<float> twos(static_cast<std::size_t>(flat.numel()), 2.0f);
  flat.copy_from_host(std::span<const float>(twos));
  CHECK(net.conv->weight().to_host()[5] == 2.0f);
  // Gradients land in the flat gradient buffer.
  Tensor x = batch(Device::cpu());
  sum(net.forward(x)).backward();
  const auto g = net.flat_gradients().to_host();
  const auto conv_g = net.conv->weight().grad().to_host();
  CHECK(std::equal(conv_g.begin(), conv_g.end(), g.begin()));
  const auto bias_g = net.named_parameters().back().second.grad().to_host();
  CHECK(std::equal(bias_g.begin(), bias_g.end(), g.end() - 3));
  CHECK(bias_g == std::vector<float>{2, 2, 2});  // d sum(x W^T + b) / db = batch size
  // backward accumulates; zero_grad resets.
  sum(net.forward(x)).backward();
  CHECK(net.named_parameters().back().second.grad().to_host() == std::vector<float>{4, 4, 4});
  net.zero_grad();
  for (float v : net.flat_gradients().to_host()) CHECK(v == 0.0f);
}

TEST_CASE("module: copy_state_from another device, mismatches are named", "[nn]") {
  init_devices();
  InitRng r1(3), r2(4);
  TinyNet a(Device::cpu(0), r1), b(Device::cpu(1), r2);
  a.flatten();
  {
    Tensor y = a.forward(batch(Device::cpu(0)));  // updates a's running statistics
  }
  b.copy_state_from(a);
  CHECK(b.bn->named_buffers()[0].second.to_host() == a.bn->named_buffers()[0].second.to_host());
  a.eval();
  b.eval();
  NoGradGuard no_grad;
  CHECK(b.forward(batch(Device::cpu(1))).to_host() == a.forward(batch(Device::cpu(0))).to_host());
  InitRng r3(5);
  Linear other(Device::cpu(1), 3, 3, r3);
  try {
    other.copy_state_from(a);
    FAIL("no exception");
  } catch (const InvalidArgument& e) {
    CHECK_THAT(e.what(), Catch::Contains("6 parameters") || Catch::Contains("and 6"));
  }
  CHECK_THROWS_AS(Conv2d(Device::cpu(), Conv2dSpec{.in_channels = 0, .out_channels = 1}, r3),
                  InvalidArgument);
}

TEST_CASE("dropout module: fresh masks per call in training, identity in eval", "[nn]") {
  init_devices();
  Dropout drop(Device::cpu(), 0.5f, 9);
  Tensor x = Tensor::full({64}, 1.0f, Device::cpu());
  const auto m1 = drop.forward(x).to_host();
  const auto m2 = drop.forward(x).to_host();
  CHECK(m1 != m2);
  drop.eval();
  CHECK(drop.forward(x).to_host() == x.to_host());
}

TEST_CASE("log_device_placement names every op of a model once, TensorFlow-style", "[nn]") {
  init_devices();
  InitRng rng(6);
  // Wrapped in a Sequential so its op names ("0.conv/Conv2D") are new to this process.
  Sequential net(Device::cpu(1));
  net.push_back(std::make_shared<TinyNet>(Device::cpu(1), rng));
  {
    std::lock_guard lock(g_mu);
    g_lines.clear();
  }
  for (int i = 0; i < 2; ++i) sum(net.forward(batch(Device::cpu(1)))).backward();
  std::lock_guard lock(g_mu);
  const std::string dev = "/job:localhost/replica:0/task:0/device:CPU:1";
  for (const std::string expected :
       {"0.conv/Conv2D: (Conv2D): ", "0.bn/FusedBatchNormRelu: (FusedBatchNormRelu): ",
        "0.head.0/Flatten: (Flatten): ", "0.head.1/MatMul: (MatMul): "}) {
    INFO(expected);
    CHECK(std::count(g_lines.begin(), g_lines.end(), expected + dev) == 1);
  }
}

}  // namespace towerflow::nn
