#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <thread>

#include "bf16_paths.h"
#include "core/collectives/context.h"
#include "core/cpu/bf16.h"
#include "core/error.h"
#include "core/log.h"
#include "core/platform/registry.h"
#include "core/tensor/ops.h"
#include "optim/optim.h"
#include "tower/tower.h"
#include "tests/tower/four_cpu_devices.h"

using namespace towerflow;
using namespace towerflow::tower;

namespace {

constexpr int kH = 4, kW = 4, kC = 3, kClasses = 5, kHidden = 16;

// Failure injection for the failing-tower test: a forward on this device throws OutOfMemory.
std::atomic<int> g_fail_on_cpu{-1};
// Stall injection for the stall report test: a forward on this device first sleeps 1 s.
std::atomic<int> g_sleep_on_cpu{-1};
// A slow device for the auto split test: a forward on this device sleeps 200 us per row.
std::atomic<int> g_slow_cpu{-1};

// A small MLP without batch statistics: flatten -> linear -> relu -> linear.
class Mlp : public nn::Module {
 public:
  Mlp(const Device& d, unsigned seed, bool with_batch_norm) : Module(d), bn_(with_batch_norm) {
    std::mt19937 rng(seed);
    auto init = [&](Shape shape, float bound) {
      std::uniform_real_distribution<float> u(-bound, bound);
      std::vector<float> v(static_cast<std::size_t>(shape_numel(shape)));
      for (float& x : v) x = u(rng);
      return Tensor::from_host(v, shape, d).set_requires_grad(true);
    };
    register_parameter("fc1.weight", init({kHidden, kH * kW * kC}, 0.3f));
    register_parameter("fc1.bias", init({kHidden}, 0.1f));
    if (bn_) {
      register_parameter("bn.weight", Tensor::full({kHidden}, 1.0f, d).set_requires_grad(true));
      register_parameter("bn.bias", Tensor::zeros({kHidden}, d).set_requires_grad(true));
      register_buffer("bn.running_mean", Tensor::zeros({kHidden}, d));
      register_buffer("bn.running_var", Tensor::full({kHidden}, 1.0f, d));
    }
    register_parameter("fc2.weight", init({kClasses, kHidden}, 0.3f));
    register_parameter("fc2.bias", init({kClasses}, 0.1f));
    flatten();
    // Handles taken after flatten(): the parameters are views into the flat buffer now.
    for (auto& [name, t] : named_parameters()) p_[name] = t;
    for (auto& [name, t] : named_buffers()) p_[name] = t;
  }

  Tensor forward(const Tensor& x) override {
    if (device().is_cpu() && device().index == g_fail_on_cpu.load())
      raise<OutOfMemory>("out of memory on ", device(), ": 1.0 MiB requested, 0 free (test)");
    if (device().is_cpu() && device().index == g_sleep_on_cpu.load())
      std::this_thread::sleep_for(std::chrono::seconds(1));
    if (device().is_cpu() && device().index == g_slow_cpu.load())
      std::this_thread::sleep_for(std::chrono::microseconds(200 * x.shape()[0]));
    Tensor h = linear(towerflow::flatten(x), p_["fc1.weight"], p_["fc1.bias"]);
    if (bn_)
      h = batch_norm(h, p_["bn.weight"], p_["bn.bias"], p_["bn.running_mean"], p_["bn.running_var"],
                     {.training = is_training()});
    return linear(relu(h), p_["fc2.weight"], p_["fc2.bias"]);
  }

