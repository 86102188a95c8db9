// Every differentiable op's gradients against central finite differences.
//
// For an op f and fixed random weights r, L(inputs) = sum(f(inputs) * r). backward() gives dL/dx
// for every input; the reference perturbs each element by +-h and evaluates L with the same
// float32 ops, accumulating the sum in double. The step h = 1e-2 keeps float32 rounding of L
// (~1e-7 |L| / h) well below the curvature error (~h^2); inputs are kept away from the kinks of
// relu and max pool so that no step crosses one. Passing needs max |analytic - numeric| <=
// 2e-2 * max(1, max |numeric|) for every input; the worst element is printed on failure.

#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <random>

#include "core/tensor/ops.h"

namespace towerflow {
namespace {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

Tensor random_tensor(const Shape& shape, std::mt19937& gen, float scale = 1.0f,
                     float min_abs = 0.0f) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(shape_numel(shape)));
  for (auto& x : v) {
    x = u(gen) * scale;
    if (std::abs(x) < min_abs) x = x < 0 ? x - min_abs : x + min_abs;
  }
  return Tensor::from_host(std::span<const float>(v), shape, Device::cpu());
}

// Distinct values far apart (a shuffled ramp), so max pool's argmax is stable under +-h.
Tensor spread_tensor(const Shape& shape, std::mt19937& gen) {
  std::vector<float> v(static_cast<std::size_t>(shape_numel(shape)));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.1f * static_cast<float>(i) - 0.05f * v.size();
  std::shuffle(v.begin(), v.end(), gen);
  return Tensor::from_host(std::span<const float>(v), shape, Device::cpu());
}

double loss_value(const Fn& f, const std::vector<Tensor>& inputs, const Tensor& r) {
  NoGradGuard no_grad;
  Tensor y = f(inputs);
  const auto yv = y.to_host(), rv = r.to_host();
  double total = 0;
  for (std::size_t i = 0; i < yv.size(); ++i) total += static_cast<double>(yv[i]) * rv[i];
  return total;
}

// Checks the gradients of every input whose index is in `check` (all when empty).
void gradcheck(const std::string& name, const Fn& f, std::vector<Tensor> inputs,
               std::vector<int> check = {}, double h = 1e-2) {
  std::mt19937 gen(99);
  if (check.empty())
    for (int i = 0; i < static_cast<int>(inputs.size()); ++i) check.push_back(i);
  for (int i : check) inputs[static_cast<std::size_t>(i)].set_requires_grad(true);
  Tensor y = f(inputs);
  Tensor r = random_tensor(y.shape(), gen);
  sum(mul(y, r)).backward();
  for (int i : check) {
    Tensor& x = inputs[static_cast<std::size_t>(i)];
    REQUIRE(x.grad().defined());
    const auto analytic = x.grad().to_host();
    auto values = x.to_host();
    double worst = 0, max_numeric = 0;
    std::size_t at = 0;
    for (std::size_t k = 0; k < values.size(); ++k) {
      const float orig = values[k];
      values[k] = orig + static_cast<float>(h);
      x.copy_from_host(std::span<const float>(values));
      const double plus = loss_value(f, inputs, r);
      values[k] = orig - static_cast<float>(h);
      x.copy_from_host(std::span<const float>(values));
      const double minus = loss_value(f, inputs, r);
      values[k] = orig;
      x.copy_from_host(std::span<const float>(values));
      const double numeric = (plus - minus) / (2 * h);
      max_numeric = std::max(max_numeric, std::abs(numeric));
      const double err = std::abs(numeric - analytic[k]);
      if (err > worst) {
        worst = err;
        at = k;
      }
    }
    INFO(name << ": input " << i << " " << x.describe() << ": max |analytic - numeric| = "
              << worst << " at element " << at << " (analytic " << analytic[at]
              << "), max |numeric| = " << max_numeric);
    CHECK(worst <= 2e-2 * std::max(1.0, max_numeric));
  }
}

}  // namespace

TEST_CASE("gradients: conv2d with odd input, stride 2, padding, bias", "[ops][grad]") {
  std::mt19937 gen(1);
  gradcheck("conv 3x3 s2 p1",
            [](const std::vector<Tensor>& in) {
              return conv2d(in[0], in[1], in[2], {.stride = 2, .padding = 1});
            },
            {random_tensor({2, 5, 5, 3}, gen), random_tensor({4, 3, 3, 3}, gen, 0.5f),
             random_tensor({4}, gen)});
  gradcheck("conv 1x1 s2 batch 1, 5 channels",
            [](const std::vector<Tensor>& in) {
              return conv2d(in[0], in[1], Tensor(), {.stride = 2, .padding = 0});
            },
            {random_tensor({1, 5, 5, 5}, gen), random_tensor({3, 5, 1, 1}, gen, 0.5f)});
}

TEST_CASE("gradients: linear, matmul, bias_add", "[ops][grad]") {
  std::mt19937 gen(2);
  gradcheck("linear",
            [](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); },
            {random_tensor({3, 7}, gen), random_tensor({5, 7}, gen), random_tensor({5}, gen)});
  gradcheck("matmul", [](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); },
            {random_tensor({4, 3}, gen), random_tensor({3, 6}, gen)});
  gradcheck("bias_add", [](const std::vector<Tensor>& in) { return bias_add(in[0], in[1]); },
            {random_tensor({2, 3, 3, 5}, gen), random_tensor({5}, gen)});
}

