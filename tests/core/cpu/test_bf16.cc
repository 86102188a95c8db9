// The bf16 kernels (core/cpu/bf16.h) on each path this CPU can run -- always the emulated one;
// oneDNN's where it has JIT bf16 kernels (AVX-512 and up; run_bf16_on_isa.sh runs this file
// again with oneDNN held to each lower instruction set); towerflow's AMX and AVX512-BF16 kernels
// where the CPU has the instructions, and with them emulated on any AVX-512 CPU -- against the fp32 kernels on the same
// bf16-rounded operands (the same products: equal up to the order of the fp32 sums) and on the
// fp32 operands (within what bf16 rounding implies), for every ResNet-20 and tfcnn layer shape
// and odd ones.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "core/cpu/bf16.h"
#include "core/cpu/gemm.h"
#include "core/cpu/isa.h"
#include "core/error.h"
#include "bf16_paths.h"
#include "kernel_test_util.h"

using namespace towerflow;
using namespace towerflow::cpu;
using towerflow::cpu::testing::compare;
using towerflow::cpu::testing::random_vector;

namespace {

float round_bf16(float x) {  // an independent rounding: through the top 16 bits, to nearest even
  std::uint32_t b;
  std::memcpy(&b, &x, 4);
  const std::uint32_t lsb = (b >> 16) & 1u;
  b = (b + 0x7fffu + lsb) & 0xffff0000u;
  std::memcpy(&x, &b, 4);
  return x;
}

std::vector<float> rounded(std::vector<float> v) {
  for (float& x : v) x = round_bf16(x);
  return v;
}

// The bf16 bits of round_bf16(y).
std::uint16_t bits_of_rounded(float y) {
  return static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(round_bf16(y)) >> 16);
}

// Where bf16 outputs `got` (bf16.h's) differ from y rounded: "" where they do not. A denormal y
// may come out as a zero of its sign (vcvtneps2bf16 flushes them).
std::string bf16_output_mismatch(const std::vector<std::uint16_t>& got, const std::vector<float>& y) {
  if (got.size() != y.size()) return "sizes differ";
  for (std::size_t i = 0; i < y.size(); ++i) {
    const std::uint16_t want = bits_of_rounded(y[i]);
    const bool flushed = std::fpclassify(y[i]) == FP_SUBNORMAL && (got[i] & 0x7fffu) == 0;
    if (got[i] != want && !flushed)
      return "value " + std::to_string(i) + ": bits " + std::to_string(got[i]) + " for " +
             std::to_string(y[i]) + ", want " + std::to_string(want);
  }
  return "";
}

std::vector<float> widened(const std::vector<std::uint16_t>& b) {
  std::vector<float> v(b.size());
  for (std::size_t i = 0; i < b.size(); ++i) v[i] = std::bit_cast<float>(std::uint32_t{b[i]} << 16);
  return v;
}

struct ForceKernels {
  explicit ForceKernels(Bf16Kernels k) { force_bf16_kernels_for_testing(k); }
  towerflow::testing::AutomaticBf16Kernels automatic;
};

// Same products, summed in another order: the emulated path runs the very fp32 kernel (equal),
// oneDNN and towerflow's pair and AMX kernels sum in their own orders (fp32 rounding of sums of up to a few
// thousand terms).
double same_products_tolerance(Bf16Kernels k) { return k == Bf16Kernels::Emulated ? 0.0 : 2e-5; }
// Against fp32 operands: each operand's relative rounding error is at most 2^-8 (8 significant
// bits), so a product's is at most about 2^-7, and sums of products with random signs stay well within 2e-2 of the
// output's scale (compare() measures relative to |want| + rms(want)).
constexpr double kBf16Tolerance = 2e-2;

}  // namespace