 private:
  bool bn_;
  std::map<std::string, Tensor> p_;
};

nn::ModelFactory mlp_factory(unsigned seed, bool bn = false) {
  // Each device gets a different seed: replication must still make every replica identical.
  return [seed, bn](const Device& d) { return std::make_shared<Mlp>(d, seed + 17 * d.index, bn); };
}

struct Data {
  std::vector<float> images;
  std::vector<std::int32_t> labels;
  int n;
  HostBatch batch(int offset, int rows) const {
    const std::size_t row = kH * kW * kC;
    return {.images = std::span<const float>(images).subspan(offset * row, rows * row),
            .labels = std::span<const std::int32_t>(labels).subspan(offset, rows),
            .n = rows, .h = kH, .w = kW, .c = kC};
  }
};

Data make_data(int n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  Data d{std::vector<float>(static_cast<std::size_t>(n) * kH * kW * kC), std::vector<std::int32_t>(n), n};
  for (float& x : d.images) x = g(rng);
  for (auto& y : d.labels) y = static_cast<std::int32_t>(rng() % kClasses);
  return d;
}

using towerflow::testing::cpus;

std::vector<float> flat_params(nn::Module& m) { return m.flat_parameters().to_host(); }

// Trains K steps of SGD with momentum and weight decay; returns replica 0's final parameters.
// Checks after every step that every replica holds the same bits (all-reduce) and that the loss
// is finite.
std::vector<float> train(int towers, TrainerOptions options, const Data& data, int batch, int steps,
                         std::vector<float>* losses = nullptr) {
  Trainer trainer(mlp_factory(7), cpus(towers), options);
  optim::Sgd sgd(trainer.parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3});
  for (int s = 0; s < steps; ++s) {
    const float loss = trainer.forward_backward(data.batch(s * batch, batch));
    REQUIRE(std::isfinite(loss));
    if (losses) losses->push_back(loss);
    sgd.step();
    if (std::holds_alternative<AllReduce>(trainer.reduction())) {
      const auto p0 = flat_params(trainer.replica(0));
      for (int i = 1; i < towers; ++i) {
        const auto pi = flat_params(trainer.replica(i));
        REQUIRE(std::memcmp(p0.data(), pi.data(), p0.size() * sizeof(float)) == 0);
      }
    }
  }
  return flat_params(trainer.model());
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double scale = 0, err = 0;
  for (float x : b) scale = std::max(scale, std::abs(double(x)));
  for (std::size_t i = 0; i < a.size(); ++i) err = std::max(err, std::abs(double(a[i]) - b[i]));
  return err / scale;
}

}  // namespace

TEST_CASE("one tower computes the plain model's global-batch mean loss", "[tower]") {
  const Data data = make_data(24, 1);
  Trainer trainer(mlp_factory(7), cpus(1), {});
  const float loss = trainer.forward_backward(data.batch(0, 24));
  // An independent reference: the same model, the same batch, without the trainer.
  auto ref = mlp_factory(7)(Device::cpu(0));
  Tensor x = Tensor::from_host(data.batch(0, 24).images, {24, kH, kW, kC}, Device::cpu(0));
  Tensor y = Tensor::from_host(data.batch(0, 24).labels, {24}, Device::cpu(0));
  Tensor ref_loss = softmax_cross_entropy(ref->forward(x), y);
  CHECK(loss == Approx(ref_loss.item()).epsilon(1e-6));
  ref_loss.backward();
  const auto g = trainer.model().flat_gradients().to_host();
  const auto g_ref = ref->flat_gradients().to_host();
  CHECK(max_rel_diff(g, g_ref) < 1e-6);
}

