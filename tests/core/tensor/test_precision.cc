// bf16 precision (core/tensor/precision.h): the rounding, and convolutions and matrix products
// against float32 on the same bf16-rounded operands (the same arithmetic: tight) and on the
// float32 operands (the difference bf16 rounding implies).
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string_view>

#include "bf16_paths.h"
#include "core/cpu/bf16.h"
#include "core/error.h"
#include "core/tensor/device_ops.h"
#include "core/tensor/ops.h"
#include "core/tensor/precision.h"
#include "core/trace.h"

using namespace towerflow;

namespace {

std::uint32_t bits_of(float x) {
  std::uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

float from_bits(std::uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}

std::vector<float> randn(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = g(rng);
  return v;
}

std::vector<float> rounded(const std::vector<float>& v) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = round_to_bf16(v[i]);
  return out;
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double scale = 0, err = 0;
  for (float x : b) scale = std::max(scale, std::abs(double(x)));
  for (std::size_t i = 0; i < a.size(); ++i) err = std::max(err, std::abs(double(a[i]) - b[i]));
  return scale > 0 ? err / scale : err;
}

struct Result {
  std::vector<float> y, dx, dw;
};

// y = op(x, w); loss = sum(y * r) with fixed r; the gradients of x and w.
template <typename Op>
Result run(Op op, const std::vector<float>& x, Shape xs, const std::vector<float>& w, Shape ws, Precision p) {
  const PrecisionScope scope(p);
  Tensor xt = Tensor::from_host(x, xs, Device::cpu(0)).set_requires_grad(true);
  Tensor wt = Tensor::from_host(w, ws, Device::cpu(0)).set_requires_grad(true);
  Tensor y = op(xt, wt);
  const auto r = randn(static_cast<std::size_t>(y.numel()), 99);
  Tensor loss = sum(mul(y, Tensor::from_host(r, y.shape(), Device::cpu(0))));
  loss.backward();
  return {y.to_host(), xt.grad().to_host(), wt.grad().to_host()};
}

}  // namespace

TEST_CASE("bf16 rounding: nearest, ties to even, NaN and infinity kept", "[precision]") {
  CHECK(round_to_bf16(1.0f) == 1.0f);
  CHECK(round_to_bf16(-2.5f) == -2.5f);
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even one, 1.
  CHECK(round_to_bf16(1.0f + std::ldexp(1.0f, -8)) == 1.0f);
  // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6: the even one is 1 + 2^-6.
  CHECK(round_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)) == 1.0f + std::ldexp(1.0f, -6));
  CHECK(round_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)) == 1.0f + std::ldexp(1.0f, -7));
  CHECK((bits_of(round_to_bf16(3.14159265f)) & 0xffffu) == 0);
  CHECK(round_to_bf16(3.14159265f) == from_bits(0x40490000u));  // 3.140625, the nearest bf16
  CHECK(std::isnan(round_to_bf16(std::numeric_limits<float>::quiet_NaN())));
  CHECK(std::isnan(round_to_bf16(from_bits(0x7f800001u))));  // a NaN whose payload is in the low bits
  CHECK(round_to_bf16(std::numeric_limits<float>::infinity()) == std::numeric_limits<float>::infinity());
  CHECK(round_to_bf16(-std::numeric_limits<float>::infinity()) == -std::numeric_limits<float>::infinity());
  CHECK(round_to_bf16(std::numeric_limits<float>::max()) == std::numeric_limits<float>::infinity());
  CHECK(round_to_bf16(-0.0f) == 0.0f);
  CHECK(std::signbit(round_to_bf16(-0.0f)));
}

TEST_CASE("fp16 rounding: the compiler's own float -> _Float16 conversion, bit for bit", "[precision]") {
#if defined(__FLT16_MAX__)
  // Every exponent from below the subnormals to beyond the largest half, random significands,
  // and the edge cases: ties, the overflow threshold, subnormals, NaN, infinities, signed zero.
  std::vector<float> xs;
  std::mt19937 rng(5);
  for (int e = -30; e <= 17; ++e)
    for (int k = 0; k < 200; ++k) {
      const float m = 1.0f + std::uniform_real_distribution<float>(0.f, 1.f)(rng);
      xs.push_back(std::ldexp(m, e) * (k % 2 ? -1.f : 1.f));
    }
  for (std::uint32_t b : {0x3f801000u, 0x3f803000u, 0x477fe000u, 0x477ff000u, 0x477fefffu, 0x47800000u,
                          0x33000000u, 0x33000001u, 0x32ffffffu, 0x387fc000u, 0x38800000u, 0x7f800000u,
                          0xff800000u, 0x80000000u, 0x00000001u})
    xs.push_back(from_bits(b));
  int mismatches = 0;
  for (float x : xs) {
    const float want = static_cast<float>(static_cast<_Float16>(x));
    const float got = round_to_fp16(x);
    if (bits_of(want) != bits_of(got)) {
      if (++mismatches <= 5) UNSCOPED_INFO("x " << x << " (0x" << std::hex << bits_of(x) << std::dec << "): got " << got << ", want " << want);
    }
  }
  CHECK(mismatches == 0);
  CHECK(std::isnan(round_to_fp16(std::numeric_limits<float>::quiet_NaN())));
#else
  // The compiler has no _Float16: the table of IEEE binary16 facts instead.
  CHECK(round_to_fp16(65504.0f) == 65504.0f);
  CHECK(std::isinf(round_to_fp16(65520.0f)));
  CHECK(round_to_fp16(65519.0f) == 65504.0f);
  CHECK(round_to_fp16(std::ldexp(1.0f, -24)) == std::ldexp(1.0f, -24));
  CHECK(round_to_fp16(std::ldexp(1.0f, -25)) == 0.0f);
  CHECK(round_to_fp16(1.0f + std::ldexp(1.0f, -11)) == 1.0f);
#endif
}

