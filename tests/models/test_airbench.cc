// airbench94 and its building blocks against PyTorch (tests/fixtures/compute/airbench.bin, made
// by tests/fixtures/make_airbench_fixtures.py): Dirac initialisation, patch whitening, the
// state_dict names, and one training step of the whole network from given weights.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <set>

#include "core/nn/init.h"
#include "core/nn/whitening.h"
#include "core/platform/registry.h"
#include "core/tensor/ops.h"
#include "models/airbench.h"
#include "models/models.h"
#include "tests/core/tensor/fixtures.h"

namespace towerflow {
namespace {

using testing::FixtureArray;
using testing::require_close;

const std::map<std::string, FixtureArray>& fx() {
  static const auto f = testing::load_fixture("airbench.bin");
  return f;
}

const FixtureArray& get(const std::string& name) {
  auto it = fx().find(name);
  if (it == fx().end()) FAIL("fixture record " << name << " is missing");
  return it->second;
}

Tensor load(const std::string& name) {
  const FixtureArray& a = get(name);
  return a.is_int ? Tensor::from_host(std::span<const std::int32_t>(a.i), a.shape, Device::cpu())
                  : Tensor::from_host(std::span<const float>(a.f), a.shape, Device::cpu());
}

}  // namespace

TEST_CASE("dirac_init matches torch.nn.init.dirac_ on the first filters, odd and even kernels",
          "[models][airbench][torch]") {
  for (const std::string tag : {"dirac_a", "dirac_b", "dirac_c"}) {
    INFO(tag);
    const FixtureArray& ref = get(tag);
    Tensor w = Tensor::full(ref.shape, 7.0f, Device::cpu());
    nn::dirac_init(w, static_cast<int>(std::min(ref.shape[0], ref.shape[1])));
    require_close(w.to_host(), ref.f, 0, 1e-12, tag);
  }
  Tensor w = Tensor::zeros({2, 4, 3, 3}, Device::cpu());
  CHECK_THROWS_WITH(nn::dirac_init(w, 3), Catch::Contains("3 filters") && Catch::Contains("[2, 4, 3, 3]"));
  CHECK_THROWS_AS(nn::dirac_init(Tensor::zeros({4, 4}, Device::cpu()), 1), InvalidArgument);
}

TEST_CASE("patch whitening matches airbench94's eigen-filters (each up to its sign), and "
          "decorrelates the patches",
          "[models][airbench][torch]") {
  const Tensor images = load("whiten.images");
  const nn::Whitening w = nn::patch_whitening(images, {.kernel = 2, .eps = 5e-4});
  const FixtureArray& ref = get("whiten.weight");
  REQUIRE(w.weight.shape() == ref.shape);
  const auto got = w.weight.to_host();
  const std::size_t dim = 12;
  for (std::size_t f = 0; f < 2 * dim; ++f) {
    INFO("filter " << f);
    double same = 0, flipped = 0, norm = 0;
    for (std::size_t j = 0; j < dim; ++j) {
      const double a = got[f * dim + j], b = ref.f[f * dim + j];
      same = std::max(same, std::abs(a - b));
      flipped = std::max(flipped, std::abs(a + b));
      norm = std::max(norm, std::abs(b));
    }
    CHECK(std::min(same, flipped) <= 1e-4 * norm);
    // The second half is the first negated, bit for bit.
    if (f >= dim)
      for (std::size_t j = 0; j < dim; ++j) CHECK(got[f * dim + j] == -got[(f - dim) * dim + j]);
  }
  const auto& values = get("whiten.eigenvalues").f;
  for (std::size_t i = 0; i < dim; ++i) CHECK(w.eigenvalues[i] == Approx(values[i]).epsilon(1e-5));

  // Whitened patches have (nearly) identity covariance: W C W^T = diag(l / (l + eps)).
  Tensor y = conv2d(images, w.weight.slice(0, dim), Tensor(), {});
  const auto v = y.to_host();
  const std::size_t rows = v.size() / dim;
  for (std::size_t a = 0; a < dim; ++a)
    for (std::size_t b = 0; b < dim; ++b) {
      double s = 0;
      for (std::size_t r = 0; r < rows; ++r) s += double(v[r * dim + a]) * v[r * dim + b];
      s /= static_cast<double>(rows);
      const double expected = a == b ? w.eigenvalues[a] / (w.eigenvalues[a] + 5e-4) : 0.0;
      CHECK(s == Approx(expected).margin(2e-3));
    }

  CHECK_THROWS_WITH(nn::patch_whitening(images, {.kernel = 9}), Catch::Contains("kernel 9"));
  CHECK_THROWS_WITH(nn::patch_whitening(images, {.eps = 0}), Catch::Contains("eps 0"));
  CHECK_THROWS_WITH(nn::patch_whitening(images.slice(0, 1), {.kernel = 8}),
                    Catch::Contains("full-rank"));
}

TEST_CASE("airbench94: state_dict names and shapes are PyTorch's, frozen weights are buffers",
          "[models][airbench][torch]") {
  auto model = models::make_model("airbench94", Device::cpu());
  std::set<std::string> ours;
  for (const auto& [name, t] : model->named_parameters()) ours.insert(name);
  for (const auto& [name, t] : model->named_buffers()) ours.insert(name);
  std::set<std::string> torch_names;
  for (const auto& [name, a] : fx())
    if (name.starts_with("model.")) torch_names.insert(name.substr(6));
  // The fixture's network is narrower; the names are the same.
  CHECK(ours == torch_names);
  std::set<std::string> trainable;
  for (const auto& [name, t] : model->named_parameters()) trainable.insert(name);
  CHECK(trainable == std::set<std::string>{"0.bias", "2.conv1.weight", "2.norm1.bias",
                                           "2.conv2.weight", "2.norm2.bias", "3.conv1.weight",
                                           "3.norm1.bias", "3.conv2.weight", "3.norm2.bias",
                                           "4.conv1.weight", "4.norm1.bias", "4.conv2.weight",
                                           "4.norm2.bias", "7.weight"});
  // PyTorch's parameter count: 2,334,208 trainable weights and biases (widths 64, 256, 256).
  CHECK(model->num_parameters() == 24 + 64 * 24 * 9 + 64 + 64 * 64 * 9 + 64 + 256 * 64 * 9 + 256 +
                                       256 * 256 * 9 + 256 + 256 * 256 * 9 + 256 + 256 * 256 * 9 +
                                       256 + 2560);
  // Dirac on the first filters: conv2 of every group starts as the identity.
  for (const auto& [name, t] : model->named_parameters())
    if (name == "3.conv2.weight") {
      const auto v = t.to_host();
      CHECK(v[(5 * 256 + 5) * 9 + 4] == 1.0f);
      CHECK(v[(5 * 256 + 6) * 9 + 4] == 0.0f);
    }
}

TEST_CASE("airbench94: one training step matches PyTorch (logits, summed smoothed loss, every "
          "gradient, running statistics, eval logits)",
          "[models][airbench][torch]") {
  nn::InitRng rng(1);
  models::Airbench94 model(Device::cpu(), {.widths = {8, 16, 16}}, rng);
  model.flatten();
  for (auto named : {model.named_parameters(), model.named_buffers()})
    for (const auto& [name, t] : named) t.copy_(load("model." + name));
  model.train(true);
  model.zero_grad();
  const Tensor x = load("step.x");
  Tensor logits = model.forward(x);
  Tensor loss = softmax_cross_entropy(logits, load("step.labels"),
                                      {.scale = 1.0f, .label_smoothing = 0.2f});
  loss.backward();
  require_close(logits.to_host(), get("step.logits").f, 1e-3, 1e-4, "logits");
  require_close({loss.item()}, get("step.loss").f, 1e-4, 1e-5, "loss");
  int grads = 0;
  for (const auto& [name, p] : model.named_parameters()) {
    const auto& ref = get("step.grad." + name).f;
    float max_abs = 0;
    for (float v : ref) max_abs = std::max(max_abs, std::abs(v));
    require_close(p.grad().to_host(), ref, 5e-3, 2e-3 * max_abs, "grad " + name);
    ++grads;
  }
  CHECK(grads == 14);
  for (const auto& [name, b] : model.named_buffers())
    if (name.find("running") != std::string::npos)
      require_close(b.to_host(), get("step.after." + name).f, 1e-4, 1e-5, name);
  model.eval();
  require_close(model.forward(x).to_host(), get("step.eval_logits").f, 1e-3, 1e-4, "eval logits");
}

}  // namespace towerflow