TEST_CASE("1, 2 and 4 towers, even and 3:1, both reductions, with accumulation: same parameters",
          "[tower][equivalence]") {
  const int B = 24, K = 4;
  const Data data = make_data(B * K, 2);
  std::vector<float> ref_losses;
  const auto reference = train(1, {}, data, B, K, &ref_losses);

  struct Case {
    const char* name;
    int towers;
    TrainerOptions options;
  };
  const std::vector<Case> cases = {
      {"2 towers, all-reduce", 2, {.reduction = AllReduce{}}},
      {"4 towers, all-reduce", 4, {.reduction = AllReduce{}}},
      {"2 towers 3:1, all-reduce", 2, {.reduction = AllReduce{}, .split = WeightedSplit{{3, 1}}}},
      {"2 towers, parameter device", 2, {.reduction = ParameterDevice{}}},
      {"4 towers, parameter device /cpu:2", 4, {.reduction = ParameterDevice{Device::cpu(2)}}},
      {"2 towers 3:1, parameter device", 2, {.reduction = ParameterDevice{}, .split = WeightedSplit{{3, 1}}}},
      {"2 towers, bucketed (1 KiB buckets)", 2, {.reduction = AllReduce{.bucket_bytes = 1024}}},
      {"4 towers, bucketed (1 KiB buckets)", 4, {.reduction = AllReduce{.bucket_bytes = 1024}}},
      {"2 towers, all-reduce, 3 micro-batches", 2, {.reduction = AllReduce{}, .accumulation_steps = 3}},
      {"2 towers 3:1, parameter device, 2 micro-batches", 2,
       {.reduction = ParameterDevice{}, .split = WeightedSplit{{3, 1}}, .accumulation_steps = 2}},
      {"1 tower, 4 micro-batches", 1, {.accumulation_steps = 4}},
      {"2 towers, bucketed, 2 micro-batches", 2,
       {.reduction = AllReduce{.bucket_bytes = 512}, .accumulation_steps = 2}},
  };
  for (const Case& c : cases) {
    std::vector<float> losses;
    const auto params = train(c.towers, c.options, data, B, K, &losses);
    const double diff = max_rel_diff(params, reference);
    INFO(c.name << ": max relative parameter difference " << diff);
    CHECK(diff < 2e-5);
    for (int s = 0; s < K; ++s) CHECK(losses[s] == Approx(ref_losses[s]).epsilon(1e-5));
  }
}

TEST_CASE("replicas start from a given module's parameters and buffers", "[tower]") {
  auto initial = mlp_factory(99, true)(cpus(4)[3]);
  Trainer trainer(*initial, mlp_factory(1, true), cpus(2), {});
  const auto expect = flat_params(*initial);
  for (int i = 0; i < 2; ++i) {
    CHECK(flat_params(trainer.replica(i)) == expect);
    CHECK(trainer.replica(i).device() == Device::cpu(i));
  }
  CHECK(flat_params(trainer.replica(0)) != flat_params(*mlp_factory(1, true)(Device::cpu(0))));
}

TEST_CASE("the parameters really move (the equivalence test is not vacuous)", "[tower]") {
  const Data data = make_data(48, 3);
  Trainer trainer(mlp_factory(7), cpus(2), {});
  const auto before = flat_params(trainer.model());
  optim::Sgd sgd(trainer.parameters(), {.lr = 0.1});
  trainer.forward_backward(data.batch(0, 24));
  sgd.step();
  CHECK(max_rel_diff(flat_params(trainer.model()), before) > 1e-3);
  CHECK(trainer.timings().steps == 1);
  CHECK(trainer.timings().step_seconds > 0);
  CHECK(trainer.timings().optimizer_seconds > 0);
  CHECK(trainer.last_step().split == std::vector<int>{12, 12});
}

TEST_CASE("bucketed reduction starts buckets while backward is still running", "[tower][bucketed]") {
  const Data data = make_data(48, 8);
  // 256-byte buckets: fc2 (80 + 5 floats) and fc1 (768 + 16) land in separate buckets, and fc2's
  // gradients are final before fc1's backward runs.
  Trainer trainer(mlp_factory(7), cpus(2), {.reduction = AllReduce{.bucket_bytes = 256}});
  CHECK_THAT(trainer.describe(), Catch::Contains("bucketed all_reduce (4 buckets"));
  trainer.forward_backward(data.batch(0, 24));
  // Every bucket is handed to the reduction from inside backward, the moment autograd says its
  // parameters' gradients are final: fc2's buckets before fc1's backward has run.
  CHECK(trainer.timings().buckets_reduced_during_backward == 2 * 4);
}