TEST_CASE("the roundings over arrays equal the element roundings, in place too", "[precision]") {
  // The array versions are what the CPU backend runs (vectorised); the element versions are the
  // ones checked above against hand-made cases and the compiler's _Float16.
  std::vector<float> xs;
  std::mt19937 rng(6);
  for (int e = -140; e <= 128; e += 3)
    for (int k = 0; k < 40; ++k) {
      const float m = 1.0f + std::uniform_real_distribution<float>(0.f, 1.f)(rng);
      xs.push_back(std::ldexp(m, e) * (k % 2 ? -1.f : 1.f));
    }
  for (std::uint32_t b : {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffffffffu, 0x7f7fffffu,
                          0x00000001u, 0x80000000u, 0x3f808000u, 0x477ff000u, 0x33000000u})
    xs.push_back(from_bits(b));
  const auto same = [](float a, float b) { return std::isnan(a) ? std::isnan(b) : bits_of(a) == bits_of(b); };
  for (const bool fp16 : {false, true}) {
    std::vector<float> out(xs.size()), in_place = xs;
    if (fp16) {
      round_to_fp16(std::int64_t(xs.size()), xs.data(), out.data());
      round_to_fp16(std::int64_t(in_place.size()), in_place.data(), in_place.data());
    } else {
      round_to_bf16(std::int64_t(xs.size()), xs.data(), out.data());
      round_to_bf16(std::int64_t(in_place.size()), in_place.data(), in_place.data());
    }
    int mismatches = 0;
    for (std::size_t i = 0; i < xs.size(); ++i) {
      const float want = fp16 ? round_to_fp16(xs[i]) : round_to_bf16(xs[i]);
      if (!same(want, out[i]) || !same(want, in_place[i])) ++mismatches;
    }
    INFO((fp16 ? "fp16" : "bf16") << " over " << xs.size() << " values");
    CHECK(mismatches == 0);
  }
}

TEST_CASE("precision scopes nest per thread and parse with a clear error", "[precision]") {
  CHECK(current_precision() == Precision::Fp32);
  {
    const PrecisionScope a(Precision::Bf16);
    CHECK(current_precision() == Precision::Bf16);
    {
      const PrecisionScope b(Precision::Fp32);
      CHECK(current_precision() == Precision::Fp32);
    }
    CHECK(current_precision() == Precision::Bf16);
  }
  CHECK(current_precision() == Precision::Fp32);
  CHECK(parse_precision("bf16") == Precision::Bf16);
  CHECK(to_string(Precision::Bf16) == "bf16");
  CHECK(parse_precision("fp16") == Precision::Fp16);
  CHECK(to_string(Precision::Fp16) == "fp16");
  CHECK_THROWS_WITH(parse_precision("fp8"), Catch::Contains("'fp8'") && Catch::Contains("fp32, bf16 or fp16"));
}

TEST_CASE("bf16 convolutions and matrix products equal fp32 on bf16-rounded operands, forward and backward",
          "[precision]") {
  struct Case {
    const char* name;
    Shape xs, ws;
    std::function<Tensor(const Tensor&, const Tensor&)> op;
  };
  const Tensor none;
  // ResNet-20's and tfcnn's layer shapes (small batches) and odd ones.
  const std::vector<Case> cases = {
      {"conv 3x3 16->16 (ResNet-20)", {2, 8, 8, 16}, {16, 16, 3, 3},
       [&](const Tensor& x, const Tensor& w) { return conv2d(x, w, none, {.stride = 1, .padding = 1}); }},
      {"conv 3x3 16->32 stride 2 (ResNet-20)", {2, 8, 8, 16}, {32, 16, 3, 3},
       [&](const Tensor& x, const Tensor& w) { return conv2d(x, w, none, {.stride = 2, .padding = 1}); }},
      {"conv 5x5 3->64 (tfcnn)", {2, 12, 12, 3}, {64, 3, 5, 5},
       [&](const Tensor& x, const Tensor& w) { return conv2d(x, w, none, {.stride = 1, .padding = 2}); }},
      {"conv 3x3 odd 5->7 on 7x9", {3, 7, 9, 5}, {7, 5, 3, 3},
       [&](const Tensor& x, const Tensor& w) { return conv2d(x, w, none, {.stride = 1, .padding = 0}); }},
      {"linear 64->10 (ResNet-20's fc)", {5, 64}, {10, 64},
       [&](const Tensor& x, const Tensor& w) { return linear(x, w, none); }},
      {"linear 384->192 (tfcnn)", {4, 384}, {192, 384},
       [&](const Tensor& x, const Tensor& w) { return linear(x, w, none); }},
      {"matmul 13x17 by 17x11", {13, 17}, {17, 11}, [&](const Tensor& a, const Tensor& b) { return matmul(a, b); }},
  };
  // Every bf16 path this CPU runs: the emulated one (ops.cc rounds the operands), and the bf16
  // kernels of the CPU backend's *_bf16 (oneDNN's, towerflow's AVX512-BF16 ones) where they run
  // here (tests/bf16_paths.h).
  const std::vector<cpu::Bf16Kernels> paths = testing::bf16_paths();
  const testing::AutomaticBf16Kernels automatic;
  for (const cpu::Bf16Kernels path : paths)
  for (const Case& c : cases) {
    cpu::force_bf16_kernels_for_testing(path);
    INFO("bf16 kernels: " << cpu::bf16_kernels_name(path));
    const auto x = randn(static_cast<std::size_t>(shape_numel(c.xs)), 1);
    const auto w = randn(static_cast<std::size_t>(shape_numel(c.ws)), 2);
    const Result bf16 = run(c.op, x, c.xs, w, c.ws, Precision::Bf16);
    const Result same_arithmetic = run(c.op, rounded(x), c.xs, rounded(w), c.ws, Precision::Fp32);
    const Result fp32 = run(c.op, x, c.xs, w, c.ws, Precision::Fp32);
    INFO(c.name);
    // Forward: the fp32 kernel on rounded operands exactly (emulated), or the same products summed
    // in the bf16 kernels' order.
    CHECK(max_rel(bf16.y, same_arithmetic.y) <= (path == cpu::Bf16Kernels::Emulated ? 0.0 : 1e-5));
    // Backward rounds the incoming gradient too, so against fp32 backward on rounded operands
    // the difference is that of one rounding of the gradient.
    CHECK(max_rel(bf16.dx, same_arithmetic.dx) < 1e-2);
    CHECK(max_rel(bf16.dw, same_arithmetic.dw) < 1e-2);
    // Against fp32 operands: bf16 keeps 8 significant bits, a relative error of at most 2^-8 per
    // operand; sums of many products stay within a few times that of the largest value.
    const double ey = max_rel(bf16.y, fp32.y), edx = max_rel(bf16.dx, fp32.dx), edw = max_rel(bf16.dw, fp32.dw);
    INFO("max relative difference to fp32: y " << ey << ", dx " << edx << ", dw " << edw);
    CHECK(ey < 1.5e-2);
    CHECK(edx < 1.5e-2);
    CHECK(edw < 1.5e-2);
    CHECK(ey > 0);  // the rounding did happen
  }
}