TEST_CASE("bf16 convolutions equal fp32 on bf16-rounded operands, on every ResNet-20 and tfcnn shape",
          "[bf16]") {
  struct Case {
    const char* name;
    Conv2dShape s;
  };
  const std::vector<Case> cases = {
      {"resnet20 conv1 3->16", {.n = 2, .h = 32, .w = 32, .c_in = 3, .c_out = 16, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1}},
      {"resnet20 16->16", {.n = 2, .h = 32, .w = 32, .c_in = 16, .c_out = 16, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1}},
      {"resnet20 16->32 stride 2", {.n = 2, .h = 32, .w = 32, .c_in = 16, .c_out = 32, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1}},
      {"resnet20 shortcut 1x1 16->32 stride 2", {.n = 2, .h = 32, .w = 32, .c_in = 16, .c_out = 32, .kh = 1, .kw = 1, .stride_h = 2, .stride_w = 2}},
      {"resnet20 32->32", {.n = 2, .h = 16, .w = 16, .c_in = 32, .c_out = 32, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1}},
      {"resnet20 32->64 stride 2", {.n = 2, .h = 16, .w = 16, .c_in = 32, .c_out = 64, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1}},
      {"resnet20 shortcut 1x1 32->64 stride 2", {.n = 2, .h = 16, .w = 16, .c_in = 32, .c_out = 64, .kh = 1, .kw = 1, .stride_h = 2, .stride_w = 2}},
      {"resnet20 64->64", {.n = 2, .h = 8, .w = 8, .c_in = 64, .c_out = 64, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1}},
      {"tfcnn conv1 5x5 3->64", {.n = 2, .h = 32, .w = 32, .c_in = 3, .c_out = 64, .kh = 5, .kw = 5, .pad_h = 2, .pad_w = 2}},
      {"tfcnn conv2 5x5 64->64", {.n = 2, .h = 16, .w = 16, .c_in = 64, .c_out = 64, .kh = 5, .kw = 5, .pad_h = 2, .pad_w = 2}},
      {"odd 5->7 on 7x9, no padding", {.n = 3, .h = 7, .w = 9, .c_in = 5, .c_out = 7, .kh = 3, .kw = 3}},
      {"odd 3x2 kernel, stride 2 dropping a column", {.n = 1, .h = 8, .w = 8, .c_in = 6, .c_out = 10, .kh = 3, .kw = 2, .stride_h = 2, .stride_w = 2}},
      // 34 channels: q = 3 * 34 has no even divisor from 16 to 32 (the AMX kernels pad to 48).
      {"odd 34->20 stride 2 on 9x11", {.n = 2, .h = 9, .w = 11, .c_in = 34, .c_out = 20, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1}},
      {"odd 1x1 35->18 on 5x13", {.n = 2, .h = 5, .w = 13, .c_in = 35, .c_out = 18, .kh = 1, .kw = 1}},
      // A strided 1x1 kernel without padding runs on the pixels it reads (conv_input): strides
      // that differ, and the last row and column of x not read.
      {"odd 1x1 6->10 stride (3, 2) on 8x10", {.n = 2, .h = 8, .w = 10, .c_in = 6, .c_out = 10, .kh = 1, .kw = 1, .stride_h = 3, .stride_w = 2}},
      // 40 output channels: two blocks of 16 and a partial third (tiles of 32 channels, then 16).
      {"odd 5->40 on 6x7", {.n = 2, .h = 6, .w = 7, .c_in = 5, .c_out = 40, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1}},
      // The pair row kernel (up to 16 output channels, 3 columns, horizontal stride 1) on a padded
      // channel, 9 of 16 lanes, stride 2 down the rows and rows of two tiles (10 and 11 pixels).
      {"odd 15->9 stride (2, 1) on 9x21", {.n = 2, .h = 9, .w = 21, .c_in = 15, .c_out = 9, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 1, .pad_h = 1, .pad_w = 1}},
      // The pair weight-gradient row kernel with two vectors of output channels, the second
      // partial, a partial group of input channels, a 2-row kernel and an odd width.
      {"odd 6->20 2x3 kernel on 5x9", {.n = 2, .h = 5, .w = 9, .c_in = 6, .c_out = 20, .kh = 2, .kw = 3, .pad_w = 1}},
      // The AMX weight gradient over column pairs (stride 1, input channels in sixteens): an odd
      // output width, an even kernel width, three channel tiles, a partial output-channel tile.
      {"odd 48->20 3x2 kernel on 7x10", {.n = 2, .h = 7, .w = 10, .c_in = 48, .c_out = 20, .kh = 3, .kw = 2, .pad_h = 1}},
      // The pair weight gradient's passes of 16 rows, the last of 4 (Note [Weight-gradient pass
      // length] in bf16_pairs.cc).
      {"odd 5x5 3->20 on 20x10", {.n = 2, .h = 20, .w = 10, .c_in = 3, .c_out = 20, .kh = 5, .kw = 5, .pad_h = 2, .pad_w = 2}},
  };
  for (const Bf16Kernels k : towerflow::testing::bf16_paths()) {
    const ForceKernels force(k);
    const CpuContext ctx(1);
    for (const Case& c : cases) {
      const Conv2dShape& s = c.s;
      const std::size_t xn = std::size_t(s.n) * s.h * s.w * s.c_in, wn = std::size_t(s.c_out) * s.c_in * s.kh * s.kw,
                        yn = std::size_t(s.n) * s.out_h() * s.out_w() * s.c_out;
      const auto x = random_vector(xn, 1), w = random_vector(wn, 2), dy = random_vector(yn, 3),
                 bias = random_vector(std::size_t(s.c_out), 4);
      const auto xr = rounded(x), wr = rounded(w), dyr = rounded(dy);
      std::vector<float> y(yn), dx(xn), dw(wn), ref_y(yn), ref_dx(xn), ref_dw(wn), fp_y(yn), fp_dx(xn), fp_dw(wn);
      conv2d_forward_bf16(ctx, s, x.data(), w.data(), bias.data(), y.data());
      conv2d_backward_input_bf16(ctx, s, dy.data(), w.data(), dx.data());
      conv2d_backward_weight_bf16(ctx, s, x.data(), dy.data(), dw.data());
      conv2d_forward_bias(ctx, s, xr.data(), wr.data(), bias.data(), ref_y.data());
      conv2d_backward_input(ctx, s, dyr.data(), wr.data(), ref_dx.data());
      conv2d_backward_weight(ctx, s, xr.data(), dyr.data(), ref_dw.data());
      conv2d_forward_bias(ctx, s, x.data(), w.data(), bias.data(), fp_y.data());
      conv2d_backward_input(ctx, s, dy.data(), w.data(), fp_dx.data());
      conv2d_backward_weight(ctx, s, x.data(), dy.data(), fp_dw.data());
      INFO(bf16_kernels_name(k) << ": " << c.name << " (" << s.to_string() << ")");
      const auto ey = compare(y, ref_y), edx = compare(dx, ref_dx), edw = compare(dw, ref_dw);
      INFO("against fp32 on rounded operands: y " << ey.describe() << "; dx " << edx.describe() << "; dw " << edw.describe());
      CHECK(ey.max_error <= same_products_tolerance(k));
      CHECK(edx.max_error <= same_products_tolerance(k));
      CHECK(edw.max_error <= same_products_tolerance(k));
      const auto fy = compare(y, fp_y), fdx = compare(dx, fp_dx), fdw = compare(dw, fp_dw);
      INFO("against fp32 operands: y " << fy.describe() << "; dx " << fdx.describe() << "; dw " << fdw.describe());
      CHECK(fy.max_error < kBf16Tolerance);
      CHECK(fdx.max_error < kBf16Tolerance);
      CHECK(fdw.max_error < kBf16Tolerance);
      CHECK(fy.max_error > 1e-5);  // the operands were rounded
      // x stored as bf16 (bf16.h's bf16 inputs): the same bits as the fp32 x's calls.
      std::vector<std::uint16_t> xb(xn);
      for (std::size_t i = 0; i < xn; ++i) xb[i] = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(xr[i]) >> 16);
      std::vector<float> yb(yn, NAN), dwb(wn, NAN);
      conv2d_forward_bf16_input(ctx, s, xb.data(), w.data(), bias.data(), yb.data());
      conv2d_backward_weight_bf16_input(ctx, s, xb.data(), dy.data(), dwb.data());
      CHECK(yb == y);
      CHECK(dwb == dw);
      // y stored as bf16 (bf16.h's bf16 outputs), from either x: y rounded. oneDNN's kernel for a
      // bf16 y may sum in another order than its fp32 y's: within a rounding of it there.
      for (const bool x_bf16 : {false, true}) {
        INFO("bf16 output, x " << (x_bf16 ? "bf16" : "fp32"));
        std::vector<std::uint16_t> yo(yn, 0xffff);
        if (x_bf16) conv2d_forward_bf16_output(ctx, s, xb.data(), w.data(), bias.data(), yo.data());
        else conv2d_forward_bf16_output(ctx, s, x.data(), w.data(), bias.data(), yo.data());
        if (k == Bf16Kernels::OneDnn) {
          const auto e = compare(widened(yo), y);
          INFO(e.describe());
          CHECK(e.max_error <= 0x1p-8);
        } else {
          CHECK(bf16_output_mismatch(yo, y) == "");
        }
      }
      // dx added to a gradient as the kernels store it: that gradient plus the very dx, rounded
      // once; oneDNN has no such path and leaves it alone.
      std::vector<float> dxk(xn);
      if (!conv2d_backward_input_bf16_with(k, ctx, s, dy.data(), w.data(), dxk.data())) continue;
      const auto base = random_vector(xn, 5);
      std::vector<float> sum = base;
      if (k == Bf16Kernels::OneDnn) {
        CHECK_FALSE(bf16_backward_input_adds(k));
        CHECK_FALSE(conv2d_backward_input_bf16_add_with(k, ctx, s, dy.data(), w.data(), sum.data()));
        CHECK(sum == base);
      } else {
        CHECK(bf16_backward_input_adds(k));
        REQUIRE(conv2d_backward_input_bf16_add_with(k, ctx, s, dy.data(), w.data(), sum.data()));
        std::vector<float> want(xn);
        for (std::size_t i = 0; i < xn; ++i) want[i] = base[i] + dxk[i];
        CHECK(sum == want);
        // On 3 threads: the same bits.
        std::vector<float> sum3 = base;
        REQUIRE(conv2d_backward_input_bf16_add_with(k, CpuContext(3), s, dy.data(), w.data(), sum3.data()));
        CHECK(sum3 == sum);
      }
    }
  }
}

