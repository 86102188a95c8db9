// Tensor basics, autograd mechanics, error messages, and op placement (soft placement and
// log_device_placement) with a stand-in device that lacks a kernel.

#include <catch2/catch.hpp>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <limits>
#include <random>
#include <thread>

#include "core/error.h"
#include "core/kernel_choice.h"
#include "core/log.h"
#include "core/memory/allocator.h"
#include "core/platform/registry.h"
#include "core/tensor/autograd.h"
#include "core/tensor/backend_impl.h"
#include "core/tensor/cpu_backend.h"
#include "core/tensor/device_ops.h"
#include "core/tensor/mac_counter.h"
#include "core/tensor/ops.h"
#include "core/tensor/precision.h"
#include "core/trace.h"

namespace towerflow {
namespace {

const Device kCpu = Device::cpu();

Tensor ramp(const Shape& shape, float start = 0.0f) {
  std::vector<float> v(static_cast<std::size_t>(shape_numel(shape)));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = start + static_cast<float>(i);
  return Tensor::from_host(std::span<const float>(v), shape, kCpu);
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

}  // namespace

TEST_CASE("tensors: creation, host copies, views share memory", "[tensor]") {
  Tensor t = ramp({2, 3, 4});
  CHECK(t.shape() == Shape{2, 3, 4});
  CHECK(t.strides() == Shape{12, 4, 1});
  CHECK(t.numel() == 24);
  CHECK(t.dim(-1) == 4);
  CHECK(t.dtype() == DType::kFloat32);
  CHECK(t.device() == kCpu);
  CHECK(t.describe() == "float32[2, 3, 4] on /cpu:0");
  CHECK(t.to_host()[23] == 23.0f);

  Tensor v = t.view({6, -1});
  CHECK(v.shape() == Shape{6, 4});
  Tensor s = t.slice(1, 2);
  CHECK(s.shape() == Shape{1, 3, 4});
  CHECK(s.to_host()[0] == 12.0f);
  // Writing through a view is seen by the original (no copy was made).
  std::vector<float> minus(12, -1.0f);
  s.copy_from_host(std::span<const float>(minus));
  CHECK(t.to_host()[12] == -1.0f);
  CHECK(v.to_host()[12] == -1.0f);
  CHECK(t.to_host()[11] == 11.0f);

  Tensor c = t.clone();
  CHECK(c.raw_data() != t.raw_data());
  CHECK(c.to_host() == t.to_host());
  CHECK(Tensor::zeros({3}, kCpu).to_host() == std::vector<float>{0, 0, 0});
  CHECK(Tensor::full({2}, 2.5f, kCpu).to_host() == std::vector<float>{2.5f, 2.5f});
  Tensor labels = Tensor::from_host(std::vector<std::int32_t>{1, 2}, {2}, kCpu);
  CHECK(labels.to_host_int32() == std::vector<std::int32_t>{1, 2});
  CHECK(Tensor::zeros({2}, kCpu, DType::kInt32).to_host_int32() == std::vector<std::int32_t>{0, 0});
}

TEST_CASE("tensors: bad sizes and dtypes raise errors that name both sides", "[tensor][errors]") {
  Tensor t = ramp({2, 3});
  std::vector<float> five(5);
  CHECK_THROWS_AS(t.copy_from_host(std::span<const float>(five)), InvalidArgument);
  CHECK_THAT(message_of([&] { t.copy_from_host(std::span<const float>(five)); }),
             Catch::Contains("5 elements") && Catch::Contains("[2, 3]"));
  CHECK_THAT(message_of([&] { t.view({4, 2}); }), Catch::Contains("[2, 3]") && Catch::Contains("[4, 2]"));
  CHECK_THAT(message_of([&] { (void)t.data<std::int32_t>(); }), Catch::Contains("int32"));
  CHECK_THAT(message_of([&] { t.slice(1, 3); }), Catch::Contains("[1, 3)"));
  CHECK_THAT(message_of([&] { Tensor().numel(); }), Catch::Contains("undefined"));
  CHECK_THAT(message_of([&] { Tensor::empty({-1}, kCpu); }), Catch::Contains("[-1]"));
  CHECK_THAT(message_of([&] { ramp({2, 3}).item(); }), Catch::Contains("one-element"));
}

TEST_CASE("in-place device ops refuse mismatched tensors and spans, naming both", "[ops][errors]") {
  const Device cpu = Device::cpu(0);
  const Tensor y = Tensor::from_host(std::vector<float>{1, 2, 3}, {3}, cpu);
  axpy_(y, 2.0f, Tensor::from_host(std::vector<float>{1, 1, 1}, {3}, cpu));
  scale_(y, 0.5f);
  CHECK(y.to_host() == std::vector<float>{1.5f, 2.0f, 2.5f});
  CHECK_THROWS_WITH(axpy_(y, 1.0f, Tensor::zeros({4}, cpu)),
                    Catch::Contains("axpy_: y float32[3] on /cpu:0 and x float32[4] on /cpu:0") &&
                        Catch::Contains("the same shape and device"));
  CHECK_THROWS_WITH(scale_(Tensor::zeros({3}, cpu, DType::kInt32), 2.0f), Catch::Contains("int32"));
  std::vector<float> p(3, 1.0f), g(3, 1.0f), momentum(2, 0.0f);
  CHECK_THROWS_WITH(sgd_update_(cpu, p, g, momentum, {.lr = 0.1f, .momentum = 0.9f}),
                    Catch::Contains("sgd_update_: momentum has 2 floats and the parameters 3"));
  CHECK(p == std::vector<float>(3, 1.0f));  // nothing changed
  std::vector<float> m(3, 0.0f), v(3, 0.0f);
  CHECK_THROWS_WITH(adam_update_(cpu, p, std::span<const float>(g).first(2), m, v, {}),
                    Catch::Contains("adam_update_: grads has 2 floats and the parameters 3"));
}

TEST_CASE("ops: shape mismatches print both shapes", "[ops][errors]") {
  Tensor x = ramp({2, 5, 5, 3});
  Tensor w = ramp({4, 2, 3, 3});
  CHECK_THAT(message_of([&] { conv2d(x, w, Tensor()); }),
             Catch::Contains("[2, 5, 5, 3]") && Catch::Contains("[4, 2, 3, 3]"));
  CHECK_THAT(message_of([&] { add(ramp({2, 3}), ramp({3, 2})); }),
             Catch::Contains("[2, 3]") && Catch::Contains("[3, 2]"));
  CHECK_THAT(message_of([&] { matmul(ramp({2, 3}), ramp({2, 3})); }),
             Catch::Contains("[2, 3] and [2, 3]"));
  CHECK_THAT(message_of([&] { linear(ramp({2, 3}), ramp({4, 5}), Tensor()); }),
             Catch::Contains("[2, 3]") && Catch::Contains("[4, 5]"));
  CHECK_THAT(message_of([&] { max_pool2d(ramp({1, 2, 2, 1}), {.kernel = 3, .stride = 1}); }),
             Catch::Contains("[1, 2, 2, 1]"));
  // The fused convolution and pool name themselves and the shapes, for either part's mistake.
  CHECK_THAT(message_of([&] { conv2d_max_pool2d_relu(x, w, Tensor(), {}, {.kernel = 2, .stride = 2}); }),
             Catch::Contains("Conv2DMaxPoolRelu") && Catch::Contains("[2, 5, 5, 3]") &&
                 Catch::Contains("[4, 2, 3, 3]"));
  CHECK_THAT(message_of([&] {
               conv2d_max_pool2d_relu(x, ramp({4, 3, 3, 3}), Tensor(), {}, {.kernel = 5, .stride = 1});
             }),
             Catch::Contains("Conv2DMaxPoolRelu") && Catch::Contains("window 5x5") &&
                 Catch::Contains("[2, 3, 3, 4]"));
  // An empty batch is refused, naming the field, as the convolution alone refuses it.
  CHECK_THAT(message_of([&] {
               conv2d_max_pool2d_relu(ramp({0, 5, 5, 3}), ramp({4, 3, 3, 3}), Tensor(), {}, {.kernel = 2, .stride = 2});
             }),
             Catch::Contains("n = 0") && Catch::Contains("batch size"));
  Tensor logits = ramp({2, 3});
  Tensor bad = Tensor::from_host(std::vector<std::int32_t>{0, 3}, {2}, kCpu);
  CHECK_THROWS_AS(softmax_cross_entropy(logits, bad), InvalidArgument);
  CHECK_THAT(message_of([&] { softmax_cross_entropy(logits, bad); }),
             Catch::Contains("label 3") && Catch::Contains("[0, 3)"));
  Tensor three = Tensor::from_host(std::vector<std::int32_t>{0, 1, 2}, {3}, kCpu);
  CHECK_THAT(message_of([&] { softmax_cross_entropy(logits, three); }),
             Catch::Contains("[2, 3]") && Catch::Contains("[3]"));
  CHECK_THAT(message_of([&] { softmax_cross_entropy(logits, three.slice(0, 2), {.label_smoothing = 1.5f}); }),
             Catch::Contains("label_smoothing 1.5"));
  CHECK_THAT(message_of([&] { dropout(logits, 1.0f, true, 0); }), Catch::Contains("p = 1"));
  CHECK_THAT(message_of([&] { batch_norm(ramp({1, 1, 1, 3}), ramp({3}), ramp({3}), Tensor(), Tensor(), {}); }),
             Catch::Contains("more than one value per channel"));
  CHECK_THAT(message_of([&] { top_k_correct(logits, three.slice(0, 2), 4); }),
             Catch::Contains("k = 4"));
}

TEST_CASE("autograd: accumulation, shared inputs, freed graph, no_grad", "[autograd]") {
  Tensor a = ramp({3}, 1.0f).set_requires_grad(true);  // 1 2 3
  Tensor b = ramp({3}, 4.0f).set_requires_grad(true);  // 4 5 6
  Tensor loss = sum(add(mul(a, b), mul(a, a)));        // d/da = b + 2a, d/db = a
  loss.backward();
  CHECK(a.grad().to_host() == std::vector<float>{6, 9, 12});
  CHECK(b.grad().to_host() == std::vector<float>{1, 2, 3});
  // A second graph accumulates into the same gradients.
  sum(a).backward();
  CHECK(a.grad().to_host() == std::vector<float>{7, 10, 13});
  // The first graph was freed.
  CHECK_THROWS_AS(loss.backward(), InvalidArgument);
  {
    NoGradGuard no_grad;
    Tensor y = mul(a, b);
    CHECK_FALSE(y.requires_grad());
    CHECK_THROWS_AS(sum(y).backward(), InvalidArgument);
  }
  CHECK(grad_enabled());
  CHECK_THROWS_AS(mul(a, b).backward(), InvalidArgument);  // not a scalar
  // Gradients flow through views.
  Tensor m = ramp({2, 2}).set_requires_grad(true);
  sum(mul(m.view({4}), ramp({4}, 1.0f))).backward();
  CHECK(m.grad().to_host() == std::vector<float>{1, 2, 3, 4});
}

// y = x, recorded with record_summing: its backward notes whether it was offered x's partial
// gradient sum, and adds g into it where it was (Note [Gradients summed in place]).
Tensor summing_identity(const Tensor& x, std::vector<bool>* offered) {
  Tensor y = x.detach().clone();
  record_summing(y, "SummingIdentity", {x}, [offered](const Tensor& g, const std::vector<Tensor>& partial) {
    offered->push_back(partial.at(0).defined());
    if (!partial[0].defined()) return std::vector<Tensor>{g.clone()};
    axpy_(partial[0], 1.0f, g);
    return std::vector<Tensor>{partial[0]};
  });
  return y;
}

TEST_CASE("autograd offers an op the gradient summed so far where it alone holds it, and adds nothing after",
          "[autograd]") {
  const Tensor e = ramp({3}, 10.0f), d = ramp({3}, 100.0f), c = ramp({3}, 2.0f);
  std::vector<bool> offered;
  SECTION("the other consumer's gradient is the engine's alone: the op sums into it") {
    Tensor x0 = ramp({3}, 1.0f).set_requires_grad(true);
    const Tensor x = mul(x0, c);                         // a node, so x's gradient is summed in the map
    const Tensor p = summing_identity(x, &offered);      // runs last of x's consumers (tape order)
    const Tensor q = mul(x, d);                          // a fresh gradient d * 1 for x
    sum(add(mul(p, e), q)).backward();
    CHECK(offered == std::vector<bool>{true});
    // dx = e + d, once each; dx0 = dx * c.
    CHECK(x0.grad().to_host() == std::vector<float>{(10 + 100) * 2.0f, (11 + 101) * 3.0f, (12 + 102) * 4.0f});
  }
  SECTION("a gradient that another input shares is not offered, and stays that input's") {
    Tensor x0 = ramp({3}, 1.0f).set_requires_grad(true), y0 = ramp({3}, 1.0f).set_requires_grad(true);
    const Tensor x = mul(x0, c), y = mul(y0, c);
    const Tensor p = summing_identity(x, &offered);
    const Tensor q = add(x, y);  // passes one gradient buffer to both x and y
    sum(add(mul(p, e), q)).backward();
    CHECK(offered == std::vector<bool>{false});
    CHECK(x0.grad().to_host() == std::vector<float>{(10 + 1) * 2.0f, (11 + 1) * 3.0f, (12 + 1) * 4.0f});
    CHECK(y0.grad().to_host() == std::vector<float>{2.0f, 3.0f, 4.0f});  // without p's part
  }
  SECTION("an op that runs first has nothing to sum into") {
    Tensor x0 = ramp({3}, 1.0f).set_requires_grad(true);
    const Tensor x = mul(x0, c);
    const Tensor q = mul(x, d);
    const Tensor p = summing_identity(x, &offered);  // created last: runs first
    sum(add(mul(p, e), q)).backward();
    CHECK(offered == std::vector<bool>{false});
    CHECK(x0.grad().to_host() == std::vector<float>{(10 + 100) * 2.0f, (11 + 101) * 3.0f, (12 + 102) * 4.0f});
  }
  SECTION("an input read twice by one add is summed twice") {
    Tensor x0 = ramp({3}, 1.0f).set_requires_grad(true);
    const Tensor x = mul(x0, c);
    const Tensor p = summing_identity(x, &offered);
    sum(add(mul(p, e), add(x, x))).backward();
    CHECK(offered == std::vector<bool>{true});
    CHECK(x0.grad().to_host() == std::vector<float>{(10 + 2) * 2.0f, (11 + 2) * 3.0f, (12 + 2) * 4.0f});
  }
}

// A CPU tensor of standard normal values from rng.
Tensor normal_tensor(std::mt19937& rng, const Shape& shape) {
  std::normal_distribution<float> normal;
  std::vector<float> v(static_cast<std::size_t>(shape_numel(shape)));
  for (float& f : v) f = normal(rng);
  return Tensor::from_host(v, shape, kCpu);
}

TEST_CASE("a convolution adds its input gradient to the sum of x's other consumers: a separate add's bits, "
          "no separate add",
          "[autograd][conv]") {
  // A ResNet block's input: read by a convolution and by the shortcut, whose gradient comes first.
  std::mt19937 rng(5);
  auto random = [&](const Shape& shape) { return normal_tensor(rng, shape); };
  const Tensor x0 = random({2, 6, 7, 16}), w = random({16, 16, 3, 3}), g1 = random({2, 6, 7, 16}),
               g2 = random({2, 6, 7, 16}), scale = random({2, 6, 7, 16});
  const Tensor x_value = mul(x0, scale);
  // Each consumer's gradient of x alone (x a leaf: its gradient as the op gives it).
  auto part = [&](bool through_conv) {
    Tensor x = x_value.detach().clone().set_requires_grad(true);
    if (through_conv) sum(mul(conv2d(x, w, Tensor(), {.stride = 1, .padding = 1}), g1)).backward();
    else sum(mul(relu(x), g2)).backward();
    return x.grad().to_host();
  };
  const std::vector<float> conv_part = part(true), relu_part = part(false);
  // Both, with x = x0 * scale a node, so that its two gradients are summed before mul's backward:
  // loss = sum(conv(x) * g1) + sum(relu(x) * g2). relu's gradient comes first (tape order).
  Tensor leaf = x0.detach().clone().set_requires_grad(true);
  const Tensor x = mul(leaf, scale);
  const Tensor y = conv2d(x, w, Tensor(), {.stride = 1, .padding = 1});
  const Tensor loss = add(sum(mul(y, g1)), sum(mul(relu(x), g2)));
  trace::start();
  loss.backward();
  trace::stop();
  const std::vector<float> got = leaf.grad().to_host(), s = scale.to_host();
  std::vector<float> want(got.size());
  for (std::size_t i = 0; i < want.size(); ++i) want[i] = (relu_part[i] + conv_part[i]) * s[i];
  CHECK(got == want);
  std::size_t axpys = 0;
  for (const trace::Event& ev : trace::collect())
    if (ev.name == "axpy") ++axpys;
  CHECK(axpys == 0);  // the engine would have added the two with one
}

// y = x, recorded: its backward notes the address of the gradient it receives and hands on a
// fresh copy of it, whose address it notes too.
Tensor address_probe(const Tensor& x, std::vector<const float*>* received, std::vector<const float*>* handed) {
  Tensor y = x.detach().clone();
  record(y, "AddressProbe", {x}, [received, handed](const Tensor& g) {
    received->push_back(g.data<float>());
    Tensor copy = g.clone();
    handed->push_back(copy.data<float>());
    return std::vector<Tensor>{copy};
  });
  return y;
}

TEST_CASE("ReLU and batch norm write their input gradient over the output gradient where only the engine "
          "holds it, with the same bits, and leave a gradient two nodes share as it was",
          "[autograd]") {
  // Note [Gradients written over the output's]. Probes around the op record addresses: the one
  // above it hands the op a fresh output gradient, the ones below receive what the op returned
  // for its inputs.
  std::mt19937 rng(7);
  auto random = [&](const Shape& shape) { return normal_tensor(rng, shape); };
  const Shape shape{2, 3, 4, 16};
  const Tensor x0 = random(shape), k = random(shape), res0 = random(shape);
  const Tensor gamma = random({16}), beta = random({16});
  const std::string op = GENERATE(as<std::string>{}, "relu", "batch_norm_relu", "batch_norm",
                                  "batch_norm_add_relu");
  CAPTURE(op);
  // The op on x (and the residual r), with fresh running statistics each time.
  auto apply = [&](const Tensor& x, const Tensor& r) {
    const Tensor rm = Tensor::zeros({16}, kCpu), rv = Tensor::full({16}, 1.0f, kCpu);
    if (op == "relu") return relu(x);
    if (op == "batch_norm_relu") return batch_norm_relu(x, gamma, beta, rm, rv, {});
    if (op == "batch_norm") return batch_norm(x, gamma, beta, rm, rv, {});
    return batch_norm_add_relu(x, r, gamma, beta, rm, rv, {});
  };
  struct Grads {
    std::vector<float> x, res, other;
  };
  // loss = sum(op(x) * k); or, with the op's output gradient shared, loss = sum((op(x) + o) * k):
  // add hands one gradient to both its inputs. o = ol * k is made before the op, so its node runs
  // after the op's (tape order) and would read a write over the shared gradient.
  auto run = [&](bool shared, std::vector<const float*>* received, std::vector<const float*>* handed) {
    Tensor xl = x0.detach().clone().set_requires_grad(true);
    Tensor rl = res0.detach().clone().set_requires_grad(true);
    Tensor ol = x0.detach().clone().set_requires_grad(true);
    std::vector<const float*> unused;
    const Tensor o = shared ? mul(ol, k) : Tensor();
    const Tensor x = address_probe(xl, received, &unused);
    const Tensor r = op == "batch_norm_add_relu" ? address_probe(rl, received, &unused) : Tensor();
    Tensor y = apply(x, r);
    if (shared) y = add(y, o);
    sum(mul(address_probe(y, &unused, handed), k)).backward();
    Grads g{xl.grad().to_host()};
    if (r.defined()) g.res = rl.grad().to_host();
    if (shared) g.other = ol.grad().to_host();
    return g;
  };
  std::vector<const float*> received, handed;
  const Grads alone = run(false, &received, &handed);
  REQUIRE(handed.size() == 1);
  // Over the output gradient: the op's input gradient (the residual's, with one) is that buffer.
  CHECK(std::count(received.begin(), received.end(), handed[0]) == 1);
  received.clear();
  handed.clear();
  const Grads shared = run(true, &received, &handed);
  REQUIRE(handed.size() == 1);
  // Shared with the add's other input: not written over, and that input's gradient is k * k.
  CHECK(std::count(received.begin(), received.end(), handed[0]) == 0);
  const std::vector<float> kk = mul(k, k).to_host();
  CHECK(shared.other == kk);
  // In place or not, the same kernel gives the same bits.
  CHECK(alone.x == shared.x);
  CHECK(alone.res == shared.res);
}

TEST_CASE("autograd names each leaf once its gradient is final, while backward goes on", "[autograd]") {
  // c is consumed by the last op recorded (final first); a by the first and by a later op, so it
  // is final only after the first op's node, which runs last.
  Tensor a = ramp({3}, 1.0f).set_requires_grad(true);  // 1 2 3
  Tensor b = ramp({3}, 4.0f).set_requires_grad(true);  // 4 5 6
  Tensor c = ramp({3}, 7.0f).set_requires_grad(true);  // 7 8 9
  Tensor unused = ramp({3}).set_requires_grad(true);
  Tensor h = mul(a, b);                                  // first: consumes a, b
  Tensor loss = sum(add(mul(h, a), mul(c, c)));          // d/da = 2ab, d/db = a^2, d/dc = 2c
  std::vector<std::string> order;
  std::vector<std::vector<float>> at_signal;
  auto name = [&](const Tensor& t) {
    return t.impl() == a.impl() ? "a" : t.impl() == b.impl() ? "b" : t.impl() == c.impl() ? "c" : "?";
  };
  backward(loss, {.on_leaf_final = [&](const Tensor& leaf) {
             order.push_back(name(leaf));
             at_signal.push_back(leaf.grad().to_host());
           }});
  // Each leaf once, c before a and b; a's second use (mul(h, a)) runs before h's node, so a is
  // named with b when h's node has run. A leaf the graph does not reach is never named.
  REQUIRE(order.size() == 3);
  CHECK(order[0] == "c");
  CHECK(std::find(order.begin(), order.end(), "?") == order.end());
  // At the signal each gradient already holds its final value.
  for (std::size_t k = 0; k < order.size(); ++k) {
    const Tensor& leaf = order[k] == "a" ? a : order[k] == "b" ? b : c;
    CHECK(at_signal[k] == leaf.grad().to_host());
  }
  CHECK(a.grad().to_host() == std::vector<float>{8, 20, 36});
  CHECK(b.grad().to_host() == std::vector<float>{1, 4, 9});
  CHECK(c.grad().to_host() == std::vector<float>{14, 16, 18});
  CHECK_FALSE(unused.grad().defined());
  // A leaf scalar is its own final gradient.
  Tensor s = Tensor::full({1}, 3.0f, kCpu).set_requires_grad(true);
  int named = 0;
  backward(s, {.on_leaf_final = [&](const Tensor& leaf) { named += leaf.impl() == s.impl(); }});
  CHECK(named == 1);
}

TEST_CASE("accuracy and top-k count ties against the label", "[ops]") {
  const std::vector<float> z = {0.1f, 0.7f, 0.2f,   // label 1: top-1
                                0.5f, 0.2f, 0.5f,   // label 2 ties with 0, which ranks first
                                0.3f, 0.3f, 0.4f};  // label 1: behind 2 and the tie at 0
  Tensor logits = Tensor::from_host(std::span<const float>(z), {3, 3}, kCpu);
  Tensor labels = Tensor::from_host(std::vector<std::int32_t>{1, 2, 1}, {3}, kCpu);
  CHECK(top_k_correct(logits, labels, 1) == 1);
  CHECK(top_k_correct(logits, labels, 2) == 2);
  CHECK(top_k_correct(logits, labels, 3) == 3);
  CHECK(accuracy(logits, labels) == Approx(1.0 / 3));
}

TEST_CASE("top-k never counts a row whose logits are not all finite", "[ops]") {
  // TensorFlow's in_top_k: "if any of the predictions are non-finite, the target is considered
  // not in top k". Before, nothing compared greater than a NaN label logit, so a model with NaN
  // weights scored 100%.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> z = {nan,  nan,  nan,    // label 0: all NaN
                                0.1f, nan,  0.2f,   // label 2: the top finite logit, a NaN beside it
                                inf,  0.1f, 0.2f,   // label 0: +inf ranks first, but is not finite
                                0.3f, -inf, 0.1f,   // label 0: top-1, -inf elsewhere in the row
                                0.1f, 0.7f, 0.2f};  // label 1: finite and top-1
  Tensor logits = Tensor::from_host(std::span<const float>(z), {5, 3}, kCpu);
  Tensor labels = Tensor::from_host(std::vector<std::int32_t>{0, 2, 0, 0, 1}, {5}, kCpu);
  CHECK(top_k_correct(logits, labels, 1) == 1);
  CHECK(top_k_correct(logits, labels, 3) == 1);  // every finite row is in the top 3; only one is finite
  CHECK(accuracy(logits, labels) == Approx(1.0 / 5));
  Tensor all_nan = Tensor::full({4, 10}, nan, kCpu);
  CHECK(top_k_correct(all_nan, Tensor::from_host(std::vector<std::int32_t>{0, 1, 2, 3}, {4}, kCpu), 1) == 0);
}

TEST_CASE("dropout: inverted scaling, a mask that is a pure function of seed and offset",
          "[ops]") {
  Tensor x = Tensor::full({1000}, 1.0f, kCpu);
  const auto y = dropout(x, 0.25f, true, 5).to_host();
  int kept = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    CHECK((y[i] == 0.0f || y[i] == Approx(1.0f / 0.75f)));
    CHECK((y[i] != 0.0f) == dropout_keeps(5, i, 0.25f));
    kept += y[i] != 0.0f;
  }
  CHECK(kept > 700);
  CHECK(kept < 800);
  CHECK(dropout(x, 0.25f, true, 5).to_host() == y);
  CHECK(dropout(x, 0.25f, true, 5, 1000).to_host() != y);
  CHECK(dropout(x, 0.25f, false, 5).raw_data() == x.raw_data());
}