// Note [bf16 activations] in core/tensor/ops.cc: under bf16 precision, batch_norm_relu whose output
// only convolutions read stores it as bfloat16 where the device can; the convolution rounds its
// input to bf16 anyway, so the loss, every gradient and the running statistics are the same, bit
// for bit, as with a float32 output. On every bf16 path this CPU runs (tests/bf16_paths.h): the
// emulated one widens the stored bf16, oneDNN's and towerflow's own kernels read it as it is.
TEST_CASE("bf16 activations: batch norm stores bf16 for the convolution after it, bit for bit the same training",
          "[precision][bf16]") {
  const Device cpu = Device::cpu(0);
  struct Step {
    DType stored;
    std::vector<std::vector<float>> values;  // loss, gradients, running statistics
  };
  auto step = [&](OutputReaders readers) {
    const PrecisionScope bf16(Precision::Bf16);
    const Tensor none;
    Tensor x = Tensor::from_host(randn(2 * 9 * 7 * 5, 11), {2, 9, 7, 5}, cpu);
    Tensor w1 = Tensor::from_host(randn(16 * 5 * 3 * 3, 12), {16, 5, 3, 3}, cpu);
    Tensor w2 = Tensor::from_host(randn(24 * 16 * 3 * 3, 13), {24, 16, 3, 3}, cpu);
    Tensor gamma = Tensor::from_host(randn(16, 14), {16}, cpu);
    Tensor beta = Tensor::from_host(randn(16, 15), {16}, cpu);
    Tensor rm = Tensor::zeros({16}, cpu), rv = Tensor::full({16}, 1.0f, cpu);
    for (Tensor* t : {&x, &w1, &w2, &gamma, &beta}) t->set_requires_grad(true);
    const Tensor h = conv2d(x, w1, none, {.stride = 1, .padding = 1});
    const Tensor a = batch_norm_relu(h, gamma, beta, rm, rv, {.readers = readers});
    const Tensor out = conv2d(a, w2, none, {.stride = 2, .padding = 1});
    const Tensor loss = sum(mul(out, Tensor::from_host(randn(out.numel(), 16), out.shape(), cpu)));
    loss.backward();
    return Step{a.dtype(), {loss.to_host(), x.grad().to_host(), w1.grad().to_host(),
                            w2.grad().to_host(), gamma.grad().to_host(), beta.grad().to_host(),
                            rm.to_host(), rv.to_host()}};
  };
  const testing::AutomaticBf16Kernels automatic;
  for (const cpu::Bf16Kernels path : testing::bf16_paths()) {
    cpu::force_bf16_kernels_for_testing(path);
    const bool stores_bf16 = has_kernel(cpu, OpKind::kBf16Activations);
    INFO("bf16 kernels: " << cpu::bf16_kernels_name(path) << "; bf16 activations here: " << stores_bf16);
    CHECK(stores_bf16);
    const Step any = step(OutputReaders::kAny), convs = step(OutputReaders::kConvolutions);
    CHECK(any.stored == DType::kFloat32);
    CHECK(convs.stored == DType::kBFloat16);
    const char* names[] = {"loss", "dx", "dw1", "dw2", "dgamma", "dbeta", "running mean", "running var"};
    for (std::size_t i = 0; i < any.values.size(); ++i) {
      INFO(names[i]);
      CHECK(convs.values[i] == any.values[i]);
    }
  }
}