TEST_CASE("gradients: relu, add, mul, flatten, views", "[ops][grad]") {
  std::mt19937 gen(3);
  gradcheck("relu", [](const std::vector<Tensor>& in) { return relu(in[0]); },
            {random_tensor({3, 7}, gen, 1.0f, 0.05f)});
  gradcheck("add", [](const std::vector<Tensor>& in) { return add(in[0], in[1]); },
            {random_tensor({2, 5}, gen), random_tensor({2, 5}, gen)});
  gradcheck("mul", [](const std::vector<Tensor>& in) { return mul(in[0], in[1]); },
            {random_tensor({2, 5}, gen), random_tensor({2, 5}, gen)});
  gradcheck("add of a shared input (x + x)",
            [](const std::vector<Tensor>& in) { return add(in[0], in[0]); },
            {random_tensor({3, 4}, gen)});
  gradcheck("flatten", [](const std::vector<Tensor>& in) { return mul(flatten(in[0]), flatten(in[0])); },
            {random_tensor({2, 3, 3, 4}, gen)});
  gradcheck("view", [](const std::vector<Tensor>& in) { return relu(in[0].view({4, -1})); },
            {random_tensor({2, 3, 2, 2}, gen, 1.0f, 0.05f)});
}

TEST_CASE("gradients: max, average and global pooling", "[ops][grad]") {
  std::mt19937 gen(4);
  gradcheck("max pool 3/2 pad 1, odd input",
            [](const std::vector<Tensor>& in) {
              return max_pool2d(in[0], {.kernel = 3, .stride = 2, .padding = 1});
            },
            {spread_tensor({2, 7, 7, 3}, gen)});
  gradcheck("avg pool 2/2",
            [](const std::vector<Tensor>& in) {
              return avg_pool2d(in[0], {.kernel = 2, .stride = 2, .padding = 0});
            },
            {random_tensor({1, 5, 5, 3}, gen)});
  gradcheck("global average pool", [](const std::vector<Tensor>& in) { return global_avg_pool(in[0]); },
            {random_tensor({2, 3, 3, 5}, gen)});
}

TEST_CASE("gradients: batch norm, fused relu and add-relu (training)", "[ops][grad]") {
  std::mt19937 gen(5);
  const BatchNormOptions train{.training = true};
  gradcheck("batch_norm",
            [&](const std::vector<Tensor>& in) {
              return batch_norm(in[0], in[1], in[2], Tensor(), Tensor(), train);
            },
            {random_tensor({2, 3, 3, 5}, gen, 2.0f), random_tensor({5}, gen),
             random_tensor({5}, gen)});
  // The relu variants: |beta| (or |residual|) exceeds |gamma * x_hat| (|x_hat| <= sqrt(rows - 1)),
  // so no pre-activation is near the relu kink.
  gradcheck("batch_norm_relu",
            [&](const std::vector<Tensor>& in) {
              return batch_norm_relu(in[0], in[1], in[2], Tensor(), Tensor(), train);
            },
            {random_tensor({2, 2, 2, 3}, gen), random_tensor({3}, gen, 0.3f),
             random_tensor({3}, gen, 1.0f, 1.0f)});
  gradcheck("batch_norm_add_relu",
            [&](const std::vector<Tensor>& in) {
              return batch_norm_add_relu(in[0], in[3], in[1], in[2], Tensor(), Tensor(), train);
            },
            {random_tensor({3, 2, 2, 4}, gen), random_tensor({4}, gen, 0.2f),
             random_tensor({4}, gen, 0.1f), random_tensor({3, 2, 2, 4}, gen, 3.0f, 1.0f)});
}

TEST_CASE("gradients: eval-mode batch norm (input only), dropout, softmax cross-entropy",
          "[ops][grad]") {
  std::mt19937 gen(6);
  Tensor rm = random_tensor({4}, gen, 0.5f);
  Tensor rv = Tensor::full({4}, 1.5f, Device::cpu());
  gradcheck("batch_norm eval",
            [&](const std::vector<Tensor>& in) {
              return batch_norm(in[0], in[1], in[2], rm, rv, {.training = false});
            },
            {random_tensor({2, 2, 2, 4}, gen), random_tensor({4}, gen), random_tensor({4}, gen)},
            {0});
  gradcheck("dropout p=0.3",
            [](const std::vector<Tensor>& in) { return dropout(in[0], 0.3f, true, 17); },
            {random_tensor({4, 9}, gen)});
  Tensor labels = Tensor::from_host(std::vector<std::int32_t>{2, 0, 4}, {3}, Device::cpu());
  gradcheck("softmax_cross_entropy smoothing 0.1 scale 8",
            [&](const std::vector<Tensor>& in) {
              return softmax_cross_entropy(in[0], labels,
                                           {.scale = 8.0f, .label_smoothing = 0.1f});
            },
            {random_tensor({3, 5}, gen, 2.0f)});
}

}  // namespace towerflow