TEST_CASE("placement: a missing kernel is an error without soft placement, a logged CPU "
          "fallback with it, log_device_placement names every op once", "[placement]") {
  const Device gpu = Device::gpu(0);
  // A stand-in for a device whose backend lacks conv2d: host memory behind a GPU's name.
  auto fake_allocator = make_bfc_allocator(make_host_sub_allocator(),
                                           {.device_name = "/gpu:0 (test)", .limit_bytes = 64 << 20});
  auto install = [&] {
    set_backend_for_testing(gpu, make_cpu_backend(gpu, *fake_allocator, 1, {OpKind::kConv2d}));
  };
  std::vector<std::string> lines;
  std::mutex mu;
  auto previous_sink = set_log_sink([&](LogLevel, std::string_view m) {
    std::lock_guard lock(mu);
    lines.emplace_back(m);
  });

  reset_backends_for_testing();
  reset_devices_for_testing();
  initialise_devices(ProcessOptions{.allow_soft_placement = false, .log_device_placement = false});
  install();
  {
    Tensor x = Tensor::full({1, 4, 4, 2}, 1.0f, gpu);
    Tensor w = Tensor::full({3, 2, 3, 3}, 1.0f, gpu);
    CHECK(relu(x).device() == gpu);  // supported ops run where the inputs live
    CHECK_THROWS_AS(conv2d(x, w, Tensor()), DeviceError);
    CHECK_THAT(message_of([&] { conv2d(x, w, Tensor()); }),
               Catch::Contains("Conv2D") && Catch::Contains("/gpu:0") &&
                   Catch::Contains("allow_soft_placement"));
    CHECK_THAT(message_of([&] { add(x, Tensor::full({1, 4, 4, 2}, 1.0f, kCpu)); }),
               Catch::Contains("/gpu:0") && Catch::Contains("/cpu:0"));
  }
  set_backend_for_testing(gpu, nullptr);
  reset_backends_for_testing();
  reset_devices_for_testing();

  initialise_devices(ProcessOptions{.allow_soft_placement = true, .log_device_placement = true});
  install();
  {
    std::vector<float> xv(32);
    for (std::size_t i = 0; i < xv.size(); ++i) xv[i] = 0.1f * static_cast<float>(i);
    Tensor x = Tensor::from_host(std::span<const float>(xv), {1, 4, 4, 2}, gpu);
    Tensor w = Tensor::full({3, 2, 3, 3}, 0.5f, gpu).set_requires_grad(true);
    Tensor y;
    {
      OpScope scope("block.conv");
      y = conv2d(x, w, Tensor(), {.padding = 1});
      y = conv2d(x, w, Tensor(), {.padding = 1});  // logged once only
    }
    CHECK(y.device() == gpu);
    // Same result as on the CPU, and gradients come back to the GPU tensor.
    Tensor ref = conv2d(x.to(kCpu), w.detach().to(kCpu), Tensor(), {.padding = 1});
    CHECK(y.to_host() == ref.to_host());
    sum(y).backward();
    REQUIRE(w.grad().defined());
    CHECK(w.grad().device() == gpu);
    std::lock_guard lock(mu);
    int fallbacks = 0, conv_lines = 0;
    for (const auto& l : lines) {
      fallbacks += l.find("no kernel on /gpu:0; running it on /cpu:0") != std::string::npos;
      conv_lines += l == "block.conv/Conv2D: (Conv2D): /job:localhost/replica:0/task:0/device:CPU:0";
    }
    CHECK(fallbacks == 1);
    CHECK(conv_lines == 1);
  }
  set_backend_for_testing(gpu, nullptr);
  reset_backends_for_testing();
  reset_devices_for_testing();
  set_log_sink(previous_sink);
}