// Note [bf16 convolution outputs] in core/tensor/ops.cc: under bf16 precision, conv2d whose output
// only a batch norm reads stores it as bfloat16, the float32 output rounded; the batch norm
// computes on those values as on floats. So every result equals that of the same ops on a float32
// copy of the stored values, bit for bit: the batch norm's output, statistics and gradients, and
// the convolution's gradients for the batch norm's input gradient. On every bf16 path this CPU
// runs that multiplies in bf16, for the plain, ReLU (storing bf16 for a convolution), residual and
// inference forms; where bf16 is emulated the output stays float32.
TEST_CASE("bf16 convolution outputs: stored rounded, and the batch norm computes on them as on floats",
          "[precision][bf16]") {
  const Device cpu = Device::cpu(0);
  const Tensor none;
  const Shape hs = {2, 9, 7, 16};
  const auto host = [&](const std::vector<float>& v, const Shape& shape) { return Tensor::from_host(v, shape, cpu); };
  const testing::AutomaticBf16Kernels automatic;
  bool any = false;
  for (const cpu::Bf16Kernels path : testing::bf16_paths()) {
    cpu::force_bf16_kernels_for_testing(path);
    INFO("bf16 kernels: " << cpu::bf16_kernels_name(path));
    const Tensor x0 = host(randn(4 * 3 * 3 * 8, 21), {4, 3, 3, 8}), w0 = host(randn(8 * 8 * 9, 22), {8, 8, 3, 3});
    const Conv2dOptions for_bn{.padding = 1, .readers = OutputReaders::kBatchNorm};
    CHECK(conv2d(x0, w0, none, for_bn).dtype() == DType::kFloat32);  // fp32 precision
    const PrecisionScope bf16(Precision::Bf16);
    if (!has_kernel(cpu, OpKind::kBf16Products)) {  // emulated: the output stays float32
      CHECK(conv2d(x0, w0, none, for_bn).dtype() == DType::kFloat32);
      continue;
    }
    any = true;
    {
      // The batch norms read it, in training and inference; other ops reject it, as a residual too.
      const Tensor h = conv2d(x0, w0, none, for_bn);
      REQUIRE(h.dtype() == DType::kBFloat16);
      const Tensor gamma = Tensor::full({8}, 1.0f, cpu), beta = Tensor::zeros({8}, cpu);
      const Tensor rm = Tensor::zeros({8}, cpu), rv = Tensor::full({8}, 1.0f, cpu);
      CHECK(batch_norm(h, gamma, beta, rm, rv, {}).dtype() == DType::kFloat32);
      CHECK(batch_norm(h, gamma, beta, rm, rv, {.training = false}).dtype() == DType::kFloat32);
      CHECK_THROWS_WITH(relu(h), Catch::Contains("Conv2dOptions::readers"));
      // As a residual, widened (Note [bf16 block outputs]): what a float32 copy gives.
      const auto* hb = reinterpret_cast<const std::uint16_t*>(h.data<bfloat16>());
      std::vector<float> hw(static_cast<std::size_t>(h.numel()));
      for (std::size_t i = 0; i < hw.size(); ++i) hw[i] = std::bit_cast<float>(std::uint32_t{hb[i]} << 16);
      Tensor rm2 = rm.clone(), rv2 = rv.clone();
      CHECK(batch_norm_add_relu(x0, h, gamma, beta, rm, rv, {}).to_host() ==
            batch_norm_add_relu(x0, host(hw, h.shape()), gamma, beta, rm2, rv2, {}).to_host());
    }
    const char* forms[] = {"batch norm", "+ ReLU, bf16 output", "+ residual + ReLU", "inference"};
    for (int form = 0; form < 4; ++form) {
      INFO(forms[form]);
      Tensor x = host(randn(2 * 9 * 7 * 5, 41), {2, 9, 7, 5}).set_requires_grad(true);
      Tensor w1 = host(randn(16 * 5 * 9, 42), {16, 5, 3, 3}).set_requires_grad(true);
      const Tensor w2 = host(randn(8 * 16 * 9, 43), {8, 16, 3, 3});
      // The batch norm's input h, its parameters and what follows it, then the loss; the running
      // statistics are returned in rm and rv.
      const auto tail = [&](const Tensor& h, Tensor& gamma, Tensor& beta, Tensor& residual, Tensor& rm, Tensor& rv) {
        gamma = host(randn(16, 44), {16}).set_requires_grad(true);
        beta = host(randn(16, 45), {16}).set_requires_grad(true);
        residual = host(randn(2 * 9 * 7 * 16, 46), hs).set_requires_grad(true);
        rm = host(randn(16, 47), {16});
        rv = Tensor::full({16}, 1.5f, cpu);
        BatchNormOptions o{.training = form != 3};
        Tensor y;
        if (form == 0 || form == 3) y = batch_norm(h, gamma, beta, rm, rv, o);
        if (form == 1) {
          o.readers = OutputReaders::kConvolutions;
          y = conv2d(batch_norm_relu(h, gamma, beta, rm, rv, o), w2, none, {.padding = 1});
        }
        if (form == 2) y = batch_norm_add_relu(h, residual, gamma, beta, rm, rv, o);
        return sum(mul(y, host(randn(y.numel(), 48), y.shape())));
      };
      // The stored output: the float32 output rounded (oneDNN's kernel for it may sum in another
      // order than its float32 one: within a rounding there).
      const Tensor h = conv2d(x, w1, none, {.padding = 1, .readers = OutputReaders::kBatchNorm});
      REQUIRE(h.dtype() == DType::kBFloat16);
      const auto* bits = reinterpret_cast<const std::uint16_t*>(h.data<bfloat16>());
      std::vector<float> stored(static_cast<std::size_t>(h.numel()));
      for (std::size_t i = 0; i < stored.size(); ++i) stored[i] = std::bit_cast<float>(std::uint32_t{bits[i]} << 16);
      const std::vector<float> h32 = conv2d(x.detach(), w1.detach(), none, {.padding = 1}).to_host();
      double worst = 0.0;
      std::size_t exact = 0;
      for (std::size_t i = 0; i < stored.size(); ++i) {
        worst = std::max(worst, std::abs(double(stored[i]) - h32[i]) / std::max(1e-3, std::abs(double(h32[i]))));
        exact += std::bit_cast<std::uint32_t>(stored[i]) == (std::bit_cast<std::uint32_t>(cpu::round_to_bf16(h32[i])));
      }
      CHECK(worst <= 0x1p-8);
      if (path != cpu::Bf16Kernels::OneDnn) CHECK(exact == stored.size());

      Tensor gamma, beta, residual, rm, rv;
      const Tensor loss = tail(h, gamma, beta, residual, rm, rv);
      loss.backward();
      // The same on a float32 copy of the stored values.
      Tensor h_copy = host(stored, hs).set_requires_grad(true);
      Tensor gamma2, beta2, residual2, rm2, rv2;
      const Tensor loss2 = tail(h_copy, gamma2, beta2, residual2, rm2, rv2);
      loss2.backward();
      CHECK(loss.to_host() == loss2.to_host());
      CHECK(rm.to_host() == rm2.to_host());
      CHECK(rv.to_host() == rv2.to_host());
      if (form != 3) {
        CHECK(gamma.grad().to_host() == gamma2.grad().to_host());
        CHECK(beta.grad().to_host() == beta2.grad().to_host());
      }
      if (form == 2) CHECK(residual.grad().to_host() == residual2.grad().to_host());
      // The convolution's gradients for the copy's gradient.
      Tensor x2 = x.detach().clone().set_requires_grad(true), w12 = w1.detach().clone().set_requires_grad(true);
      sum(mul(conv2d(x2, w12, none, {.padding = 1}), h_copy.grad())).backward();
      CHECK(x.grad().to_host() == x2.grad().to_host());
      CHECK(w1.grad().to_host() == w12.grad().to_host());
    }
  }
  if (!any) WARN("SKIPPED: no bf16 path here multiplies in bf16 (bf16 is emulated on this CPU: " << cpu::describe_bf16_kernels() << ")");
}