TEST_CASE("bf16 Winograd convolutions: near fp32 on the rounded operands, the same bits for a bf16 x, "
          "any thread count and the emulated instruction",
          "[bf16]") {
  // Note [bf16 Winograd convolution] and Note [bf16 Winograd weight gradient] (bf16_pairs.cc):
  // the transforms are rounded to bf16 once more, so the results are not the direct kernels' bits
  // but within the bf16 tolerance of fp32 on the rounded operands.
  struct Case {
    const char* name;
    Conv2dShape s;
  };
  const std::vector<Case> cases = {
      {"resnet20 16->16", {.n = 2, .h = 32, .w = 32, .c_in = 16, .c_out = 16, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1}},
      {"resnet20 32->32", {.n = 3, .h = 16, .w = 16, .c_in = 32, .c_out = 32, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1}},
      {"resnet20 64->64", {.n = 5, .h = 8, .w = 8, .c_in = 64, .c_out = 64, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1}},
      // Odd outputs: the last row and column of tiles half outside the image, an odd tile count
      // (a tile pair with one tile), 8 lanes of 16, a partial block of output channels.
      {"odd 8->40 on 7x9", {.n = 3, .h = 7, .w = 9, .c_in = 8, .c_out = 40, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1}},
      {"24->8 on 6x10, no padding", {.n = 2, .h = 6, .w = 10, .c_in = 24, .c_out = 8, .kh = 3, .kw = 3}},
      {"16->24 on 5x5, padding 2", {.n = 2, .h = 5, .w = 5, .c_in = 16, .c_out = 24, .kh = 3, .kw = 3, .pad_h = 2, .pad_w = 2}},
  };
  const towerflow::testing::AutomaticBf16Kernels automatic;
  std::vector<std::vector<float>> first;  // the first path's results, case by case and pass by pass
  bool any = false;
  for (const Bf16Kernels k : {Bf16Kernels::Avx512Bf16, Bf16Kernels::Avx512Bf16Emulated}) {
    if (!towerflow::testing::bf16_path_runs(k)) continue;  // the WARN says why
    for (std::size_t i = 0; i < cases.size(); ++i) {
      const Conv2dShape& s = cases[i].s;
      const std::size_t xn = std::size_t(s.n) * s.h * s.w * s.c_in, wn = std::size_t(s.c_out) * s.c_in * 9,
                        yn = std::size_t(s.n) * s.out_h() * s.out_w() * s.c_out;
      const auto x = random_vector(xn, 31), w = random_vector(wn, 35), dy = random_vector(yn, 32),
                 bias = random_vector(std::size_t(s.c_out), 36);
      const auto xr = rounded(x), wr = rounded(w), dyr = rounded(dy);
      // out[t][pass]: forward, backward input, weight gradient, on 1 (t = 0) and 3 threads.
      std::vector<float> out[2][3];
      for (int t = 0; t < 2; ++t) {
        const CpuContext ctx(t == 0 ? 1 : 3);
        out[t][0].assign(yn, NAN), out[t][1].assign(xn, NAN), out[t][2].assign(wn, NAN);
        REQUIRE(conv2d_forward_bf16_winograd_with(k, ctx, s, x.data(), w.data(), bias.data(), out[t][0].data()));
        REQUIRE(conv2d_backward_input_bf16_winograd_with(k, ctx, s, dy.data(), w.data(), out[t][1].data()));
        REQUIRE(conv2d_backward_weight_bf16_winograd_with(k, ctx, s, x.data(), dy.data(), out[t][2].data()));
      }
      const CpuContext ctx(2);
      std::vector<float> ref[3] = {std::vector<float>(yn), std::vector<float>(xn), std::vector<float>(wn)};
      std::vector<float> direct[3] = {std::vector<float>(yn), std::vector<float>(xn), std::vector<float>(wn)};
      conv2d_forward_bias(ctx, s, xr.data(), wr.data(), bias.data(), ref[0].data());
      conv2d_backward_input(ctx, s, dyr.data(), wr.data(), ref[1].data());
      conv2d_backward_weight(ctx, s, xr.data(), dyr.data(), ref[2].data());
      REQUIRE(conv2d_forward_bf16_with(k, ctx, s, x.data(), w.data(), bias.data(), direct[0].data()));
      REQUIRE(conv2d_backward_input_bf16_with(k, ctx, s, dy.data(), w.data(), direct[1].data()));
      REQUIRE(conv2d_backward_weight_bf16_with(k, ctx, s, x.data(), dy.data(), direct[2].data()));
      for (int pass = 0; pass < 3; ++pass) {
        INFO(bf16_kernels_name(k) << ": " << cases[i].name << " (" << s.to_string() << "), pass " << pass
                                  << " (forward, backward input, weight gradient)");
        const auto e = compare(out[0][pass], ref[pass]), ed = compare(direct[pass], ref[pass]);
        INFO("Winograd against fp32 on rounded operands: " << e.describe() << "; the direct kernels: " << ed.describe());
        CHECK(e.max_error < kBf16Tolerance);
        CHECK(e.max_error > ed.max_error);   // the transforms were rounded
        CHECK(out[1][pass] == out[0][pass]);  // 3 threads: the same bits as 1
        // The instruction and its emulation: the same bits (no denormals here).
        if (first.size() < 3 * cases.size()) first.push_back(out[0][pass]);
        else CHECK(first[3 * i + pass] == out[0][pass]);
      }
      // x stored as bf16: the same bits.
      std::vector<std::uint16_t> xb(xn);
      for (std::size_t j = 0; j < xn; ++j) xb[j] = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(xr[j]) >> 16);
      std::vector<float> yb(yn, NAN), dwb(wn, NAN);
      REQUIRE(conv2d_forward_bf16_winograd_with(k, ctx, s, xb.data(), w.data(), bias.data(), yb.data()));
      REQUIRE(conv2d_backward_weight_bf16_winograd_with(k, ctx, s, xb.data(), dy.data(), dwb.data()));
      CHECK(yb == out[0][0]);
      CHECK(dwb == out[0][2]);
      // y stored as bf16, from either x: the fp32 y rounded as it is stored.
      std::vector<std::uint16_t> yo(yn, 0xffff), yob(yn, 0);
      REQUIRE(conv2d_forward_bf16_winograd_with(k, ctx, s, x.data(), w.data(), bias.data(), yo.data()));
      REQUIRE(conv2d_forward_bf16_winograd_with(k, ctx, s, xb.data(), w.data(), bias.data(), yob.data()));
      CHECK(bf16_output_mismatch(yo, out[0][0]) == "");
      CHECK(yob == yo);
      // The backward input added to a gradient as it is stored: that gradient plus the very dx,
      // rounded once, on 1 and 3 threads.
      const auto base = random_vector(xn, 38);
      for (const int threads : {1, 3}) {
        std::vector<float> sum = base, want(xn);
        REQUIRE(conv2d_backward_input_bf16_winograd_add_with(k, CpuContext(threads), s, dy.data(), w.data(), sum.data()));
        for (std::size_t j = 0; j < xn; ++j) want[j] = base[j] + out[0][1][j];
        CHECK(sum == want);
      }
    }
    // What they decline, writing nothing: strides, other kernels, channels not in multiples of 8.
    const CpuContext ctx(2);
    for (const Conv2dShape& s : {Conv2dShape{.n = 2, .h = 8, .w = 8, .c_in = 16, .c_out = 16, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1},
                                 Conv2dShape{.n = 2, .h = 8, .w = 8, .c_in = 16, .c_out = 16, .kh = 5, .kw = 5, .pad_h = 2, .pad_w = 2},
                                 Conv2dShape{.n = 2, .h = 8, .w = 8, .c_in = 12, .c_out = 16, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1},
                                 Conv2dShape{.n = 2, .h = 8, .w = 8, .c_in = 16, .c_out = 12, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1}}) {
      INFO(s.to_string());
      const std::size_t xn = std::size_t(s.n) * s.h * s.w * s.c_in, wn = std::size_t(s.c_out) * s.c_in * s.kh * s.kw,
                        yn = std::size_t(s.n) * s.out_h() * s.out_w() * s.c_out;
      const auto x = random_vector(xn, 33), w = random_vector(wn, 37), dy = random_vector(yn, 34);
      std::vector<float> y(yn, NAN), dx(xn, NAN), dw(wn, NAN);
      CHECK_FALSE(conv2d_forward_bf16_winograd_with(k, ctx, s, x.data(), w.data(), nullptr, y.data()));
      CHECK_FALSE(conv2d_backward_input_bf16_winograd_with(k, ctx, s, dy.data(), w.data(), dx.data()));
      CHECK_FALSE(conv2d_backward_input_bf16_winograd_add_with(k, ctx, s, dy.data(), w.data(), dx.data()));
      CHECK_FALSE(conv2d_backward_weight_bf16_winograd_with(k, ctx, s, x.data(), dy.data(), dw.data()));
      for (const auto* v : {&y, &dx, &dw})
        CHECK(std::all_of(v->begin(), v->end(), [](float f) { return std::isnan(f); }));
    }
    any = true;
  }
  // Other kernels have none.
  const Conv2dShape s{.n = 1, .h = 4, .w = 4, .c_in = 8, .c_out = 8, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1};
  const std::vector<float> x(128, 1.0f), w(576, 1.0f), dy(128, 1.0f);
  std::vector<float> y(128, NAN), dw(576, NAN);
  for (const Bf16Kernels k : {Bf16Kernels::Emulated, Bf16Kernels::OneDnn}) {
    CHECK_FALSE(conv2d_forward_bf16_winograd_with(k, CpuContext(1), s, x.data(), w.data(), nullptr, y.data()));
    CHECK_FALSE(conv2d_backward_input_bf16_winograd_with(k, CpuContext(1), s, dy.data(), w.data(), y.data()));
    CHECK_FALSE(conv2d_backward_input_bf16_winograd_add_with(k, CpuContext(1), s, dy.data(), w.data(), y.data()));
    CHECK_FALSE(conv2d_backward_weight_bf16_winograd_with(k, CpuContext(1), s, x.data(), dy.data(), dw.data()));
  }
  if (!any) WARN("SKIPPED: the bf16 Winograd kernels need an AVX-512 CPU (this one: " << cpu_features() << ")");
}