// An op run on /cpu:0 for a device that lacks its kernel hands that device float32, whatever
// OutputReaders says: the device may not read bfloat16 (Note [bf16 activations] in ops.cc).
TEST_CASE("placement: a CPU fallback of a pool or batch norm gives float32 to a device without bf16 activations",
          "[placement][bf16]") {
  const Device gpu = Device::gpu(0);
  auto fake_allocator = make_bfc_allocator(make_host_sub_allocator(),
                                           {.device_name = "/gpu:0 (test)", .limit_bytes = 64 << 20});
  auto previous_sink = set_log_sink([](LogLevel, std::string_view) {});
  reset_backends_for_testing();
  reset_devices_for_testing();
  initialise_devices(ProcessOptions{.allow_soft_placement = true, .log_device_placement = false});
  set_backend_for_testing(gpu, make_cpu_backend(gpu, *fake_allocator, 1,
                                                {OpKind::kMaxPool, OpKind::kBatchNorm, OpKind::kBf16Activations}));
  {
    const PrecisionScope bf16(Precision::Bf16);
    Tensor x = ramp({2, 6, 6, 16}).to(gpu);
    const Tensor pooled = max_pool2d_relu(x, {.kernel = 3, .stride = 2, .padding = 1,
                                              .readers = OutputReaders::kConvolutions});
    CHECK(pooled.device() == gpu);
    CHECK(pooled.dtype() == DType::kFloat32);
    // On the CPU itself the same call stores bf16.
    CHECK(max_pool2d_relu(x.to(kCpu), {.kernel = 3, .stride = 2, .padding = 1,
                                       .readers = OutputReaders::kConvolutions}).dtype() == DType::kBFloat16);
    const Tensor gamma = Tensor::full({16}, 1.0f, gpu), beta = Tensor::zeros({16}, gpu);
    Tensor rm = Tensor::zeros({16}, gpu), rv = Tensor::full({16}, 1.0f, gpu);
    const Tensor normed = batch_norm_relu(x, gamma, beta, rm, rv, {.readers = OutputReaders::kConvolutions});
    CHECK(normed.device() == gpu);
    CHECK(normed.dtype() == DType::kFloat32);
  }
  set_backend_for_testing(gpu, nullptr);
  reset_backends_for_testing();
  reset_devices_for_testing();
  set_log_sink(previous_sink);
}