TEST_CASE("a tower that throws fails the step with its device's error and changes nothing",
          "[tower][failure]") {
  const Data data = make_data(48, 4);
  for (TrainerOptions options : {TrainerOptions{.reduction = AllReduce{}},
                                 TrainerOptions{.reduction = AllReduce{.bucket_bytes = 256}},
                                 TrainerOptions{.reduction = ParameterDevice{}}}) {
    INFO(to_string(options.reduction));
    Trainer trainer(mlp_factory(9, /*bn=*/true), cpus(3), options);
    optim::Sgd sgd(trainer.parameters(), {.lr = 0.1, .momentum = 0.9});
    trainer.forward_backward(data.batch(0, 24));
    sgd.step();
    trainer.sync();
    std::vector<std::vector<float>> params, buffers;
    for (int i = 0; i < 3; ++i) {
      params.push_back(flat_params(trainer.replica(i)));
      buffers.push_back(trainer.replica(i).named_buffers()[0].second.to_host());
    }
    const auto master = flat_params(trainer.model());

    g_fail_on_cpu = 1;
    REQUIRE_THROWS_AS(trainer.forward_backward(data.batch(24, 24)), OutOfMemory);
    REQUIRE_THROWS_WITH(trainer.forward_backward(data.batch(24, 24)), Catch::Contains("/cpu:1"));
    g_fail_on_cpu = -1;
    for (int i = 0; i < 3; ++i) {
      CHECK(flat_params(trainer.replica(i)) == params[i]);
      CHECK(trainer.replica(i).named_buffers()[0].second.to_host() == buffers[i]);
    }
    CHECK(flat_params(trainer.model()) == master);
    CHECK(sgd.step_count() == 1);
    // The trainer recovers: the next step runs on every tower.
    CHECK(std::isfinite(trainer.forward_backward(data.batch(24, 24))));
    sgd.step();
  }
}

TEST_CASE("running averages stay identical on every replica, as the global batch's mean", "[tower][bn]") {
  const Data data = make_data(32, 5);
  Trainer one(mlp_factory(3, true), cpus(1), {});
  Trainer two(mlp_factory(3, true), cpus(2), {.split = WeightedSplit{{3, 1}}});
  one.forward_backward(data.batch(0, 32));
  two.forward_backward(data.batch(0, 32));
  const auto mean0 = two.replica(0).named_buffers()[0].second.to_host();
  const auto mean1 = two.replica(1).named_buffers()[0].second.to_host();
  CHECK(std::memcmp(mean0.data(), mean1.data(), mean0.size() * sizeof(float)) == 0);
  // Running mean after one step: (1 - m) * 0 + m * (slice mean); the row-weighted average of the
  // slices' means is the global batch's mean, i.e. what one tower computes.
  const auto ref = one.replica(0).named_buffers()[0].second.to_host();
  CHECK(max_rel_diff(mean0, ref) < 1e-5);
  CHECK(max_rel_diff(mean0, std::vector<float>(mean0.size(), 0.0f)) > 0);  // it did move
}

TEST_CASE("evaluation splits any batch across towers and agrees with one tower", "[tower][eval]") {
  const Data data = make_data(23, 6);
  Trainer one(mlp_factory(4, true), cpus(1), {});
  Trainer three(mlp_factory(4, true), cpus(3), {});
  const EvalResult a = one.evaluate(data.batch(0, 23));
  const EvalResult b = three.evaluate(data.batch(0, 23));
  CHECK(a.rows == 23);
  CHECK(b.rows == 23);
  CHECK(b.correct == a.correct);
  CHECK(b.loss == Approx(a.loss).epsilon(1e-5));
  CHECK(b.accuracy == Approx(static_cast<double>(a.correct) / 23));
  CHECK(three.replica(1).is_training());  // training mode restored
}