TEST_CASE("bf16 widened to float: exact for every bit pattern", "[bf16]") {
  std::vector<std::uint16_t> bits(1 << 16);
  for (std::size_t i = 0; i < bits.size(); ++i) bits[i] = static_cast<std::uint16_t>(i);
  std::vector<float> wide(bits.size());
  widen_bf16(static_cast<std::int64_t>(bits.size()), bits.data(), wide.data());
  for (std::size_t i = 0; i < bits.size(); ++i)
    if (std::bit_cast<std::uint32_t>(wide[i]) != std::uint32_t{bits[i]} << 16) {
      FAIL_CHECK("bits " << bits[i] << " widened to " << wide[i]);
      break;
    }
  CHECK(round_bf16(wide[0x3f81]) == wide[0x3f81]);  // a bf16 value rounds to itself
  CHECK(wide[0x3f80] == 1.0f);
  CHECK(std::isinf(wide[0xff80]));
  CHECK(std::isnan(wide[0x7fc1]));
}

TEST_CASE("bf16 GEMM equals fp32 on bf16-rounded operands, transposed and strided", "[bf16]") {
  struct Case {
    const char* name;
    bool ta, tb;
    int m, n, k, pad;  // pad: extra floats at the end of every row of a, b and c
  };
  const std::vector<Case> cases = {
      {"resnet20 fc forward 64->10", false, true, 64, 10, 64, 0},
      {"resnet20 fc dx", false, false, 64, 64, 10, 0},
      {"resnet20 fc dw", true, false, 10, 64, 64, 0},
      {"tfcnn fc1 forward 4096->384", false, true, 64, 384, 4096, 0},
      {"tfcnn fc1 dw", true, false, 384, 4096, 64, 0},
      {"tfcnn fc2 forward 384->192", false, true, 64, 192, 384, 0},
      {"odd, both transposed, strided rows", true, true, 13, 11, 17, 3},
      {"odd, strided rows", false, false, 7, 5, 9, 2},
      {"odd, b transposed, pairs past 16 and channels past a block", false, true, 9, 77, 71, 5},
  };
  for (const Bf16Kernels kernels : towerflow::testing::bf16_paths()) {
    const ForceKernels force(kernels);
    const CpuContext ctx(1);
    for (const Case& c : cases) {
      const int a_rows = c.ta ? c.k : c.m, a_cols = c.ta ? c.m : c.k;
      const int b_rows = c.tb ? c.n : c.k, b_cols = c.tb ? c.k : c.n;
      const int lda = a_cols + c.pad, ldb = b_cols + c.pad, ldc = c.n + c.pad;
      const auto a = random_vector(std::size_t(a_rows) * lda, 5), b = random_vector(std::size_t(b_rows) * ldb, 6);
      const auto ar = rounded(a), br = rounded(b);
      std::vector<float> out(std::size_t(c.m) * ldc, 7.0f), ref(out.size(), 7.0f), fp(out.size(), 7.0f);
      gemm_bf16(ctx, c.ta, c.tb, c.m, c.n, c.k, a.data(), lda, b.data(), ldb, out.data(), ldc);
      gemm(ctx, c.ta, c.tb, c.m, c.n, c.k, 1.0f, ar.data(), lda, br.data(), ldb, 0.0f, ref.data(), ldc);
      gemm(ctx, c.ta, c.tb, c.m, c.n, c.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, fp.data(), ldc);
      INFO(bf16_kernels_name(kernels) << ": " << c.name);
      const auto e = compare(out, ref), f = compare(out, fp);
      INFO("against fp32 on rounded operands: " << e.describe() << "; against fp32 operands: " << f.describe());
      CHECK(e.max_error <= same_products_tolerance(kernels));
      CHECK(f.max_error < kBf16Tolerance);
      CHECK(f.max_error > 1e-6);
      for (int i = 0; i < c.m; ++i)  // the padding of c's rows is not written
        for (int j = c.n; j < ldc; ++j) CHECK(out[std::size_t(i) * ldc + j] == 7.0f);
    }
  }
}

