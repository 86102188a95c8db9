// Forward and backward of each op against PyTorch (float64 references of float32 inputs,
// tests/fixtures/compute/ops.bin, and airbench.bin for the ops of the airbench94 network). Tolerances: rtol 1e-4 / atol 1e-5 for single-pass ops,
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

const std::map<std::string, FixtureArray>& airbench_fx() {
  static const auto f = testing::load_fixture("airbench.bin");
  return f;
}

const FixtureArray& get(const std::string& name) {
  for (const auto* file : {&fx(), &airbench_fx()}) {
    auto it = file->find(name);
    if (it != file->end()) return it->second;
  }
  FAIL("fixture record " << name << " is missing");
  throw;  // not reached
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

TEST_CASE("GELU (the erf form) matches PyTorch, tails included", "[ops][torch]") {
  Tensor x = load("gelu.x", true);
  Tensor y = gelu(x);
  check(y, "gelu.y", 1e-5, 1e-6);
  backward_with(y, "gelu.gy");
  check(x.grad(), "gelu.gx", 1e-5, 1e-6);
}

TEST_CASE("batch norm with a frozen scale, eps 1e-12 and momentum 0.4 matches PyTorch",
          "[ops][torch]") {
  Tensor x = load("bnfrozen.x", true), beta = load("bnfrozen.bias", true);
  Tensor gamma = Tensor::full({6}, 1.0f, Device::cpu());  // not trainable: no gradient kept
  Tensor mean = load("bnfrozen.running_mean0"), var = load("bnfrozen.running_var0");
  Tensor y = batch_norm(x, gamma, beta, mean, var,
                        {.training = true, .momentum = 0.4f, .eps = 1e-12f});
  check(y, "bnfrozen.y", 1e-4, 1e-5);
  check(mean, "bnfrozen.running_mean", 1e-5, 1e-6);
  check(var, "bnfrozen.running_var", 1e-5, 1e-6);
  backward_with(y, "bnfrozen.gy");
  check(x.grad(), "bnfrozen.gx", 1e-3, 1e-4);
  check(beta.grad(), "bnfrozen.gbias", 1e-4, 1e-5);
  CHECK_FALSE(gamma.grad().defined());
}

TEST_CASE("max pool 3x3 stride 3 (nn.MaxPool2d(3)) drops the rows past the last window",
          "[ops][torch]") {
  Tensor x = load("pool3.x", true);
  Tensor y = max_pool2d(x, {.kernel = 3, .stride = 3});
  check(y, "pool3.y", 1e-7, 1e-7);
  backward_with(y, "pool3.gy");
  check(x.grad(), "pool3.gx", 1e-7, 1e-7);
}

TEST_CASE("cross-entropy summed over the rows (scale 1) with label smoothing 0.2 matches "
          "PyTorch's reduction='none' then sum",
          "[ops][torch]") {
  Tensor logits = load("ce.logits", true);
  Tensor loss = softmax_cross_entropy(logits, load("ce.labels"),
                                      {.scale = 1.0f, .label_smoothing = 0.2f});
  check(loss, "ce.loss", 1e-5, 1e-5);
  loss.backward();
  check(logits.grad(), "ce.glogits", 1e-5, 1e-6);
}

}  // namespace towerflow