TEST_CASE("steady-state steps reuse pool memory: no new regions", "[tensor][memory]") {
  Tensor w = Tensor::full({8, 3, 3, 3}, 0.1f, kCpu).set_requires_grad(true);
  Tensor x = ramp({4, 8, 8, 3});
  auto step = [&] { sum(relu(conv2d(x, w, Tensor(), {.padding = 1}))).backward(); };
  step();
  step();
  const AllocatorStats before = device_allocator(kCpu).stats();
  for (int i = 0; i < 3; ++i) step();
  const AllocatorStats after = device_allocator(kCpu).stats();
  CHECK(after.num_regions == before.num_regions);
  CHECK(after.pool_bytes == before.pool_bytes);
  CHECK(after.num_allocs > before.num_allocs);  // the steps did allocate, from the pool
}

TEST_CASE("MacCounter counts the products the CPU runs on this thread, forward and backward, by scope",
          "[tensor][mac_counter]") {
  const Device cpu = Device::cpu(0);
  Tensor x = Tensor::full({2, 8, 8, 3}, 0.5f, cpu);
  x.set_requires_grad(true);
  Tensor w = Tensor::full({4, 3, 3, 3}, 0.1f, cpu);
  w.set_requires_grad(true);
  Tensor fc = Tensor::full({5, 4 * 4 * 4}, 0.1f, cpu);
  fc.set_requires_grad(true);
  const std::int64_t conv_macs = 2LL * 4 * 4 * 4 * 3 * 9;  // stride 2, pad 1: 4x4 outputs
  const std::int64_t fc_macs = 2LL * 5 * 64;
  MacCounter outer;
  std::int64_t inner_total = 0;
  {
    MacCounter count;  // the innermost counts
    Tensor y;
    {
      OpScope scope("block.conv");
      y = conv2d(x, w, Tensor(), {.stride = 2, .padding = 1});
    }
    const Tensor logits = linear(flatten(y), fc, Tensor());
    REQUIRE(count.rows().size() == 2);
    CHECK(count.rows()[0].scope == "block.conv");
    CHECK(count.rows()[0].op == "conv forward");
    CHECK(count.rows()[0].shape == "2x8x8x3 -> 4, 3x3, stride 2, pad 1");
    CHECK(count.rows()[0].macs == conv_macs);
    CHECK(count.rows()[1].op == "matmul");
    CHECK(count.rows()[1].macs == fc_macs);
    sum(logits).backward();
    // Both gradients of each product: input and weights.
    CHECK(count.total("conv forward") == conv_macs);
    CHECK(count.total("conv backward") == 2 * conv_macs);
    CHECK(count.total("matmul") == 3 * fc_macs);
    inner_total = count.total();
    // Another thread's products are its own.
    std::thread([&] { (void)conv2d(x.detach(), w.detach(), Tensor(), {.stride = 2, .padding = 1}); }).join();
    CHECK(count.total() == inner_total);
  }
  CHECK(outer.total() == 0);
  (void)conv2d(x.detach(), w.detach(), Tensor(), {.stride = 2, .padding = 1});
  CHECK(outer.total() == conv_macs);  // the outer counter again, once the inner is gone
}