// Note [bf16 block outputs] in core/tensor/ops.cc: under bf16 precision a ResNet block's output,
// read by the next block's convolution and, as its residual, by its batch_norm_add_relu
// (OutputReaders::kConvolutionsAndResidual), is stored as bfloat16, the float32 output rounded,
// and the next batch norm adds it as it is. Checked on a stem (batch_norm_relu, bf16 output), a
// block reading it twice and a convolution after the block: the block's output is the float32
// block's on float32 copies of the stored values, rounded, and the loss and every gradient are
// the float32 graph's on those copies, bit for bit. On every bf16 path this CPU runs; where bf16
// is emulated the convolutions' outputs stay float32, and so does the block's (its batch norm
// reads the stem's bf16 output widened).
TEST_CASE("bf16 block outputs: stored rounded for the next block, whose batch norm adds them as floats",
          "[precision][bf16]") {
  const Device cpu = Device::cpu(0);
  const Tensor none;
  const Shape s = {2, 9, 7, 16};
  const std::size_t n = 2 * 9 * 7 * 16;
  const auto host = [&](const std::vector<float>& v, const Shape& shape) { return Tensor::from_host(v, shape, cpu); };
  const auto values = [](const Tensor& t) {  // as floats, whatever the storage
    if (t.dtype() == DType::kFloat32) return t.to_host();
    const auto* bits = reinterpret_cast<const std::uint16_t*>(t.data<bfloat16>());
    std::vector<float> v(static_cast<std::size_t>(t.numel()));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::bit_cast<float>(std::uint32_t{bits[i]} << 16);
    return v;
  };
  const OutputReaders kBlock = OutputReaders::kConvolutionsAndResidual;
  const testing::AutomaticBf16Kernels automatic;
  for (const cpu::Bf16Kernels path : testing::bf16_paths()) {
    cpu::force_bf16_kernels_for_testing(path);
    INFO("bf16 kernels: " << cpu::bf16_kernels_name(path));
    const PrecisionScope bf16(Precision::Bf16);
    const bool products = has_kernel(cpu, OpKind::kBf16Products);
    struct Params {
      Tensor w1, w2, gamma, beta, rm, rv;
    };
    const auto params = [&] {
      Params p{host(randn(16 * 16 * 9, 61), {16, 16, 3, 3}), host(randn(8 * 16 * 9, 62), {8, 16, 3, 3}),
               host(randn(16, 63), {16}), host(randn(16, 64), {16}), host(randn(16, 65), {16}),
               Tensor::full({16}, 1.5f, cpu)};
      for (Tensor* t : {&p.w1, &p.w2, &p.gamma, &p.beta}) t->set_requires_grad(true);
      return p;
    };
    const Tensor m = host(randn(2 * 9 * 7 * 8, 66), {2, 9, 7, 8});
    // The stem's output, stored as bf16 for the block.
    Tensor z = host(randn(n, 67), s).set_requires_grad(true);
    const Tensor g0 = host(randn(16, 68), {16}), b0 = host(randn(16, 69), {16});
    Tensor rm0 = Tensor::zeros({16}, cpu), rv0 = Tensor::full({16}, 1.0f, cpu);
    const Tensor r = batch_norm_relu(z, g0, b0, rm0, rv0, {.readers = kBlock});
    REQUIRE(r.dtype() == DType::kBFloat16);
    // The block and the convolution after it.
    Params a = params();
    const Tensor h = conv2d(r, a.w1, none, {.padding = 1, .readers = OutputReaders::kBatchNorm});
    const Tensor y = batch_norm_add_relu(h, r, a.gamma, a.beta, a.rm, a.rv, {.readers = kBlock});
    CHECK(y.dtype() == (products ? DType::kBFloat16 : DType::kFloat32));
    const Tensor loss = sum(mul(conv2d(y, a.w2, none, {.padding = 1}), m));
    loss.backward();

    // The float32 graph on copies of the stored r and h.
    Tensor r_copy = host(values(r), s).set_requires_grad(true);
    Params b = params();
    Tensor h_copy = host(values(h), s).set_requires_grad(true);
    const Tensor y_ref = batch_norm_add_relu(h_copy, r_copy, b.gamma, b.beta, b.rm, b.rv, {});
    REQUIRE(y_ref.dtype() == DType::kFloat32);
    const std::vector<float> got = values(y), want = y_ref.to_host();
    std::size_t inexact = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      const float rounded = products ? cpu::round_to_bf16(want[i]) : want[i];
      inexact += rounded != want[i];
      if (std::bit_cast<std::uint32_t>(got[i]) != std::bit_cast<std::uint32_t>(rounded)) {
        FAIL_CHECK("block output " << i << ": " << got[i] << ", the float32 block's rounded " << rounded);
        break;
      }
    }
    if (products) CHECK(inexact > want.size() / 4);  // the rounding did happen
    const Tensor loss_ref = sum(mul(conv2d(y_ref, b.w2, none, {.padding = 1}), m));
    loss_ref.backward();
    // h's graph: the convolution of r, for h_copy's gradient.
    sum(mul(conv2d(r_copy, b.w1, none, {.padding = 1}), h_copy.grad())).backward();
    CHECK(loss.to_host() == loss_ref.to_host());
    CHECK(a.w2.grad().to_host() == b.w2.grad().to_host());
    CHECK(a.gamma.grad().to_host() == b.gamma.grad().to_host());
    CHECK(a.beta.grad().to_host() == b.beta.grad().to_host());
    CHECK(a.w1.grad().to_host() == b.w1.grad().to_host());
    CHECK(a.rm.to_host() == b.rm.to_host());
    CHECK(a.rv.to_host() == b.rv.to_host());
    // r's gradient (the residual's and the convolution's, summed) through the stem.
    Tensor z2 = z.detach().clone().set_requires_grad(true);
    Tensor rm02 = Tensor::zeros({16}, cpu), rv02 = Tensor::full({16}, 1.0f, cpu);
    sum(mul(batch_norm_relu(z2, g0, b0, rm02, rv02, {}), r_copy.grad())).backward();
    CHECK(z.grad().to_host() == z2.grad().to_host());
  }
}