TEST_CASE("bad set-ups and batches are refused with the value and the fix", "[tower]") {
  const Data data = make_data(25, 7);
  Trainer two(mlp_factory(1), cpus(2), {});
  REQUIRE_THROWS_WITH(two.forward_backward(data.batch(0, 25)),
                      Catch::Contains("batch 25") && Catch::Contains("use batch 24 or 26"));
  Trainer spread(mlp_factory(1), cpus(2), {.remainder = Remainder::Spread});
  CHECK(std::isfinite(spread.forward_backward(data.batch(0, 25))));
  CHECK(spread.last_step().split == std::vector<int>{13, 12});
  REQUIRE_THROWS_WITH((Trainer(mlp_factory(1), {Device::cpu(0), Device::cpu(0)}, {})),
                      Catch::Contains("/cpu:0 appears twice"));
  REQUIRE_THROWS_WITH((Trainer(mlp_factory(1), cpus(2), {.split = WeightedSplit{{1, 2, 3}}})),
                      Catch::Contains("3 weights for 2 devices"));
  REQUIRE_THROWS_WITH((Trainer(mlp_factory(1), cpus(2), {.accumulation_steps = 0})),
                      Catch::Contains("accumulation_steps 0"));
  // Synchronised batch norm reaches nn::BatchNorm2d layers; this model has none (it calls the op
  // itself), so it trains as with per-tower statistics (tests/tower/test_sync_batch_norm.cc).
  CHECK_THAT(Trainer(mlp_factory(1, true), cpus(2), {.batch_norm = BatchNormMode::Synchronised}).describe(),
             Catch::Contains("no nn::BatchNorm2d layer"));
  auto wrong_device = [](const Device&) { return std::make_shared<Mlp>(Device::cpu(0), 1, false); };
  REQUIRE_THROWS_WITH((Trainer(wrong_device, cpus(2), {})), Catch::Contains("when asked for /cpu:1"));
  CHECK_THAT(two.describe(), Catch::Contains("2 towers on /cpu:0, /cpu:1") &&
                                 Catch::Contains("local shared-memory"));
}

TEST_CASE("bf16 training tracks fp32: the same losses to bf16's precision, different bits", "[tower][bf16]") {
  const int B = 24, K = 20;
  const Data data = make_data(B * K, 12);
  std::vector<float> fp32_losses;
  const auto fp32 = train(2, {}, data, B, K, &fp32_losses);
  // Every bf16 path this CPU runs (tests/bf16_paths.h).
  const std::vector<cpu::Bf16Kernels> paths = testing::bf16_paths();
  const testing::AutomaticBf16Kernels automatic;
  for (const cpu::Bf16Kernels path : paths) {
    cpu::force_bf16_kernels_for_testing(path);
    INFO("bf16 kernels: " << cpu::describe_bf16_kernels());
    std::vector<float> bf16_losses;
    const auto bf16 = train(2, {.precision = Precision::Bf16}, data, B, K, &bf16_losses);
    double worst = 0;
    for (int s = 0; s < K; ++s) worst = std::max(worst, std::abs(double(bf16_losses[s]) - fp32_losses[s]));
    INFO("largest loss difference over " << K << " steps: " << worst << "; first loss " << fp32_losses[0]
                                          << ", last " << fp32_losses[K - 1]);
    CHECK(worst < 0.02);
    CHECK(fp32_losses[K - 1] < fp32_losses[0]);  // it learns
    CHECK(bf16_losses[K - 1] < bf16_losses[0]);
    // Measured on this set-up: losses within 0.004 of fp32's at every step, parameters 4.4% apart
    // (relative to the largest) after 20 steps of SGD with momentum, on either path.
    CHECK(max_rel_diff(bf16, fp32) > 0);  // bf16 did round something
    CHECK(max_rel_diff(bf16, fp32) < 0.1);
    Trainer t(mlp_factory(7), cpus(2), {.precision = Precision::Bf16});
    const bool amx = path == cpu::Bf16Kernels::Amx || path == cpu::Bf16Kernels::AmxEmulated;
    const char* named = path == cpu::Bf16Kernels::OneDnn     ? "fp32 accumulation; oneDNN"
                        : path == cpu::Bf16Kernels::Emulated ? "fp32 accumulation; emulated"
                        : amx                                ? "fp32 accumulation; towerflow's AMX kernels"
                                                             : "fp32 accumulation; towerflow's AVX512-BF16 kernels";
    CHECK_THAT(t.describe(), Catch::Contains(std::string("bf16 convolutions and matrix products (") + named));
  }
}