TEST_CASE("bf16 kernels: the automatic choice follows the CPU and says so", "[bf16]") {
  force_bf16_kernels_for_testing(std::nullopt);
  const std::string isa = onednn_isa();
  const bool native = isa == "avx512_core_bf16" || isa == "avx512_core_amx";
  const std::string why = describe_bf16_kernels();
  INFO("oneDNN's instruction set: '" << isa << "'; CPU features: " << cpu_features() << "; " << why);
  if (std::getenv("TOWERFLOW_BF16_KERNELS")) return;  // a forced choice: the environment's test
  // The expectation follows from what this CPU reports, whatever CPU runs the test: oneDNN's
  // kernels where oneDNN multiplies bf16 in hardware; else towerflow's own where the CPU has the
  // instructions and the avx512 CPU kernels run (a build without oneDNN, or oneDNN held below its
  // bf16 set by ONEDNN_MAX_CPU_ISA); else the emulated path.
  const bool avx512 = active_isa() == Isa::Avx512;
  if (native) {
    CHECK(active_bf16_kernels() == Bf16Kernels::OneDnn);
    CHECK_THAT(why, Catch::StartsWith("oneDNN ") && Catch::Contains(isa));
  } else if (cpu_has_amx_bf16() && avx512 && towerflow::testing::bf16_path_runs(Bf16Kernels::Amx)) {
    CHECK(active_bf16_kernels() == Bf16Kernels::Amx);
    CHECK_THAT(why, Catch::StartsWith("towerflow's AMX kernels (tdpbf16ps"));
  } else if (cpu_has_avx512_bf16() && avx512 && towerflow::testing::bf16_path_runs(Bf16Kernels::Avx512Bf16)) {
    CHECK(active_bf16_kernels() == Bf16Kernels::Avx512Bf16);
    CHECK_THAT(why, Catch::StartsWith("towerflow's AVX512-BF16 kernels (vdpbf16ps"));
  } else {
    CHECK(active_bf16_kernels() == Bf16Kernels::Emulated);
    CHECK_THAT(why, Catch::StartsWith("emulated") && Catch::Contains("slower than fp32"));
    // The reason names what is missing: the instructions, or the avx512 CPU kernels.
    if (cpu_has_avx512_bf16() || cpu_has_amx_bf16()) {
      CHECK_THAT(why, !Catch::Contains("this CPU has no AVX512-BF16"));
      if (!avx512) CHECK_THAT(why, Catch::Contains("need the avx512 CPU kernels"));
    } else {
      CHECK_THAT(why, Catch::Contains("no AVX512-BF16 or AMX") || Catch::Contains("no oneDNN"));
    }
  }
}