// A ResNet block's input under bf16: read by a convolution and by the shortcut, whose gradient
// comes first. Where the bf16 kernels add the convolution's input gradient as they store it (the
// emulated, pair and AMX kernels; Note [Gradients summed in place] in autograd.cc), the sum has
// the bits of the two gradients added apart and no separate add runs; on oneDNN's, which store,
// the engine adds.
TEST_CASE("bf16: a convolution adds its input gradient to the shortcut's as its kernels store it",
          "[precision][bf16]") {
  const Device cpu = Device::cpu(0);
  const std::vector<float> x0 = randn(2 * 6 * 7 * 16, 21), w = randn(16 * 16 * 9, 22),
                           g1 = randn(2 * 6 * 7 * 16, 23), g2 = randn(2 * 6 * 7 * 16, 24),
                           scale = randn(2 * 6 * 7 * 16, 25);
  const Shape xs = {2, 6, 7, 16};
  const auto host = [&](const std::vector<float>& v, const Shape& shape) { return Tensor::from_host(v, shape, cpu); };
  const testing::AutomaticBf16Kernels automatic;
  for (const cpu::Bf16Kernels path : testing::bf16_paths()) {
    cpu::force_bf16_kernels_for_testing(path);
    INFO("bf16 kernels: " << cpu::bf16_kernels_name(path));
    const PrecisionScope bf16(Precision::Bf16);
    const Tensor wt = host(w, {16, 16, 3, 3});
    const Tensor x_value = mul(host(x0, xs), host(scale, xs));
    // Each consumer's gradient of x alone.
    auto part = [&](bool through_conv) {
      Tensor x = x_value.detach().clone().set_requires_grad(true);
      if (through_conv) sum(mul(conv2d(x, wt, Tensor(), {.stride = 1, .padding = 1}), host(g1, xs))).backward();
      else sum(mul(relu(x), host(g2, xs))).backward();
      return x.grad().to_host();
    };
    const std::vector<float> conv_part = part(true), relu_part = part(false);
    Tensor leaf = host(x0, xs).set_requires_grad(true);
    const Tensor x = mul(leaf, host(scale, xs));
    const Tensor y = conv2d(x, wt, Tensor(), {.stride = 1, .padding = 1});
    const Tensor loss = add(sum(mul(y, host(g1, xs))), sum(mul(relu(x), host(g2, xs))));
    trace::start();
    loss.backward();
    trace::stop();
    const std::vector<float> got = leaf.grad().to_host();
    std::vector<float> want(got.size());
    for (std::size_t i = 0; i < want.size(); ++i) want[i] = (relu_part[i] + conv_part[i]) * scale[i];
    CHECK(got == want);
    std::size_t axpys = 0;
    for (const trace::Event& ev : trace::collect())
      if (ev.name == "axpy") ++axpys;
    CHECK(axpys == (cpu::bf16_backward_input_adds(path) ? 0u : 1u));
  }
}

// conv2d_max_pool2d_relu against conv2d then max_pool2d_relu: the pooled values, the loss and every
// gradient bit for bit, in float32 and on every bf16 path (storing bf16 for the convolution after
// it), but the bias's, which the fused op sums in the pool's backward pass in another order: equal
// to float rounding. With the bias learnt, fixed, or absent, and with the input's gradient or
// without (tfcnn's conv1), where on towerflow's pair kernels the pool's gradient has no pass of
// its own (the trace's kernels say which ran).
TEST_CASE("conv2d_max_pool2d_relu gives conv2d then max_pool2d_relu's values and gradients",
          "[precision][bf16]") {
  const Device cpu = Device::cpu(0);
  enum class Bias { kLearnt, kFixed, kNone };
  struct Step {
    DType pooled_type;
    std::vector<std::vector<float>> values;
    std::ptrdiff_t pool_passes;  // the backward's max_pool_backward kernels
  };
  auto step = [&](bool fused, Bias bias_kind, bool x_grad) {
    const Tensor none;
    Tensor x = Tensor::from_host(randn(3 * 13 * 11 * 8, 41), {3, 13, 11, 8}, cpu);
    Tensor w1 = Tensor::from_host(randn(32 * 8 * 5 * 5, 42), {32, 8, 5, 5}, cpu);
    Tensor b1 = bias_kind == Bias::kNone ? Tensor() : Tensor::from_host(randn(32, 43), {32}, cpu);
    Tensor w2 = Tensor::from_host(randn(16 * 32 * 3 * 3, 44), {16, 32, 3, 3}, cpu);
    x.set_requires_grad(x_grad);
    w1.set_requires_grad(true);
    w2.set_requires_grad(true);
    if (bias_kind == Bias::kLearnt) b1.set_requires_grad(true);
    const Conv2dOptions conv{.stride = 1, .padding = 2};
    const Pool2dOptions pool{.kernel = 3, .stride = 2, .padding = 1, .readers = OutputReaders::kConvolutions};
    const Tensor a = fused ? conv2d_max_pool2d_relu(x, w1, b1, conv, pool) : max_pool2d_relu(conv2d(x, w1, b1, conv), pool);
    const Tensor out = conv2d(a, w2, none, {.stride = 1, .padding = 1});
    const Tensor loss = sum(mul(out, Tensor::from_host(randn(out.numel(), 45), out.shape(), cpu)));
    trace::start();
    loss.backward();
    trace::stop();
    std::vector<std::vector<float>> values{loss.to_host(), w1.grad().to_host(), w2.grad().to_host()};
    values.push_back(x_grad ? x.grad().to_host() : std::vector<float>{});
    values.push_back(bias_kind == Bias::kLearnt ? b1.grad().to_host() : std::vector<float>{});
    const std::vector<trace::Event> events = trace::collect();
    const auto pool_passes = std::count_if(events.begin(), events.end(), [](const trace::Event& e) {
      return e.category == "kernel" && e.name == "max_pool_backward";
    });
    return Step{a.dtype(), values, pool_passes};
  };
  const char* names[] = {"loss", "dw1", "dw2", "dx", "db1"};
  // rows_path: where the input needs no gradient, the pool's gradient is made inside the weight
  // gradient, with no pass of its own (towerflow's pair kernels in bf16).
  auto compare = [&](const char* precision, bool rows_path) {
    for (const Bias bias_kind : {Bias::kLearnt, Bias::kFixed, Bias::kNone})
      for (const bool x_grad : {true, false}) {
        INFO(precision << ", bias " << (bias_kind == Bias::kLearnt ? "learnt" : bias_kind == Bias::kFixed ? "fixed" : "absent")
                       << (x_grad ? ", with" : ", without") << " the input's gradient");
        const auto [fused_type, fused, fused_pool_passes] = step(true, bias_kind, x_grad);
        const auto [plain_type, plain, plain_pool_passes] = step(false, bias_kind, x_grad);
        CHECK(plain_pool_passes == 1);
        CHECK(fused_pool_passes == (rows_path && !x_grad ? 0 : 1));
        CHECK(fused_type == plain_type);
        for (std::size_t i = 0; i < plain.size(); ++i) {
          INFO(names[i]);
          REQUIRE(fused[i].size() == plain[i].size());
          if (std::string_view(names[i]) != "db1") {
            CHECK(fused[i] == plain[i]);
            continue;
          }
          for (std::size_t j = 0; j < plain[i].size(); ++j) {
            INFO("channel " << j);
            CHECK(fused[i][j] == Approx(plain[i][j]).epsilon(1e-5).margin(1e-4));
          }
        }
      }
  };
  compare("float32", false);
  const testing::AutomaticBf16Kernels automatic;
  for (const cpu::Bf16Kernels path : testing::bf16_paths()) {
    cpu::force_bf16_kernels_for_testing(path);
    const PrecisionScope bf16(Precision::Bf16);
    compare(cpu::bf16_kernels_name(path),
            path == cpu::Bf16Kernels::Avx512Bf16 || path == cpu::Bf16Kernels::Avx512Bf16Emulated);
  }
}