TEST_CASE("bf16: towers, reductions and accumulation train as one tower does in bf16", "[tower][bf16][equivalence]") {
  // The products round the same rows' operands whatever tower holds them, so splitting the batch
  // only changes the order of fp32 sums, as in fp32 -- up to the rare operand that those
  // differences push across a bf16 rounding boundary in a later step.
  const int B = 24, K = 4;
  const Data data = make_data(B * K, 2);
  const auto fp32 = train(1, {}, data, B, K);
  // On every bf16 path this CPU runs (tests/bf16_paths.h).
  const std::vector<cpu::Bf16Kernels> paths = testing::bf16_paths();
  const testing::AutomaticBf16Kernels automatic;
  for (const cpu::Bf16Kernels path : paths) {
    cpu::force_bf16_kernels_for_testing(path);
    INFO("bf16 kernels: " << cpu::bf16_kernels_name(path));
    std::vector<float> ref_losses;
    const auto reference = train(1, {.precision = Precision::Bf16}, data, B, K, &ref_losses);
    struct Case {
      const char* name;
      int towers;
      TrainerOptions options;
    };
    const std::vector<Case> cases = {
        {"2 towers, all-reduce", 2, {.reduction = AllReduce{}, .precision = Precision::Bf16}},
        {"2 towers 3:1, parameter device", 2,
         {.reduction = ParameterDevice{}, .split = WeightedSplit{{3, 1}}, .precision = Precision::Bf16}},
        {"4 towers, bucketed (1 KiB buckets)", 4, {.reduction = AllReduce{.bucket_bytes = 1024}, .precision = Precision::Bf16}},
        {"2 towers, all-reduce, 3 micro-batches", 2,
         {.reduction = AllReduce{}, .accumulation_steps = 3, .precision = Precision::Bf16}},
    };
    const double bf16_vs_fp32 = max_rel_diff(reference, fp32);
    INFO("one tower, bf16 against fp32: max relative parameter difference " << bf16_vs_fp32);
    CHECK(bf16_vs_fp32 > 1e-4);  // bf16 is measurably not fp32 here ...
    for (const Case& c : cases) {
      std::vector<float> losses;
      const auto params = train(c.towers, c.options, data, B, K, &losses);
      const double diff = max_rel_diff(params, reference);
      INFO(c.name << ": max relative parameter difference to one bf16 tower " << diff);
      // ... and towers stay as close to it as fp32 towers to one fp32 tower (measured: at most
      // 8.5e-8 here, against 5.7e-3 between bf16 and fp32).
      CHECK(diff < 2e-5);
      for (int s = 0; s < K; ++s) CHECK(losses[s] == Approx(ref_losses[s]).epsilon(1e-4));
    }
  }
}

TEST_CASE("clip_grad_norm scales the reduced gradients as torch.nn.utils.clip_grad_norm_ does", "[tower][clip]") {
  const Data data = make_data(24, 3);
  auto gradients = [&](double clip, StepMetrics* step = nullptr) {
    Trainer trainer(mlp_factory(7), cpus(2), {.clip_grad_norm = clip});
    trainer.forward_backward(data.batch(0, 24));
    if (step) *step = trainer.last_step();
    const auto g0 = trainer.replica(0).flat_gradients().to_host();
    REQUIRE(trainer.replica(1).flat_gradients().to_host() == g0);  // every copy alike
    return g0;
  };
  const std::vector<float> plain = gradients(0);
  double sq = 0;
  for (float g : plain) sq += double(g) * g;
  const double norm = std::sqrt(sq);
  REQUIRE(norm > 0);

  // Above the limit: multiplied by limit / (norm + 1e-6), PyTorch's coefficient.
  StepMetrics step;
  const std::vector<float> clipped = gradients(norm / 2, &step);
  CHECK(step.clipped);
  CHECK(step.grad_norm == Approx(norm).epsilon(1e-5));
  const double coef = (norm / 2) / (norm + 1e-6);
  double clipped_sq = 0, worst = 0;
  for (std::size_t i = 0; i < plain.size(); ++i) {
    clipped_sq += double(clipped[i]) * clipped[i];
    worst = std::max(worst, std::abs(clipped[i] - plain[i] * coef) / std::max(1e-12, std::abs(plain[i] * coef)));
  }
  CHECK(worst < 1e-5);
  CHECK(std::sqrt(clipped_sq) == Approx(norm / 2).epsilon(1e-5));

  // At or below the limit: untouched, bit for bit.
  StepMetrics loose;
  CHECK(gradients(norm * 2, &loose) == plain);
  CHECK_FALSE(loose.clipped);
  CHECK(loose.grad_norm == Approx(norm).epsilon(1e-5));

  CHECK_THROWS_WITH(Trainer(mlp_factory(7), cpus(1), {.clip_grad_norm = -1}),
                    Catch::Contains("clip_grad_norm -1 is not a norm") && Catch::Contains("or 0 (off)"));
  CHECK_THROWS_AS(Trainer(mlp_factory(7), cpus(1), {.clip_grad_norm = std::nan("")}), InvalidArgument);
}