// The backward pass runs each op's gradient in the scope its forward ran in, without a "layer"
// span of its own (OpScope): the kernel choice's start-up block names the layer of a backward
// problem measured on its own (the forward ran on the fixed rule here, so no forward problem of
// that shape lends it a name), the products counted in the backward carry it, and the caller's
// scope is back after backward.
TEST_CASE("a gradient runs in its forward's scope: kernel choices and products of every pass name the layer",
          "[autograd][kernel_choice]") {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  const auto randn = [&](std::size_t n) {
    std::vector<float> v(n);
    for (float& e : v) e = nd(rng);
    return v;
  };
  Tensor x = Tensor::from_host(randn(2 * 8 * 8 * 8), {2, 8, 8, 8}, kCpu).set_requires_grad(true);
  Tensor w = Tensor::from_host(randn(8 * 8 * 9), {8, 8, 3, 3}, kCpu).set_requires_grad(true);
  Tensor b = Tensor::from_host(randn(8), {8}, kCpu).set_requires_grad(true);
  const std::filesystem::path cache =
      std::filesystem::temp_directory_path() / ("towerflow-scope-choices-" + std::to_string(::getpid()) + ".json");
  std::filesystem::remove(cache);
  reset_kernel_choices_for_testing();
  set_kernel_choice_cache(cache.string());
  MacCounter count;
  Tensor y;
  {
    OpScope scope("net.conv");
    y = conv2d(x, w, b, {.padding = 1});
  }
  set_kernel_choice(KernelChoice::kAuto);
  const OpScope outer("caller");
  trace::start();
  sum(y).backward();
  trace::stop();
  CHECK(OpScope::current() == "caller");
  const std::vector<KernelChoiceRecord> records = kernel_choices();
  set_kernel_choice(KernelChoice::kFixed);
  reset_kernel_choices_for_testing();
  set_kernel_choice_cache("");
  std::filesystem::remove(cache);
  REQUIRE(count.rows().size() == 3);  // forward, backward input, backward weight
  for (const auto& r : count.rows()) CHECK(r.scope == "net.conv");
  std::size_t layer_spans = 0, conv_grads = 0;
  for (const trace::Event& ev : trace::collect()) {
    layer_spans += ev.category == "layer";
    if (ev.category == "grad" && ev.name == "Conv2D") {
      ++conv_grads;
      CHECK(ev.detail == "net.conv");
    }
  }
  CHECK(layer_spans == 0);
  CHECK(conv_grads == 1);
  if (kernel_choice_candidates().size() < 2) {
    WARN("SKIPPED: one kernel candidate on this CPU and build, so nothing is measured or named");
    return;
  }
  REQUIRE(records.size() == 2);  // backward input and weight
  for (const KernelChoiceRecord& r : records) {
    INFO(format_kernel_choice(r));
    CHECK(r.layer == "net.conv");
    CHECK(r.pass != "forward");
  }
}

