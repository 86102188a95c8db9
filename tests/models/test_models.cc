// The CIFAR models: names and sizes against PyTorch, a whole ResNet-20 training step against a
// PyTorch fixture, several models on several CPU devices used concurrently, pool reuse.

#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <thread>

#include "core/error.h"
#include "core/memory/allocator.h"
#include "core/nn/init.h"
#include "core/platform/registry.h"
#include "core/tensor/ops.h"
#include "models/models.h"
#include "tests/core/tensor/fixtures.h"

namespace towerflow {
namespace {

using testing::require_close;

// Every test of this executable runs under one process configuration: two logical CPU devices.
void init_devices() { initialise_devices(ProcessOptions{.device_count = {{"CPU", 2}}}); }

std::vector<std::string> names_of(const nn::NamedTensors& named) {
  std::vector<std::string> out;
  for (const auto& [name, t] : named) out.push_back(name);
  return out;
}

Tensor input_batch(std::uint64_t seed, int n, const Device& d) {
  nn::InitRng rng(seed);
  std::vector<float> v(static_cast<std::size_t>(n) * 32 * 32 * 3);
  for (auto& x : v) x = static_cast<float>(2.0 * rng.uniform() - 1.0);
  return Tensor::from_host(std::span<const float>(v), {n, 32, 32, 3}, d);
}

Tensor label_batch(int n, const Device& d) {
  std::vector<std::int32_t> v(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = (i * 7 + 3) % 10;
  return Tensor::from_host(std::span<const std::int32_t>(v), {n}, d);
}

}  // namespace

TEST_CASE("models: names, shapes and sizes match the PyTorch modules", "[models]") {
  init_devices();
  auto resnet = models::make_model("resnet20", Device::cpu());
  std::vector<std::string> expected;
  {
    std::ifstream in(testing::fixture_dir() + "/resnet20_names.txt");
    for (std::string line; std::getline(in, line);) expected.push_back(line);
  }
  REQUIRE(expected.size() == 107);
  std::vector<std::string> ours = names_of(resnet->named_parameters());
  for (const auto& b : names_of(resnet->named_buffers())) ours.push_back(b);
  CHECK(ours == expected);
  // PyTorch's parameter counts (torch_cifar_bench.py's networks).
  CHECK(resnet->num_parameters() == 272474);
  CHECK(models::make_model("resnet110", Device::cpu())->num_parameters() == 1730714);
  auto tfcnn = models::make_model("tfcnn", Device::cpu());
  CHECK(tfcnn->num_parameters() == 1756426);
  CHECK(names_of(tfcnn->named_parameters()) ==
        std::vector<std::string>{"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias",
                                 "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias",
                                 "fc3.weight", "fc3.bias"});
  CHECK(tfcnn->named_parameters()[4].second.shape() == Shape{384, 4096});
  CHECK(resnet->named_parameters()[0].second.shape() == Shape{16, 3, 3, 3});
  for (const auto& name : models::model_names()) {
    auto m = models::make_model(name, Device::cpu(), {.num_classes = 7});
    NoGradGuard no_grad;
    CHECK(m->forward(input_batch(1, 1, Device::cpu())).shape() == Shape{1, 7});  // batch 1
  }
  CHECK(models::forward_macs_per_image("resnet20") == 40813184);  // the peer script: 40.8 M
  CHECK_THROWS_AS(models::make_model("resnet18", Device::cpu()), NotFound);
  try {
    models::make_model("resnet18", Device::cpu());
  } catch (const NotFound& e) {
    CHECK_THAT(e.what(), Catch::Contains("resnet18") && Catch::Contains("resnet20, resnet32"));
  }
}

TEST_CASE("models: initialisation is a pure function of the seed", "[models]") {
  init_devices();
  auto a = models::make_model("resnet20", Device::cpu(0), {.seed = 3});
  auto b = models::make_model("resnet20", Device::cpu(1), {.seed = 3});
  auto c = models::make_model("resnet20", Device::cpu(0), {.seed = 4});
  CHECK(a->flat_parameters().to_host() == b->flat_parameters().to_host());
  CHECK(a->flat_parameters().to_host() != c->flat_parameters().to_host());
  // Kaiming-normal fan_out for conv1 (std sqrt(2 / (16 * 9)) = 0.118), PyTorch's bound for fc.
  const auto w = a->named_parameters()[0].second.to_host();
  double sq = 0;
  for (float v : w) sq += v * v;
  CHECK(std::sqrt(sq / w.size()) == Approx(std::sqrt(2.0 / 144)).epsilon(0.15));
  for (const auto& [name, t] : a->named_parameters())
    if (name == "fc.weight")
      for (float v : t.to_host()) CHECK(std::abs(v) <= 1.0 / 8.0);
}

TEST_CASE("resnet20: one training step matches PyTorch (logits, loss, gradients, running "
          "statistics, eval logits)", "[models][torch]") {
  init_devices();
  const auto fx = testing::load_fixture("resnet20_step.bin");
  auto model = models::make_model("resnet20", Device::cpu());
  // The fixture's weights: InitRng(42) drawn tensor by tensor, parameters then buffers, with the
  // rule of make_compute_fixtures.py's model_value_rule().
  nn::InitRng rng(42);
  auto fill = [&](const std::string& name, Tensor t) {
    std::vector<float> v(static_cast<std::size_t>(t.numel()));
    const auto ends = [&](const char* s) { return name.ends_with(s); };
    const double fan_in = t.ndim() > 1 ? static_cast<double>(t.numel() / t.dim(0)) : 1.0;
    for (auto& x : v) {
      const double u = rng.uniform();
      double val;
      if (ends("running_mean") || ends(".bias")) val = 0.1 * (2 * u - 1);
      else if (ends("running_var")) val = 1.0 + 0.5 * u;
      else if (t.ndim() == 1) val = 1.0 + 0.1 * (2 * u - 1);
      else val = (2 * u - 1) / std::sqrt(fan_in);
      x = static_cast<float>(val);
    }
    t.copy_from_host(std::span<const float>(v));
  };
  for (const auto& [name, t] : model->named_parameters()) fill(name, t);
  for (const auto& [name, t] : model->named_buffers()) fill(name, t);

  Tensor x = input_batch(7, 2, Device::cpu());
  Tensor labels = Tensor::from_host(std::vector<std::int32_t>{3, 7}, {2}, Device::cpu());
  model->zero_grad();
  Tensor logits = model->forward(x);
  Tensor loss = softmax_cross_entropy(logits, labels);
  loss.backward();
  require_close(logits.to_host(), fx.at("logits").f, 1e-3, 1e-4, "logits");
  require_close({loss.item()}, fx.at("loss").f, 1e-4, 1e-5, "loss");

  const auto params = model->named_parameters();
  const auto& sums = fx.at("grad_sum").f;
  const auto& sumsq = fx.at("grad_sumsq").f;
  REQUIRE(sums.size() == params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto g = params[i].second.grad().to_host();
    double s = 0, s2 = 0;
    for (float v : g) {
      s += v;
      s2 += static_cast<double>(v) * v;
    }
    INFO(params[i].first << ": sum " << s << " vs " << sums[i] << ", sum of squares " << s2
                         << " vs " << sumsq[i]);
    CHECK(s2 == Approx(sumsq[i]).epsilon(5e-3).margin(1e-12));
    CHECK(std::abs(s - sums[i]) <= 2e-3 * std::sqrt(sumsq[i] * g.size()) + 1e-7);
  }
  for (const auto& [name, p] : params) {
    auto it = fx.find("grad." + name);
    if (it == fx.end()) continue;
    float max_abs = 0;
    for (float v : it->second.f) max_abs = std::max(max_abs, std::abs(v));
    require_close(p.grad().to_host(), it->second.f, 5e-3, 2e-3 * max_abs, "grad " + name);
  }
  for (const auto& [name, b] : model->named_buffers()) {
    auto it = fx.find("after." + name);
    if (it != fx.end()) require_close(b.to_host(), it->second.f, 1e-4, 1e-5, name);
  }
  model->eval();
  NoGradGuard no_grad;
  require_close(model->forward(x).to_host(), fx.at("eval_logits").f, 1e-3, 1e-4, "eval logits");
}

TEST_CASE("models on two CPU devices train concurrently from two threads and agree",
          "[models][threads]") {
  init_devices();
  for (const std::string name : {"resnet20", "tfcnn"}) {
    INFO(name);
    std::shared_ptr<Module> m[2];
    std::vector<float> grads[2];
    float losses[2];
    for (int d = 0; d < 2; ++d) m[d] = models::make_model(name, Device::cpu(d), {.seed = 11});
    auto run = [&](int d) {
      const Device dev = Device::cpu(d);
      Tensor x = input_batch(5, 4, dev);
      Tensor y = label_batch(4, dev);
      m[d]->zero_grad();
      Tensor loss = softmax_cross_entropy(m[d]->forward(x), y, {.scale = 8.0f});
      loss.backward();
      losses[d] = loss.item();
      grads[d] = m[d]->flat_gradients().to_host();
    };
    std::thread t0(run, 0), t1(run, 1);
    t0.join();
    t1.join();
    CHECK(losses[0] == losses[1]);
    CHECK(grads[0] == grads[1]);
    double norm = 0;
    for (float g : grads[0]) norm += g * g;
    CHECK(norm > 0);
  }
}

TEST_CASE("copy_state_from moves a model's state to another device", "[models]") {
  init_devices();
  auto src = models::make_model("resnet20", Device::cpu(0), {.seed = 1});
  auto dst = models::make_model("resnet20", Device::cpu(1), {.seed = 2});
  {  // a training-mode forward changes src's running statistics
    Tensor loss = softmax_cross_entropy(src->forward(input_batch(2, 4, Device::cpu(0))),
                                        label_batch(4, Device::cpu(0)));
  }
  dst->copy_state_from(*src);
  src->eval();
  dst->eval();
  NoGradGuard no_grad;
  CHECK(dst->forward(input_batch(3, 2, Device::cpu(1))).to_host() ==
        src->forward(input_batch(3, 2, Device::cpu(0))).to_host());
  auto other = models::make_model("tfcnn", Device::cpu(1));
  CHECK_THROWS_AS(other->copy_state_from(*src), InvalidArgument);
}

TEST_CASE("a steady-state ResNet-20 step takes no new pool region", "[models][memory]") {
  init_devices();
  const Device dev = Device::cpu(1);
  auto model = models::make_model("resnet20", dev);
  Tensor x = input_batch(9, 8, dev);
  Tensor y = label_batch(8, dev);
  auto step = [&] {
    model->zero_grad();
    softmax_cross_entropy(model->forward(x), y).backward();
  };
  step();
  step();
  const AllocatorStats before = device_allocator(dev).stats();
  for (int i = 0; i < 2; ++i) step();
  const AllocatorStats after = device_allocator(dev).stats();
  CHECK(after.num_regions == before.num_regions);
  CHECK(after.pool_bytes == before.pool_bytes);
}

}  // namespace towerflow