TEST_CASE("evaluation counts top-5 and a confusion matrix, the same on 1 or 3 towers as by hand", "[tower][eval]") {
  const Data data = make_data(23, 8);
  const std::vector<Device> one = cpus(1);  // the devices' options first: this file's four CPU devices
  // By hand: the plain model's logits on the host, each row's first largest logit and its rank.
  auto ref = mlp_factory(4)(one[0]);
  ref->eval();
  const std::vector<float> z =
      ref->forward(Tensor::from_host(data.batch(0, 23).images, {23, kH, kW, kC}, Device::cpu(0))).to_host();
  std::vector<std::int64_t> confusion(kClasses * kClasses, 0);
  std::int64_t top5 = 0, top1 = 0;
  for (int r = 0; r < 23; ++r) {
    const float* row = z.data() + r * kClasses;
    const int label = data.labels[r];
    const int predicted = static_cast<int>(std::max_element(row, row + kClasses) - row);
    confusion[label * kClasses + predicted] += 1;
    top1 += predicted == label;
    int above = 0;  // top-k counts a row when fewer than k logits exceed the true one
    for (int c = 0; c < kClasses; ++c) above += row[c] > row[label];
    top5 += above < 5;
  }
  for (int towers : {1, 3}) {
    INFO(towers << " towers");
    Trainer t(mlp_factory(4), cpus(towers), {});
    const EvalResult e = t.evaluate(data.batch(0, 23));
    CHECK(e.classes == kClasses);
    CHECK(e.confusion == confusion);
    CHECK(e.correct == top1);
    CHECK(e.correct_top5 == top5);  // 5 classes: every finite row
    CHECK(e.top5 == Approx(static_cast<double>(top5) / 23));
  }
}

TEST_CASE("a tower made to sleep inside a step is named by a stall report within the warning, with "
          "the step and what the others wait in", "[tower][stall]") {
  ::setenv("TOWERFLOW_STALL_WARNING", "0.2", 1);  // read when the trainer makes its communicator
  const Data data = make_data(24, 5);
  struct Case {
    TrainerOptions options;
    const char* waits_in;
  };
  // (Synchronised batch norm's exchange: test_tower_sync_batch_norm "[stall]".)
  for (const Case& c : {Case{{.reduction = AllReduce{}}, "all-reduce #1 of the local communicator (3476 bytes) at step 3, gradients"},
                        Case{{.reduction = AllReduce{.bucket_bytes = 256}}, "all-reduce #1 of the local communicator (20 bytes) at step 3, gradient bucket 0"}}) {
    Trainer trainer(mlp_factory(3), cpus(3), c.options);
    INFO(trainer.describe());
    std::mutex mu;
    std::vector<std::pair<double, std::string>> reports;
    const auto start = std::chrono::steady_clock::now();
    auto previous = set_log_sink([&](LogLevel, std::string_view m) {
      std::lock_guard lock(mu);
      if (m.starts_with("stall:"))
        reports.emplace_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), m);
    });
    g_sleep_on_cpu = 1;
    {
      const collectives::ContextScope at_step({.step = 3});
      CHECK(std::isfinite(trainer.forward_backward(data.batch(0, 24))));
    }
    g_sleep_on_cpu = -1;
    set_log_sink(previous);
    REQUIRE(!reports.empty());
    CHECK(reports.front().first < 0.2 + 0.4);
    const std::string& text = reports.front().second;
    INFO(text);
    CHECK(text.find("not arrived: tower 1 (/cpu:1)") != std::string::npos);
    CHECK(text.find("towers 0 (/cpu:0), 2 (/cpu:2) waited") != std::string::npos);
    CHECK(text.find(c.waits_in) != std::string::npos);
  }
  ::unsetenv("TOWERFLOW_STALL_WARNING");
}