TEST_CASE("max_pool2d_relu equals max_pool2d of relu bit for bit, forward and backward", "[tensor][pool]") {
  // Values on a coarse grid, so windows hold ties, all-negative windows and zeros.
  std::mt19937 gen(7);
  std::uniform_int_distribution<int> level(-4, 4);
  for (const Pool2dOptions o : {Pool2dOptions{.kernel = 3, .stride = 2, .padding = 1},
                                Pool2dOptions{.kernel = 2, .stride = 2, .padding = 0},
                                Pool2dOptions{.kernel = 3, .stride = 1, .padding = 1}}) {
    INFO("kernel " << o.kernel << " stride " << o.stride << " padding " << o.padding);
    const Shape shape{2, 9, 7, 5};
    std::vector<float> v(static_cast<std::size_t>(shape_numel(shape)));
    for (float& e : v) e = 0.5f * static_cast<float>(level(gen));
    Tensor a = Tensor::from_host(std::span<const float>(v), shape, kCpu);
    Tensor b = Tensor::from_host(std::span<const float>(v), shape, kCpu);
    a.set_requires_grad(true);
    b.set_requires_grad(true);
    const Tensor ya = max_pool2d_relu(a, o);
    const Tensor yb = max_pool2d(relu(b), o);
    REQUIRE(ya.shape() == yb.shape());
    CHECK(ya.to_host() == yb.to_host());
    // An upstream gradient of mixed signs.
    std::vector<float> g(static_cast<std::size_t>(ya.numel()));
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(static_cast<int>(i % 7) - 3) * 0.25f;
    const Tensor up_grad = Tensor::from_host(std::span<const float>(g), ya.shape(), kCpu);
    sum(mul(ya, up_grad)).backward();
    sum(mul(yb, up_grad)).backward();
    const auto ga = a.grad().to_host(), gb = b.grad().to_host();
    CHECK(ga == gb);
    CHECK(std::count_if(ga.begin(), ga.end(), [](float x) { return x != 0.0f; }) > 0);
  }
}

}  // namespace towerflow
