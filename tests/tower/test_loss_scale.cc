// fp16 and its dynamic loss scaling (tower/loss_scale.h): the scaler's rules, and the trainer
// skipping overflowing steps (parameters, optimizer state and step count untouched), backing off,
// growing, and training as fp32 does once the scale fits.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>

#include "core/error.h"
#include "core/tensor/ops.h"
#include "optim/optim.h"
#include "tests/tower/four_cpu_devices.h"
#include "tower/tower.h"

using namespace towerflow;
using namespace towerflow::tower;

nn::ModelFactory models_for_test();  // a small MLP, below

TEST_CASE("the loss scaler backs off on overflow, grows after the interval, and counts skipped steps", "[loss_scale]") {
  LossScaler s({.initial_scale = 1024, .growth_factor = 2, .backoff_factor = 0.25, .growth_interval = 3});
  CHECK(s.scale() == 1024);
  CHECK(s.update(true));
  CHECK(s.update(true));
  CHECK(s.scale() == 1024);
  CHECK(s.update(true));  // the third good step in a row: growth
  CHECK(s.scale() == 2048);
  CHECK(s.state().good_steps == 0);
  CHECK(s.update(true));
  CHECK_FALSE(s.update(false));  // overflow: skipped, backed off, the good run restarts
  CHECK(s.last_step_skipped());
  CHECK(s.scale() == 512);
  CHECK(s.state().good_steps == 0);
  CHECK(s.state().skipped_steps == 1);
  CHECK(s.update(true));
  CHECK_FALSE(s.last_step_skipped());
  CHECK(s.update(true));
  CHECK(s.scale() == 512);  // two good steps since the back-off: not yet
  CHECK(s.update(true));
  CHECK(s.scale() == 1024);
  // It never backs off to zero, nor grows past float's range.
  LossScaler tiny({.initial_scale = 1e-37, .backoff_factor = 0.5});
  for (int i = 0; i < 10; ++i) tiny.update(false);
  CHECK(tiny.scale() > 0);
  LossScaler huge({.initial_scale = 1e38, .growth_interval = 1});
  for (int i = 0; i < 10; ++i) huge.update(true);
  CHECK(std::isfinite(static_cast<float>(huge.scale())));
  CHECK_THAT(s.describe(), Catch::Contains("dynamic loss scaling from 1024"));
}

TEST_CASE("loss scale options that cannot work are refused, naming the field and a usual value", "[loss_scale]") {
  CHECK_THROWS_WITH(LossScaler({.initial_scale = 0}), Catch::Contains("initial_scale = 0") && Catch::Contains("65536"));
  CHECK_THROWS_WITH(LossScaler({.growth_factor = 1}), Catch::Contains("growth_factor = 1") && Catch::Contains("> 1"));
  CHECK_THROWS_WITH(LossScaler({.backoff_factor = 1.5}), Catch::Contains("backoff_factor = 1.5"));
  CHECK_THROWS_WITH(LossScaler({.growth_interval = 0}), Catch::Contains("growth_interval = 0"));
  LossScaler s;
  CHECK_THROWS_WITH(s.load_state({.scale = -1}), Catch::Contains("scale -1"));
  CHECK_THROWS_AS(Trainer(models_for_test(), testing::cpus(1), {.precision = Precision::Fp16, .loss_scale = {.growth_interval = -3}}),
                  InvalidArgument);
}

namespace {

constexpr int kIn = 48, kHidden = 32, kClasses = 5;

// x -> linear -> relu -> linear, as [n, 4, 4, 3] images.
class Mlp : public nn::Module {
 public:
  explicit Mlp(const Device& d) : Module(d) {
    std::mt19937 rng(3);
    auto init = [&](Shape shape, float bound) {
      std::uniform_real_distribution<float> u(-bound, bound);
      std::vector<float> v(static_cast<std::size_t>(shape_numel(shape)));
      for (float& x : v) x = u(rng);
      return Tensor::from_host(v, shape, d).set_requires_grad(true);
    };
    register_parameter("fc1.weight", init({kHidden, kIn}, 0.3f));
    register_parameter("fc1.bias", init({kHidden}, 0.1f));
    register_parameter("fc2.weight", init({kClasses, kHidden}, 0.3f));
    register_parameter("fc2.bias", init({kClasses}, 0.1f));
    flatten();
    for (auto& [name, t] : named_parameters()) p_[name] = t;
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = relu(linear(towerflow::flatten(x), p_["fc1.weight"], p_["fc1.bias"]));
    return linear(h, p_["fc2.weight"], p_["fc2.bias"]);
  }

 private:
  std::map<std::string, Tensor> p_;
};

struct Data {
  std::vector<float> images;
  std::vector<std::int32_t> labels;
  HostBatch batch(int offset, int rows) const {
    return {.images = std::span<const float>(images).subspan(std::size_t(offset) * kIn, std::size_t(rows) * kIn),
            .labels = std::span<const std::int32_t>(labels).subspan(offset, rows),
            .n = rows, .h = 4, .w = 4, .c = 3};
  }
};

Data make_data(int n) {
  std::mt19937 rng(11);
  std::normal_distribution<float> g(0.f, 1.f);
  Data d{std::vector<float>(std::size_t(n) * kIn), std::vector<std::int32_t>(n)};
  for (float& x : d.images) x = g(rng);
  for (auto& y : d.labels) y = static_cast<std::int32_t>(rng() % kClasses);
  return d;
}

}  // namespace