TEST_CASE("an auto split gives a slow tower fewer rows within a few steps, and trains as one tower does",
          "[tower][auto_split]") {
  const Data data = make_data(64 * 12, 11);
  // Reference: one tower over the same global batches.
  const std::vector<float> one = train(1, {}, data, 64, 12);
  g_slow_cpu = 1;  // tower 1 sleeps 200 us per row: at least 12.8 ms per step at 64 rows
  Trainer trainer(mlp_factory(7), cpus(2), {.split = AutoSplit{}});
  optim::Sgd sgd(trainer.parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3});
  std::vector<std::vector<int>> splits;
  for (int s = 0; s < 12; ++s) {
    HostBatch b = data.batch(s * 64, 64);
    b.step = s + 1;
    trainer.forward_backward(b);
    sgd.step();
    splits.push_back(trainer.last_step().global_split);
    CHECK(trainer.last_step().split == splits.back());  // one process: its towers are all
  }
  g_slow_cpu = -1;
  INFO("splits: " << [&] {
    std::string t;
    for (const auto& v : splits) t += str(v[0], "/", v[1], " ");
    return t;
  }());
  CHECK(splits[0] == std::vector<int>{32, 32});  // even until measured (the warm-up step)
  CHECK(splits[1] == std::vector<int>{32, 32});  // the first measured step decides the next
  // From step 3 on, tower 1 takes at most a quarter of the rows (its forward alone takes 200 us
  // a row, tower 0's whole step far less on any machine), and always at least the floor's 5%.
  for (std::size_t s = 2; s < splits.size(); ++s) {
    CHECK(splits[s][1] <= 16);
    CHECK(splits[s][1] >= 3);
  }
  CHECK(trainer.split_shares()[1] < 0.25);
  // What the last step's measurement scheduled (from step 13: the split follows one step late)
  // stays in force until the balancer moves it; it may have moved after the last step, so the
  // shares of step 12 are not the reference.
  CHECK(trainer.split_shares(100) == trainer.split_shares(13));
  // The gradient is the global-batch mean under any split: the same model as one tower's.
  CHECK(max_rel_diff(flat_params(trainer.model()), one) < 1e-5);
}

TEST_CASE("an auto split resumes from given shares, and refuses shares of another tower count", "[tower][auto_split]") {
  Trainer trainer(mlp_factory(7), cpus(2), {.split = AutoSplit{.freeze_after = 1}});
  trainer.set_split_shares({0.75, 0.25}, 1);
  const Data data = make_data(64, 3);
  HostBatch b = data.batch(0, 64);
  b.step = 1;
  trainer.forward_backward(b);
  CHECK(trainer.last_step().global_split == std::vector<int>{48, 16});
  CHECK_THROWS_WITH(trainer.set_split_shares({0.5, 0.3, 0.2}, 2), Catch::Contains("an auto split of 3 towers' shares cannot apply to 2 towers"));
  CHECK_THROWS_WITH(trainer.set_split_shares({0.5, 0.0}, 2), Catch::Contains("initial share 0"));
  CHECK_THROWS_WITH(trainer.set_split_delay(0), Catch::Contains("split delay of 0 steps"));
  // Other policies have no shares.
  Trainer even(mlp_factory(7), cpus(2), {});
  CHECK(even.split_shares().empty());
}
