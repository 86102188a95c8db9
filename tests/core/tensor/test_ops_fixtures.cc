// Forward and backward of each op against PyTorch (float64 references of float32 inputs,
// tests/fixtures/compute/ops.bin). Tolerances: rtol 1e-4 / atol 1e-5 for single-pass ops,
// rtol 1e-3 / atol 1e-4 for reductions over many terms (convolution, batch norm gradients).

#include "core/tensor/ops.h"
#include "tests/core/tensor/fixtures.h"

namespace towerflow {
namespace {

using testing::FixtureArray;
using testing::require_close;

const std::map<std::string, FixtureArray>& fx() {
  static const auto f = testing::load_fixture("ops.bin");
  return f;
}

const FixtureArray& get(const std::string& name) {
  auto it = fx().find(name);
  if (it == fx().end()) FAIL("fixture record " << name << " is missing");
  return it->second;
}

Tensor load(const std::string& name, bool requires_grad = false) {
  const FixtureArray& a = get(name);
  Tensor t = a.is_int ? Tensor::from_host(std::span<const std::int32_t>(a.i), a.shape, Device::cpu())
                      : Tensor::from_host(std::span<const float>(a.f), a.shape, Device::cpu());
  if (requires_grad) t.set_requires_grad(true);
  return t;
}

void check(const Tensor& t, const std::string& name, double rtol = 1e-4, double atol = 1e-5) {
  REQUIRE(t.defined());
  REQUIRE(t.shape() == get(name).shape);
  require_close(t.to_host(), get(name).f, rtol, atol, name);
}

// loss = sum(y * gy): backward() then gives each input the gradient for upstream gy.
void backward_with(const Tensor& y, const std::string& gy) { sum(mul(y, load(gy))).backward(); }

}  // namespace

TEST_CASE("conv2d matches PyTorch: odd sizes, stride 2, padding, 1x1 and 5x5", "[ops][torch]") {
  for (std::string tag : {"conv_a", "conv_b", "conv_c"}) {
    INFO(tag);
    const auto meta = get(tag + ".meta").i;
    Tensor x = load(tag + ".x", true), w = load(tag + ".w", true), b = load(tag + ".b", true);
    Tensor y = conv2d(x, w, b, {.stride = meta[0], .padding = meta[1]});
    check(y, tag + ".y", 1e-4, 1e-4);
    backward_with(y, tag + ".gy");
    check(x.grad(), tag + ".gx", 1e-3, 1e-4);
    check(w.grad(), tag + ".gw", 1e-3, 1e-4);
    check(b.grad(), tag + ".gb", 1e-3, 1e-4);
  }
}

TEST_CASE("linear and flatten (PyTorch's c, h, w order) match PyTorch", "[ops][torch]") {
  Tensor x = load("linear.x", true), w = load("linear.w", true), b = load("linear.b", true);
  Tensor y = linear(x, w, b);
  check(y, "linear.y");
  backward_with(y, "linear.gy");
  check(x.grad(), "linear.gx");
  check(w.grad(), "linear.gw");
  check(b.grad(), "linear.gb");

  Tensor fx_ = load("flatten.x", true), fw = load("flatten.w", true);
  Tensor fy = linear(flatten(fx_), fw, Tensor());
  check(fy, "flatten.y");
  backward_with(fy, "flatten.gy");
  check(fx_.grad(), "flatten.gx");
  check(fw.grad(), "flatten.gw");
}

TEST_CASE("pooling matches PyTorch: max 3/2 pad 1 on odd input, avg 3/2 pad 1, global",
          "[ops][torch]") {
  Tensor x = load("maxpool.x", true);
  Tensor y = max_pool2d(x, {.kernel = 3, .stride = 2, .padding = 1});
  check(y, "maxpool.y", 0, 1e-7);
  backward_with(y, "maxpool.gy");
  check(x.grad(), "maxpool.gx");

  Tensor ax = load("avgpool.x", true);
  Tensor ay = avg_pool2d(ax, {.kernel = 3, .stride = 2, .padding = 1});
  check(ay, "avgpool.y");
  backward_with(ay, "avgpool.gy");
  check(ax.grad(), "avgpool.gx");

  Tensor gx = load("gap.x", true);
  Tensor gy = global_avg_pool(gx);
  check(gy, "gap.y");
  backward_with(gy, "gap.gy");
  check(gx.grad(), "gap.gx");
}

TEST_CASE("batch norm matches PyTorch: training, running averages, eval", "[ops][torch]") {
  Tensor x = load("bn.x", true), gamma = load("bn.gamma", true), beta = load("bn.beta", true);
  Tensor rm = load("bn.running_mean0"), rv = load("bn.running_var0");
  Tensor y = batch_norm(x, gamma, beta, rm, rv, {.training = true, .momentum = 0.1f, .eps = 1e-5f});
  check(y, "bn.y", 1e-4, 1e-4);
  check(rm, "bn.running_mean1", 1e-4, 1e-6);
  check(rv, "bn.running_var1", 1e-4, 1e-6);
  backward_with(y, "bn.gy");
  check(x.grad(), "bn.gx", 1e-3, 1e-4);
  check(gamma.grad(), "bn.ggamma", 1e-3, 1e-4);
  check(beta.grad(), "bn.gbeta", 1e-3, 1e-4);
  NoGradGuard no_grad;
  check(batch_norm(x, gamma, beta, rm, rv, {.training = false}), "bn.y_eval", 1e-4, 1e-5);
}

TEST_CASE("fused relu(batch_norm(x) + residual) matches PyTorch", "[ops][torch]") {
  Tensor x = load("bnaddrelu.x", true), r = load("bnaddrelu.r", true);
  Tensor gamma = load("bnaddrelu.gamma", true), beta = load("bnaddrelu.beta", true);
  Tensor y = batch_norm_add_relu(x, r, gamma, beta, Tensor(), Tensor(), {.training = true});
  check(y, "bnaddrelu.y", 1e-4, 1e-4);
  backward_with(y, "bnaddrelu.gy");
  check(x.grad(), "bnaddrelu.gx", 1e-3, 1e-4);
  check(r.grad(), "bnaddrelu.gr", 1e-4, 1e-5);
  check(gamma.grad(), "bnaddrelu.ggamma", 1e-3, 1e-4);
  check(beta.grad(), "bnaddrelu.gbeta", 1e-3, 1e-4);
}

TEST_CASE("softmax cross-entropy matches PyTorch: mean, label smoothing, sum / scale",
          "[ops][torch]") {
  Tensor labels = load("xent.labels");
  struct Case {
    std::string tag;
    SoftmaxCrossEntropyOptions opts;
  };
  for (const Case& c : {Case{"mean", {}}, Case{"smooth", {.label_smoothing = 0.1f}},
                        Case{"scaled", {.scale = 16.0f, .label_smoothing = 0.2f}}}) {
    INFO(c.tag);
    Tensor logits = load("xent.logits", true);
    Tensor loss = softmax_cross_entropy(logits, labels, c.opts);
    check(loss, "xent." + c.tag + ".loss", 1e-5, 1e-6);
    loss.backward();
    check(logits.grad(), "xent." + c.tag + ".glogits", 1e-4, 1e-6);
  }
}

}  // namespace towerflow