TEST_CASE("bf16 pair and AMX kernels: each instruction against its emulation", "[bf16]") {
  // vdpbf16ps's emulation (two FMAs per lane in the instruction's order) rounds as the
  // instruction does: the same bits, but on denormals, which these operands do not produce.
  // tdpbf16ps sums a tile row's products in a wider sum of its own and rounds once (Note [bf16
  // AMX kernels]), so its emulation is held to the tolerance of the same products summed in
  // another order.
  const towerflow::testing::AutomaticBf16Kernels automatic;
  const std::pair<Bf16Kernels, Bf16Kernels> twins[] = {
      {Bf16Kernels::Avx512Bf16, Bf16Kernels::Avx512Bf16Emulated},
      {Bf16Kernels::Amx, Bf16Kernels::AmxEmulated}};
  for (const auto& [instruction, emulation] : twins) {
    if (!towerflow::testing::bf16_path_runs(instruction) || !towerflow::testing::bf16_path_runs(emulation)) {
      WARN("SKIPPED: " << bf16_kernels_name(instruction) << " against " << bf16_kernels_name(emulation)
                       << " needs a CPU with the instruction (this one: " << cpu_features() << ")");
      continue;
    }
    const CpuContext ctx(2);
    const std::vector<Conv2dShape> shapes = {
        {.n = 2, .h = 16, .w = 16, .c_in = 16, .c_out = 32, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1},
        {.n = 3, .h = 7, .w = 9, .c_in = 5, .c_out = 7, .kh = 3, .kw = 3},
        {.n = 2, .h = 8, .w = 8, .c_in = 64, .c_out = 64, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1},
        // The weight gradient's passes of 16 rows, the last of 4 (Note [Weight-gradient pass
        // length] in bf16_pairs.cc).
        {.n = 2, .h = 20, .w = 10, .c_in = 3, .c_out = 20, .kh = 5, .kw = 5, .pad_h = 2, .pad_w = 2},
    };
    for (const Conv2dShape& s : shapes) {
      const std::size_t xn = std::size_t(s.n) * s.h * s.w * s.c_in, wn = std::size_t(s.c_out) * s.c_in * s.kh * s.kw,
                        yn = std::size_t(s.n) * s.out_h() * s.out_w() * s.c_out;
      const auto x = random_vector(xn, 11), w = random_vector(wn, 12), dy = random_vector(yn, 13);
      std::vector<float> out[2][3];
      for (int e = 0; e < 2; ++e) {
        force_bf16_kernels_for_testing(e ? emulation : instruction);
        out[e][0].resize(yn), out[e][1].resize(xn), out[e][2].resize(wn);
        conv2d_forward_bf16(ctx, s, x.data(), w.data(), nullptr, out[e][0].data());
        conv2d_backward_input_bf16(ctx, s, dy.data(), w.data(), out[e][1].data());
        conv2d_backward_weight_bf16(ctx, s, x.data(), dy.data(), out[e][2].data());
      }
      INFO(bf16_kernels_name(instruction) << ": " << s.to_string());
      for (int k = 0; k < 3; ++k) {
        if (instruction == Bf16Kernels::Avx512Bf16) {
          CHECK(out[0][k] == out[1][k]);
        } else {
          const auto e = compare(out[0][k], out[1][k]);
          INFO("pass " << k << ": " << e.describe());
          CHECK(e.max_error <= same_products_tolerance(instruction));
        }
      }
    }
  }
}

TEST_CASE("bf16 pair and AMX kernels: the same bits for any number of threads", "[bf16]") {
  // Each output element is summed by one thread in a fixed order (Note [bf16 pair kernels], Note
  // [bf16 AMX kernels]).
  const towerflow::testing::AutomaticBf16Kernels automatic;
  for (const Bf16Kernels k : {Bf16Kernels::Avx512Bf16, Bf16Kernels::Avx512Bf16Emulated,
                              Bf16Kernels::Amx, Bf16Kernels::AmxEmulated}) {
    if (!towerflow::testing::bf16_path_runs(k)) continue;  // the WARN says why
    force_bf16_kernels_for_testing(k);
    // 32 images: the weight gradient sums image groups (Note [Weight gradient: image groups or
    // tiles]). 16 output channels run the pair kernels' row kernels.
    for (const int c_out : {32, 16}) {
      const Conv2dShape s{.n = 32, .h = 8, .w = 8, .c_in = 16, .c_out = c_out, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1};
      const std::size_t xn = std::size_t(s.n) * s.h * s.w * s.c_in, wn = std::size_t(s.c_out) * s.c_in * s.kh * s.kw,
                        yn = std::size_t(s.n) * s.out_h() * s.out_w() * s.c_out;
      const auto x = random_vector(xn, 21), w = random_vector(wn, 22), dy = random_vector(yn, 23);
      const auto a = random_vector(64 * 144, 24), b = random_vector(32 * 144, 25);
      std::vector<float> out[2][4];
      for (int t = 0; t < 2; ++t) {
        const CpuContext ctx(t + 1);
        out[t][0].resize(yn), out[t][1].resize(xn), out[t][2].resize(wn), out[t][3].resize(64 * 32);
        conv2d_forward_bf16(ctx, s, x.data(), w.data(), nullptr, out[t][0].data());
        conv2d_backward_input_bf16(ctx, s, dy.data(), w.data(), out[t][1].data());
        conv2d_backward_weight_bf16(ctx, s, x.data(), dy.data(), out[t][2].data());
        gemm_bf16(ctx, false, true, 64, 32, 144, a.data(), 144, b.data(), 144, out[t][3].data(), 32);
      }
      INFO(bf16_kernels_name(k) << ": " << s.to_string());
      CHECK(out[0][0] == out[1][0]);  // forward
      CHECK(out[0][1] == out[1][1]);  // backward input
      CHECK(out[0][2] == out[1][2]);  // weight gradient
      CHECK(out[0][3] == out[1][3]);  // GEMM
    }
  }
}