// A convolution output larger than the caches (21 MiB here) runs Conv2DMaxPoolRelu in chunks of
// images, each chunk's convolution and then its pool (Note [Convolution and pool in chunks of the
// batch] in core/tensor/cpu_backend.cc): the trace shows the chunks, and the pooled values, the
// loss and the gradients are the two ops' on the whole batch, bit for bit on towerflow's kernels
// (each image's output is theirs whatever the batch), but the bias's, as above; in float32 and on
// every bf16 path. oneDNN may sum in another order for another batch: there, within its rounding
// (a maximum that moves between near-equal values moves its gradient, so the gradients are held
// to the scale of their values).
TEST_CASE("conv2d_max_pool2d_relu runs a large output in chunks of images, with the whole batch's results",
          "[precision][bf16]") {
  const Device cpu = Device::cpu(0);
  struct Step {
    std::vector<std::vector<float>> values;
    std::ptrdiff_t conv_calls;  // the forward's Conv2D spans
  };
  auto step = [&](bool fused) {
    Tensor x = Tensor::from_host(randn(20 * 64 * 64 * 3, 51), {20, 64, 64, 3}, cpu);
    Tensor w = Tensor::from_host(randn(64 * 3 * 5 * 5, 52), {64, 3, 5, 5}, cpu);
    Tensor b = Tensor::from_host(randn(64, 53), {64}, cpu);
    w.set_requires_grad(true);
    b.set_requires_grad(true);
    const Conv2dOptions conv{.stride = 1, .padding = 2};
    const Pool2dOptions pool{.kernel = 3, .stride = 2, .padding = 1};
    trace::start();
    const Tensor a = fused ? conv2d_max_pool2d_relu(x, w, b, conv, pool) : max_pool2d_relu(conv2d(x, w, b, conv), pool);
    trace::stop();
    const std::vector<trace::Event> events = trace::collect();
    const Tensor loss = sum(mul(a, Tensor::from_host(randn(a.numel(), 54), a.shape(), cpu)));
    loss.backward();
    return Step{{a.to_host(), loss.to_host(), w.grad().to_host(), b.grad().to_host()},
                std::count_if(events.begin(), events.end(), [](const trace::Event& e) {
                  return e.category == "op" && e.name == "Conv2D";
                })};
  };
  auto compare = [&](const char* precision, bool exact) {
    INFO(precision);
    const Step fused = step(true), plain = step(false);
    CHECK(fused.conv_calls == 5);  // 1 MiB of output an image, chunks of 4 MiB
    CHECK(plain.conv_calls == 1);
    const char* names[] = {"pooled", "loss", "dw", "db"};
    for (std::size_t i = 0; i < plain.values.size(); ++i) {
      INFO(names[i]);
      const std::vector<float>& got = fused.values[i];
      const std::vector<float>& want = plain.values[i];
      REQUIRE(got.size() == want.size());
      if (exact && std::string_view(names[i]) != "db") {
        // Counted rather than CHECK(got == want), which would print a million elements.
        const auto differ = std::mismatch(got.begin(), got.end(), want.begin(), [](float a, float b) {
          return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
        });
        INFO("the first element off: " << differ.first - got.begin());
        CHECK(differ.first == got.end());
        continue;
      }
      double rms = 0;
      for (const float v : want) rms += double(v) * v;
      rms = std::sqrt(rms / double(want.size()));
      const double tolerance = exact ? 1e-5 : 1e-3;
      std::size_t off = 0, first = want.size();
      for (std::size_t j = 0; j < want.size(); ++j)
        if (!(std::abs(got[j] - want[j]) <= tolerance * (std::abs(want[j]) + rms) + 1e-4) && off++ == 0) first = j;
      INFO(off << " elements off, the first " << first << ": "
                << (first < want.size() ? got[first] : 0.0f) << ", want " << (first < want.size() ? want[first] : 0.0f));
      CHECK(off == 0);
    }
  };
  compare("float32", true);
  const testing::AutomaticBf16Kernels automatic;
  for (const cpu::Bf16Kernels path : testing::bf16_paths()) {
    cpu::force_bf16_kernels_for_testing(path);
    const PrecisionScope bf16(Precision::Bf16);
    compare(cpu::bf16_kernels_name(path), path != cpu::Bf16Kernels::OneDnn);
  }
}