nn::ModelFactory models_for_test() {
  return [](const Device& d) { return std::make_shared<Mlp>(d); };
}

TEST_CASE("fp16: a scale too large overflows, the step is skipped untouched, and the scale backs off until it fits",
          "[loss_scale][fp16]") {
  const int B = 16;
  const Data data = make_data(B * 30);
  for (int towers : {1, 2}) {
    INFO(towers << " towers");
    // 2^40: the first gradients overflow fp16's 65504 as soon as they are rounded.
    Trainer trainer(models_for_test(), testing::cpus(towers),
                    {.precision = Precision::Fp16, .loss_scale = {.initial_scale = std::ldexp(1.0, 40), .growth_interval = 1000}});
    optim::Sgd sgd(trainer.parameters(), {.lr = 0.05, .momentum = 0.9});
    REQUIRE(trainer.loss_scaler() != nullptr);
    // The start-up block says what fp16 runs on (CPUs have no fp16 product kernels) and the scaling.
    CHECK_THAT(trainer.describe(),
               Catch::Contains("fp16 convolutions and matrix products (fp32 accumulation; emulated: "
                               "operands rounded to fp16 for the fp32 kernels, slower than fp32); "
                               "dynamic loss scaling from"));
    int skipped = 0, applied = 0;
    for (int step = 0; step < 30; ++step) {
      const auto before = trainer.model().flat_parameters().to_host();
      const std::int64_t count = sgd.step_count();
      const double scale = trainer.loss_scaler()->scale();
      const float loss = trainer.forward_backward(data.batch(step * B, B));
      sgd.step();
      const auto after = trainer.model().flat_parameters().to_host();
      CHECK(std::isfinite(loss));  // the reported loss is the true one, not the scaled one
      CHECK(trainer.last_step().loss_scale == scale);
      if (trainer.last_step().skipped) {
        ++skipped;
        CHECK(std::memcmp(before.data(), after.data(), before.size() * sizeof(float)) == 0);
        CHECK(sgd.step_count() == count);
        CHECK(trainer.loss_scaler()->scale() == scale / 2);
      } else {
        ++applied;
        CHECK(before != after);
        CHECK(sgd.step_count() == count + 1);
      }
    }
    INFO("skipped " << skipped << ", applied " << applied << ", final scale " << trainer.loss_scaler()->scale());
    CHECK(skipped >= 10);  // from 2^40 down to where the gradients fit
    CHECK(applied >= 5);
    CHECK(trainer.loss_scaler()->state().skipped_steps == skipped);
    CHECK(trainer.loss_scaler()->scale() == std::ldexp(1.0, 40 - skipped));  // halved once per skip, never grown
    // Every replica applied the same steps.
    for (int i = 1; i < towers; ++i)
      CHECK(trainer.replica(i).flat_parameters().to_host() == trainer.model().flat_parameters().to_host());
  }
}

TEST_CASE("fp16 with the default loss scaling trains as fp32 does, and fp16 products are fp32 ones on fp16 operands",
          "[loss_scale][fp16]") {
  const int B = 24, K = 20;
  const Data data = make_data(B * K);
  auto run = [&](Precision p, std::vector<float>* losses) {
    Trainer trainer(models_for_test(), testing::cpus(2), {.precision = p});
    optim::Sgd sgd(trainer.parameters(), {.lr = 0.05, .momentum = 0.9});
    for (int s = 0; s < K; ++s) {
      losses->push_back(trainer.forward_backward(data.batch(s * B, B)));
      CHECK_FALSE(trainer.last_step().skipped);
      sgd.step();
    }
    return trainer.model().flat_parameters().to_host();
  };
  std::vector<float> l32, l16;
  const auto p32 = run(Precision::Fp32, &l32);
  const auto p16 = run(Precision::Fp16, &l16);
  double worst = 0;
  for (int s = 0; s < K; ++s) worst = std::max(worst, std::abs(double(l16[s]) - l32[s]));
  INFO("largest loss difference over " << K << " steps: " << worst);
  CHECK(worst < 5e-3);
  CHECK(l16.back() < l16.front());
  CHECK(p16 != p32);  // fp16 did round something

  // One product: exactly fp32 on operands rounded to fp16 (10 fraction bits, overflow to inf).
  const std::vector<float> a{1.0f + 1.0f / 4096, 70000.0f, -3.14159265f, 1e-9f}, b{1.0f, 1.0f, 2.0f, 1.0f};
  const Tensor ta = Tensor::from_host(a, {1, 4}, Device::cpu(0)), tb = Tensor::from_host(b, {4, 1}, Device::cpu(0));
  const PrecisionScope fp16(Precision::Fp16);
  const float y = matmul(ta, tb).to_host()[0];
  CHECK(std::isinf(y));  // 70000 rounds to infinity in fp16
  const std::vector<float> a2{1.0f + 1.0f / 4096, -3.14159265f, 1e-9f}, b2{1.0f, 2.0f, 1.0f};
  const float y2 = matmul(Tensor::from_host(a2, {1, 3}, Device::cpu(0)), Tensor::from_host(b2, {3, 1}, Device::cpu(0))).to_host()[0];
  // 1 + 2^-12 rounds to 1, pi to 3.140625, 1e-9 to 0 (below 2^-25).
  CHECK(y2 == 1.0f - 2 * 3.140625f);
}