TEST_CASE("bf16 kernels carry a NaN or an infinity to the outputs fp32 does", "[bf16]") {
  // Rounding keeps NaN a NaN and infinity infinite, and packing pairs must neither drop one nor
  // spread it: the non-finite outputs are the fp32 kernels' on the same operands.
  const std::vector<Conv2dShape> shapes = {
      {.n = 2, .h = 8, .w = 10, .c_in = 16, .c_out = 16, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1},  // row kernels
      {.n = 2, .h = 8, .w = 10, .c_in = 32, .c_out = 32, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1},
      {.n = 2, .h = 9, .w = 9, .c_in = 16, .c_out = 32, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1},
  };
  auto non_finite = [](const std::vector<float>& v, bool nan_only) {
    std::vector<bool> m(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) m[i] = nan_only ? std::isnan(v[i]) : !std::isfinite(v[i]);
    return m;
  };
  const CpuContext ctx(2);
  for (const Bf16Kernels k : towerflow::testing::bf16_paths()) {
    const ForceKernels force(k);
    for (const Conv2dShape& s : shapes)
      // A NaN whose payload is all in the bits that rounding drops would round to infinity.
      for (const float bad : {NAN, std::bit_cast<float>(0x7f800001u), INFINITY}) {
        const std::size_t xn = std::size_t(s.n) * s.h * s.w * s.c_in, wn = std::size_t(s.c_out) * s.c_in * s.kh * s.kw,
                          yn = std::size_t(s.n) * s.out_h() * s.out_w() * s.c_out;
        auto x = random_vector(xn, 31), dy = random_vector(yn, 33);
        const auto w = random_vector(wn, 32);
        x[xn / 2 + 5] = bad;   // the second image's first pixel, a corner
        dy[yn / 3 + 1] = bad;  // and a gradient inside the first image
        std::vector<float> y(yn), dx(xn), dw(wn), ref_y(yn), ref_dx(xn), ref_dw(wn);
        conv2d_forward_bf16(ctx, s, x.data(), w.data(), nullptr, y.data());
        conv2d_backward_input_bf16(ctx, s, dy.data(), w.data(), dx.data());
        conv2d_backward_weight_bf16(ctx, s, x.data(), dy.data(), dw.data());
        conv2d_forward(ctx, s, x.data(), w.data(), ref_y.data());
        conv2d_backward_input(ctx, s, dy.data(), w.data(), ref_dx.data());
        conv2d_backward_weight(ctx, s, x.data(), dy.data(), ref_dw.data());
        auto count = [](const std::vector<float>& v) {
          return std::count_if(v.begin(), v.end(), [](float e) { return !std::isfinite(e); });
        };
        INFO(bf16_kernels_name(k) << ": " << s.to_string() << ", one input " << bad << "; non-finite outputs: y "
                                  << count(y) << " (fp32 " << count(ref_y) << "), dx " << count(dx) << " ("
                                  << count(ref_dx) << "), dw " << count(dw) << " (" << count(ref_dw) << ")");
        const bool nan = std::isnan(bad);
        CHECK(non_finite(y, nan) == non_finite(ref_y, nan));
        CHECK(non_finite(dx, nan) == non_finite(ref_dx, nan));
        // Weight gradients differ in which products with the zeros around the image they compute
        // (0 x NaN is a NaN): fp32's AVX-512 row kernel multiplies x by a zero frame of dy, its
        // AVX2 kernels and oneDNN's do not. So dw must be non-finite wherever a product of values
        // inside the image is (nothing dropped), and only in the bad values' channels (nothing
        // spread).
        const int bad_ci = static_cast<int>((xn / 2 + 5) % s.c_in), bad_co = static_cast<int>((yn / 3 + 1) % s.c_out);
        std::vector<bool> reached(wn);
        for (int n = 0; n < s.n; ++n)
          for (int oy = 0; oy < s.out_h(); ++oy)
            for (int ox = 0; ox < s.out_w(); ++ox)
              for (int i = 0; i < s.kh; ++i)
                for (int j = 0; j < s.kw; ++j) {
                  const int iy = oy * s.stride_h - s.pad_h + i, ix = ox * s.stride_w - s.pad_w + j;
                  if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;
                  const float* xp = &x[((std::size_t(n) * s.h + iy) * s.w + ix) * s.c_in];
                  const float* dp = &dy[((std::size_t(n) * s.out_h() + oy) * s.out_w() + ox) * s.c_out];
                  for (int co = 0; co < s.c_out; ++co)
                    for (int ci = 0; ci < s.c_in; ++ci)
                      if (!std::isfinite(xp[ci]) || !std::isfinite(dp[co]))
                        reached[((std::size_t(co) * s.c_in + ci) * s.kh + i) * s.kw + j] = true;
                }
        std::size_t dropped = 0, spread = 0;
        for (std::size_t e = 0; e < wn; ++e) {
          const int co = static_cast<int>(e / (std::size_t(s.c_in) * s.kh * s.kw));
          const int ci = static_cast<int>(e / (std::size_t(s.kh) * s.kw) % s.c_in);
          dropped += reached[e] && std::isfinite(dw[e]);
          spread += !std::isfinite(dw[e]) && co != bad_co && ci != bad_ci;
          if (nan) dropped += reached[e] && std::isnan(ref_dw[e]) && !std::isnan(dw[e]);
        }
        CHECK(dropped == 0);
        CHECK(spread == 0);
        // And every product carries it somewhere.
        CHECK(std::any_of(y.begin(), y.end(), [](float v) { return !std::isfinite(v); }));
        CHECK(std::any_of(dx.begin(), dx.end(), [](float v) { return !std::isfinite(v); }));
        CHECK(std::any_of(dw.begin(), dw.end(), [](float v) { return !std::isfinite(v); }));
      }
  }
}