// The same for max_pool2d_relu (tfcnn's pool1): its backward reads argmax only, so the stored bf16
// output changes nothing but the bytes; its values are the float32 output rounded.
TEST_CASE("bf16 activations: max pool + ReLU stores bf16 for the convolution after it, bit for bit the same training",
          "[precision][bf16]") {
  const Device cpu = Device::cpu(0);
  struct Step {
    DType stored;
    std::vector<float> pooled;  // the pool's output as float32 (widened where stored as bf16)
    std::vector<std::vector<float>> values;  // loss, gradients
  };
  auto step = [&](OutputReaders readers) {
    const PrecisionScope bf16(Precision::Bf16);
    const Tensor none;
    Tensor x = Tensor::from_host(randn(2 * 11 * 9 * 3, 31), {2, 11, 9, 3}, cpu);
    Tensor w1 = Tensor::from_host(randn(32 * 3 * 5 * 5, 32), {32, 3, 5, 5}, cpu);
    Tensor b1 = Tensor::from_host(randn(32, 33), {32}, cpu);
    Tensor w2 = Tensor::from_host(randn(24 * 32 * 5 * 5, 34), {24, 32, 5, 5}, cpu);
    for (Tensor* t : {&x, &w1, &b1, &w2}) t->set_requires_grad(true);
    const Tensor h = conv2d(x, w1, b1, {.stride = 1, .padding = 2});
    const Tensor a = max_pool2d_relu(h, {.kernel = 3, .stride = 2, .padding = 1, .readers = readers});
    const Tensor out = conv2d(a, w2, none, {.stride = 1, .padding = 2});
    const Tensor loss = sum(mul(out, Tensor::from_host(randn(out.numel(), 35), out.shape(), cpu)));
    loss.backward();
    std::vector<float> pooled(static_cast<std::size_t>(a.numel()));
    if (a.dtype() == DType::kBFloat16)
      for (std::size_t i = 0; i < pooled.size(); ++i) pooled[i] = from_bits(std::uint32_t(a.data<bfloat16>()[i]) << 16);
    else
      pooled = a.to_host();
    return Step{a.dtype(), pooled,
                {loss.to_host(), x.grad().to_host(), w1.grad().to_host(), b1.grad().to_host(), w2.grad().to_host()}};
  };
  const testing::AutomaticBf16Kernels automatic;
  for (const cpu::Bf16Kernels path : testing::bf16_paths()) {
    cpu::force_bf16_kernels_for_testing(path);
    INFO("bf16 kernels: " << cpu::bf16_kernels_name(path));
    REQUIRE(has_kernel(cpu, OpKind::kBf16Activations));
    const Step any = step(OutputReaders::kAny), convs = step(OutputReaders::kConvolutions);
    CHECK(any.stored == DType::kFloat32);
    CHECK(convs.stored == DType::kBFloat16);
    for (std::size_t i = 0; i < any.pooled.size(); ++i)
      if (convs.pooled[i] != round_to_bf16(any.pooled[i])) {
        FAIL_CHECK("pooled value " << i << ": " << convs.pooled[i] << ", want " << round_to_bf16(any.pooled[i]));
        break;
      }
    const char* names[] = {"loss", "dx", "dw1", "db1", "dw2"};
    for (std::size_t i = 0; i < any.values.size(); ++i) {
      INFO(names[i]);
      CHECK(convs.values[i] == any.values[i]);
    }
  }
  // Outside bf16 precision the option changes nothing; inside, other ops refuse the output, naming
  // the option.
  const Tensor x = Tensor::from_host(randn(2 * 6 * 6 * 16, 36), {2, 6, 6, 16}, cpu);
  const Pool2dOptions convs{.kernel = 3, .stride = 2, .padding = 1, .readers = OutputReaders::kConvolutions};
  CHECK(max_pool2d_relu(x, convs).dtype() == DType::kFloat32);
  const PrecisionScope bf16(Precision::Bf16);
  const Tensor stored = max_pool2d_relu(x, convs);
  REQUIRE(stored.dtype() == DType::kBFloat16);
  CHECK_THROWS_WITH(relu(stored), Catch::Contains("Pool2dOptions::readers") && Catch::Contains("OutputReaders::kAny"));
}

TEST_CASE("bf16 activations: float32 outside bf16 training, and other ops reject bfloat16 by name",
          "[precision][bf16]") {
  const Device cpu = Device::cpu(0);
  const testing::AutomaticBf16Kernels automatic;
  cpu::force_bf16_kernels_for_testing(cpu::Bf16Kernels::Emulated);
  REQUIRE(has_kernel(cpu, OpKind::kBf16Activations));
  const Tensor x = Tensor::from_host(randn(4 * 3 * 3 * 8, 21), {4, 3, 3, 8}, cpu);
  const Tensor gamma = Tensor::full({8}, 1.0f, cpu), beta = Tensor::zeros({8}, cpu);
  const Tensor rm = Tensor::zeros({8}, cpu), rv = Tensor::full({8}, 1.0f, cpu);
  const BatchNormOptions convs{.readers = OutputReaders::kConvolutions};
  BatchNormOptions eval = convs;
  eval.training = false;
  CHECK(batch_norm_relu(x, gamma, beta, rm, rv, convs).dtype() == DType::kFloat32);  // fp32 precision
  const PrecisionScope bf16(Precision::Bf16);
  CHECK(batch_norm_relu(x, gamma, beta, rm, rv, eval).dtype() == DType::kFloat32);
  CHECK(batch_norm(x, gamma, beta, rm, rv, convs).dtype() == DType::kFloat32);  // no ReLU
  const Tensor stored = batch_norm_relu(x, gamma, beta, rm, rv, convs);
  REQUIRE(stored.dtype() == DType::kBFloat16);
  // Its values: the float32 output rounded to bf16.
  const std::vector<float> want = batch_norm_relu(x, gamma, beta, rm, rv, {}).to_host();
  const bfloat16* got = stored.data<bfloat16>();
  for (std::size_t i = 0; i < want.size(); ++i)
    if (from_bits(std::uint32_t(got[i]) << 16) != round_to_bf16(want[i])) {
      FAIL_CHECK("value " << i << ": " << from_bits(std::uint32_t(got[i]) << 16) << ", want "
                          << round_to_bf16(want[i]));
      break;
    }
  CHECK_THROWS_WITH(relu(stored), Catch::Contains("bfloat16[4, 3, 3, 8]") &&
                                      Catch::Contains("OutputReaders::kAny"));
  CHECK_THROWS_AS(add(stored, stored), InvalidArgument);
}