// The weight gradient with dy handed over a few rows at a time (bf16.h's DyRows, which
// Conv2DMaxPoolRelu's first layer feeds from the pool's backward): the bits of the stored dy's on
// every kernel that has the path, each row asked for once with `first`, and other kernels and the
// pair kernels' row kernel declining without asking.
TEST_CASE("bf16 weight gradient with dy through rows: the stored dy's bits, each row once first", "[bf16]") {
  const towerflow::testing::AutomaticBf16Kernels automatic;
  const CpuContext ctx(2);
  // 20 images sum in image groups, 3 split the tiles over threads (Note [Weight gradient: image
  // groups or tiles]); tfcnn's first layer's kernel and channels, an odd width (pixel pairs across
  // rows) and 3x3 with 48 output channels.
  const Conv2dShape shapes[] = {
      {.n = 20, .h = 10, .w = 12, .c_in = 3, .c_out = 64, .kh = 5, .kw = 5, .pad_h = 2, .pad_w = 2},
      {.n = 3, .h = 10, .w = 12, .c_in = 3, .c_out = 64, .kh = 5, .kw = 5, .pad_h = 2, .pad_w = 2},
      {.n = 17, .h = 7, .w = 9, .c_in = 8, .c_out = 48, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1},
  };
  for (const Bf16Kernels k : {Bf16Kernels::Avx512Bf16, Bf16Kernels::Avx512Bf16Emulated}) {
    if (!towerflow::testing::bf16_path_runs(k)) continue;  // the WARN says why
    for (const Conv2dShape& s : shapes) {
      INFO(bf16_kernels_name(k) << ": " << s.to_string());
      const std::size_t xn = std::size_t(s.n) * s.h * s.w * s.c_in, wn = std::size_t(s.c_out) * s.c_in * s.kh * s.kw;
      const std::int64_t row = std::int64_t{s.out_w()} * s.c_out;
      const auto x = random_vector(xn, 31), dy = random_vector(std::size_t(s.n) * s.out_h() * row, 32);
      std::vector<float> want(wn), got(wn, -1.0f);
      REQUIRE(conv2d_backward_weight_bf16_with(k, ctx, s, x.data(), dy.data(), want.data()));
      std::vector<std::atomic<int>> firsts(std::size_t(s.n) * s.out_h());
      std::atomic<bool> bad_span = false;
      const DyRows rows = [&](int n, int row0, int count, float* buf, bool first) {
        if (n < 0 || n >= s.n || row0 < 0 || count < 1 || row0 + count > s.out_h()) bad_span = true;
        if (first)
          for (int r = row0; r < row0 + count; ++r) ++firsts[std::size_t(n) * s.out_h() + r];
        std::copy_n(dy.data() + (std::int64_t{n} * s.out_h() + row0) * row, count * row, buf);
        return static_cast<const float*>(buf);
      };
      REQUIRE(conv2d_backward_weight_bf16_dy_rows_with(k, ctx, s, x.data(), rows, got.data()));
      CHECK_FALSE(bad_span);
      CHECK(got == want);
      for (std::size_t r = 0; r < firsts.size(); ++r) {
        INFO("image " << r / s.out_h() << ", row " << r % s.out_h());
        CHECK(firsts[r] == 1);
      }
    }
  }
  // No such path: the row kernel (up to 32 output channels of a 3-wide kernel), and the other
  // kernels.
  bool asked = false;
  const DyRows never = [&](int, int, int, float* buf, bool) {
    asked = true;
    return static_cast<const float*>(buf);
  };
  const Conv2dShape narrow{.n = 4, .h = 6, .w = 6, .c_in = 8, .c_out = 16, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1};
  const auto x = random_vector(std::size_t(4) * 6 * 6 * 8, 33);
  std::vector<float> dw(std::size_t(16) * 8 * 9, -1.0f);
  for (const Bf16Kernels k : {Bf16Kernels::Emulated, Bf16Kernels::OneDnn, Bf16Kernels::Amx, Bf16Kernels::AmxEmulated,
                              Bf16Kernels::Avx512Bf16, Bf16Kernels::Avx512Bf16Emulated}) {
    if (!towerflow::testing::bf16_path_runs(k)) continue;
    const bool pairs = k == Bf16Kernels::Avx512Bf16 || k == Bf16Kernels::Avx512Bf16Emulated;
    INFO(bf16_kernels_name(k));
    if (!pairs) {
      const Conv2dShape s = shapes[0];
      const auto xs = random_vector(std::size_t(s.n) * s.h * s.w * s.c_in, 34);
      std::vector<float> dws(std::size_t(s.c_out) * s.c_in * s.kh * s.kw, -1.0f);
      CHECK_FALSE(conv2d_backward_weight_bf16_dy_rows_with(k, ctx, s, xs.data(), never, dws.data()));
      CHECK(std::all_of(dws.begin(), dws.end(), [](float v) { return v == -1.0f; }));
    }
    CHECK_FALSE(conv2d_backward_weight_bf16_dy_rows_with(k, ctx, narrow, x.data(), never, dw.data()));
    CHECK(std::all_of(dw.begin(), dw.end(), [](float v) { return v == -1.0f; }));
  }
  CHECK_FALSE(asked);
}
