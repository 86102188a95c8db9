#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>

#include "core/cpu/conv.h"
#include "core/error.h"
#include "core/cpu/kernel_test_util.h"

using namespace towerflow::cpu;
using towerflow::Conv2dShape;
using towerflow::Pool2dShape;
using namespace towerflow::cpu::testing;

namespace {

// ---- naive double-precision references: the definition of a convolution, loop by loop -------

std::int64_t xi(const Conv2dShape& s, int n, int h, int w, int c) {
  return ((std::int64_t{n} * s.h + h) * s.w + w) * s.c_in + c;
}
std::int64_t yi(const Conv2dShape& s, int n, int h, int w, int c) {
  return ((std::int64_t{n} * s.out_h() + h) * s.out_w() + w) * s.c_out + c;
}
std::int64_t wi(const Conv2dShape& s, int co, int ci, int i, int j) {
  return ((std::int64_t{co} * s.c_in + ci) * s.kh + i) * s.kw + j;
}

// Calls fn(n, oh, ow, co, ci, i, j, ih, iw) for every term of the convolution sum whose input
// position is inside the image.
template <typename Fn>
void for_each_term(const Conv2dShape& s, Fn fn) {
  for (int n = 0; n < s.n; ++n)
    for (int oh = 0; oh < s.out_h(); ++oh)
      for (int ow = 0; ow < s.out_w(); ++ow)
        for (int co = 0; co < s.c_out; ++co)
          for (int ci = 0; ci < s.c_in; ++ci)
            for (int i = 0; i < s.kh; ++i)
              for (int j = 0; j < s.kw; ++j) {
                const int ih = oh * s.stride_h - s.pad_h + i, iw = ow * s.stride_w - s.pad_w + j;
                if (ih >= 0 && ih < s.h && iw >= 0 && iw < s.w) fn(n, oh, ow, co, ci, i, j, ih, iw);
              }
}

std::vector<double> ref_forward(const Conv2dShape& s, const std::vector<float>& x,
                                const std::vector<float>& w) {
  std::vector<double> y(static_cast<std::size_t>(std::int64_t{s.n} * s.out_h() * s.out_w() * s.c_out));
  for_each_term(s, [&](int n, int oh, int ow, int co, int ci, int i, int j, int ih, int iw) {
    y[yi(s, n, oh, ow, co)] += double(x[xi(s, n, ih, iw, ci)]) * w[wi(s, co, ci, i, j)];
  });
  return y;
}

std::vector<double> ref_backward_input(const Conv2dShape& s, const std::vector<float>& dy,
                                       const std::vector<float>& w) {
  std::vector<double> dx(static_cast<std::size_t>(std::int64_t{s.n} * s.h * s.w * s.c_in));
  for_each_term(s, [&](int n, int oh, int ow, int co, int ci, int i, int j, int ih, int iw) {
    dx[xi(s, n, ih, iw, ci)] += double(dy[yi(s, n, oh, ow, co)]) * w[wi(s, co, ci, i, j)];
  });
  return dx;
}

std::vector<double> ref_backward_weight(const Conv2dShape& s, const std::vector<float>& x,
                                        const std::vector<float>& dy) {
  std::vector<double> dw(static_cast<std::size_t>(std::int64_t{s.c_out} * s.c_in * s.kh * s.kw));
  for_each_term(s, [&](int n, int oh, int ow, int co, int ci, int i, int j, int ih, int iw) {
    dw[wi(s, co, ci, i, j)] += double(x[xi(s, n, ih, iw, ci)]) * dy[yi(s, n, oh, ow, co)];
  });
  return dw;
}

std::size_t x_size(const Conv2dShape& s) { return std::size_t(s.n) * s.h * s.w * s.c_in; }
std::size_t y_size(const Conv2dShape& s) { return std::size_t(s.n) * s.out_h() * s.out_w() * s.c_out; }
std::size_t w_size(const Conv2dShape& s) { return std::size_t(s.c_out) * s.c_in * s.kh * s.kw; }

// The odd shapes of the contract: batch 1, odd sizes, channels that are not a multiple of 8 or
// 16, 1x1, 5x5 pad 2, 3x3 stride 2 on odd inputs, unequal kernel/stride/pad per axis, padding as
// large as the kernel, rows wider than one register tile, and strides of 3 and 4 (stride phases
// with different tap counts, and phases with no taps at all).
const std::vector<Conv2dShape> kShapes = {
    {.n = 2, .h = 5, .w = 7, .c_in = 3, .c_out = 5, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1},
    {.n = 1, .h = 9, .w = 9, .c_in = 16, .c_out = 16, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1},
    {.n = 2, .h = 6, .w = 5, .c_in = 7, .c_out = 17, .kh = 1, .kw = 1},
    {.n = 2, .h = 7, .w = 7, .c_in = 8, .c_out = 12, .kh = 1, .kw = 1, .stride_h = 2, .stride_w = 2},
    {.n = 2, .h = 8, .w = 6, .c_in = 4, .c_out = 9, .kh = 5, .kw = 5, .pad_h = 2, .pad_w = 2},
    {.n = 3, .h = 6, .w = 13, .c_in = 10, .c_out = 33, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1},
    {.n = 2, .h = 7, .w = 6, .c_in = 5, .c_out = 6, .kh = 3, .kw = 2, .stride_h = 2, .stride_w = 1, .pad_h = 1, .pad_w = 0},
    {.n = 1, .h = 4, .w = 4, .c_in = 2, .c_out = 3, .kh = 3, .kw = 3},
    {.n = 1, .h = 5, .w = 4, .c_in = 3, .c_out = 4, .kh = 1, .kw = 1, .pad_h = 1, .pad_w = 1},
    {.n = 2, .h = 16, .w = 16, .c_in = 16, .c_out = 32, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1},
    {.n = 2, .h = 11, .w = 11, .c_in = 3, .c_out = 64, .kh = 5, .kw = 5, .pad_h = 2, .pad_w = 2},
    {.n = 1, .h = 10, .w = 11, .c_in = 20, .c_out = 6, .kh = 5, .kw = 4, .stride_h = 3, .stride_w = 2, .pad_h = 2, .pad_w = 1},
    {.n = 2, .h = 9, .w = 8, .c_in = 9, .c_out = 16, .kh = 2, .kw = 3, .stride_h = 3, .stride_w = 4, .pad_h = 1, .pad_w = 1},
    // A batch large enough for the image-group weight gradient.
    {.n = 19, .h = 5, .w = 6, .c_in = 5, .c_out = 20, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1},
};

struct ConvResults {
  std::vector<float> y, dx, dw;
};

ConvResults run_all(const CpuContext& ctx, const Conv2dShape& s, const std::vector<float>& x,
                    const std::vector<float>& w, const std::vector<float>& dy) {
  // Outputs start as NaN: every kernel must overwrite all of its output.
  ConvResults r{std::vector<float>(y_size(s), NAN), std::vector<float>(x_size(s), NAN),
                std::vector<float>(w_size(s), NAN)};
  conv2d_forward(ctx, s, x.data(), w.data(), r.y.data());
  conv2d_backward_input(ctx, s, dy.data(), w.data(), r.dx.data());
  conv2d_backward_weight(ctx, s, x.data(), dy.data(), r.dw.data());
  return r;
}

// Runs the three kernels on random data drawn from seed .. seed+2 and checks each against the
// double-precision reference.
void check_against_reference(const CpuContext& ctx, const Conv2dShape& s, std::uint32_t seed) {
  INFO("shape " << s.to_string());
  const auto x = random_vector(x_size(s), seed);
  const auto w = random_vector(w_size(s), seed + 1);
  const auto dy = random_vector(y_size(s), seed + 2);
  const auto r = run_all(ctx, s, x, w, dy);
  const auto fy = compare(r.y, ref_forward(s, x, w));
  const auto fdx = compare(r.dx, ref_backward_input(s, dy, w));
  const auto fdw = compare(r.dw, ref_backward_weight(s, x, dy));
  INFO("forward: " << fy.describe());
  INFO("backward input: " << fdx.describe());
  INFO("backward weight: " << fdw.describe());
  CHECK(fy.max_error < 1e-5);
  CHECK(fdx.max_error < 1e-5);
  CHECK(fdw.max_error < 1e-5);
}

}  // namespace

TEST_CASE("conv2d kernels match a double-precision reference on odd shapes", "[cpu][conv]") {
  CpuContext ctx(2);
  std::uint32_t seed = 1;
  for (const auto& s : kShapes) {
    check_against_reference(ctx, s, seed);
    seed += 3;
  }
}

TEST_CASE("conv2d kernels match the reference for every channel count up to 70", "[cpu][conv]") {
  // Every channel block width and tail: 8-lane and 16-lane vectors, one to four vectors per
  // block, partial last blocks. c_out sets the forward and weight-gradient blocks, c_in the
  // backward-input ones, so c_in runs through the counts in the other direction. Odd widths,
  // batch 1, stride 1 (one register tile spans rows) and stride 2 (stride phases).
  CpuContext ctx(2);
  std::uint32_t seed = 400;
  for (int c = 1; c <= 70; ++c) {
    const int c_in = 71 - c;
    const std::vector<Conv2dShape> shapes = {
        {.n = 1, .h = 5, .w = 7, .c_in = c_in, .c_out = c, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1},
        {.n = 2, .h = 7, .w = 5, .c_in = c_in, .c_out = c, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1},
        {.n = 1, .h = 3, .w = 9, .c_in = c, .c_out = c_in, .kh = 1, .kw = 1, .stride_h = 2, .stride_w = 2},
    };
    for (const auto& s : shapes) {
      check_against_reference(ctx, s, seed);
      seed += 3;
    }
  }
  // The image-group weight gradient (n >= 16) with partial and multi-vector blocks.
  for (int c : {9, 17, 40, 48, 64, 70}) {
    const Conv2dShape s{.n = 17, .h = 4, .w = 5, .c_in = 7, .c_out = c, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1};
    INFO("shape " << s.to_string());
    const auto x = random_vector(x_size(s), seed++);
    const auto dy = random_vector(y_size(s), seed++);
    std::vector<float> dw(w_size(s), NAN);
    conv2d_backward_weight(ctx, s, x.data(), dy.data(), dw.data());
    const auto fdw = compare(dw, ref_backward_weight(s, x, dy));
    INFO("backward weight: " << fdw.describe());
    CHECK(fdw.max_error < 1e-5);
  }
}

TEST_CASE("conv2d row-kernel shapes (9-16 output channels, 3 or 16 inputs, 3-wide kernels) match the reference",
          "[cpu][conv]") {
  // On AVX-512 builds these take the row kernel (Note [Row kernel for 16 channels]): every tile
  // width 1..16 and the balanced splits of wider rows, vertical stride 2, no padding and padding
  // wider than the kernel's reach, 1- and 3-tall kernels, partial channel vectors, and the
  // transposed convolution of backward input (c_in 16 there means c_out 16 here). Elsewhere they
  // check the general tiles on the same shapes.
  CpuContext ctx(2);
  std::uint32_t seed = 900;
  for (int c_in : {3, 16})
    for (int c_out : {16, 9, 3})
      for (int w : {1, 2, 7, 16, 17, 32, 33, 47}) {
        const std::vector<Conv2dShape> shapes = {
            {.n = 2, .h = 4, .w = w, .c_in = c_in, .c_out = c_out, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1},
            {.n = 1, .h = 5, .w = w + 2, .c_in = c_in, .c_out = c_out, .kh = 3, .kw = 3},
            {.n = 1, .h = 6, .w = w, .c_in = c_in, .c_out = c_out, .kh = 3, .kw = 3, .stride_h = 2, .pad_h = 1, .pad_w = 1},
            {.n = 1, .h = 2, .w = w, .c_in = c_in, .c_out = c_out, .kh = 1, .kw = 3, .pad_h = 0, .pad_w = 2},
        };
        for (const auto& s : shapes) {
          check_against_reference(ctx, s, seed);
          seed += 3;
          INFO("shape " << s.to_string());
          const auto x = random_vector(x_size(s), seed++);
          const auto wt = random_vector(w_size(s), seed++);
          const auto bias = random_vector(std::size_t(s.c_out), seed++);
          std::vector<float> yb(y_size(s), NAN);
          conv2d_forward_bias(ctx, s, x.data(), wt.data(), bias.data(), yb.data());
          auto want_b = ref_forward(s, x, wt);
          for (std::size_t i = 0; i < want_b.size(); ++i) want_b[i] += bias[i % s.c_out];
          const auto fb = compare(yb, want_b);
          INFO("forward with bias: " << fb.describe());
          CHECK(fb.max_error < 1e-5);
        }
      }
}

TEST_CASE("conv2d backward kernels match finite differences of the forward kernel", "[cpu][conv]") {
  // L = sum(g * conv(x, w)); dL/dx = backward_input(g), dL/dw = backward_weight(x, g).
  CpuContext ctx(1);
  const std::vector<Conv2dShape> shapes = {
      {.n = 1, .h = 5, .w = 4, .c_in = 2, .c_out = 3, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1},
      {.n = 2, .h = 5, .w = 5, .c_in = 3, .c_out = 2, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1},
      {.n = 1, .h = 4, .w = 6, .c_in = 2, .c_out = 9, .kh = 1, .kw = 1, .stride_h = 2, .stride_w = 2},
  };
  std::uint32_t seed = 100;
  for (const auto& s : shapes) {
    INFO("shape " << s.to_string());
    auto x = random_vector(x_size(s), seed++);
    auto w = random_vector(w_size(s), seed++);
    const auto g = random_vector(y_size(s), seed++);
    std::vector<float> y(y_size(s)), dx(x_size(s)), dw(w_size(s));
    conv2d_backward_input(ctx, s, g.data(), w.data(), dx.data());
    conv2d_backward_weight(ctx, s, x.data(), g.data(), dw.data());
    auto loss = [&] {
      conv2d_forward(ctx, s, x.data(), w.data(), y.data());
      return dot(g, y);
    };
    const float h = 1e-2f;
    auto fd = [&](std::vector<float>& v, std::size_t i) {
      const float keep = v[i];
      v[i] = keep + h;
      const double up = loss();
      v[i] = keep - h;
      const double down = loss();
      v[i] = keep;
      return (up - down) / (2.0 * h);
    };
    std::vector<double> fd_dx(x.size()), fd_dw(w.size());
    for (std::size_t i = 0; i < x.size(); ++i) fd_dx[i] = fd(x, i);
    for (std::size_t i = 0; i < w.size(); ++i) fd_dw[i] = fd(w, i);
    const auto cx = compare(dx, fd_dx), cw = compare(dw, fd_dw);
    INFO("dx vs finite differences: " << cx.describe());
    INFO("dw vs finite differences: " << cw.describe());
    CHECK(cx.max_error < 1e-3);
    CHECK(cw.max_error < 1e-3);
  }
}

TEST_CASE("conv2d results are identical for 1 and 3 threads", "[cpu][conv]") {
  CpuContext one(1), three(3);
  // Large enough that every kernel splits its work over threads.
  const std::vector<Conv2dShape> shapes = {
      {.n = 6, .h = 12, .w = 12, .c_in = 16, .c_out = 16, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1},
      {.n = 5, .h = 13, .w = 13, .c_in = 16, .c_out = 32, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1},
      {.n = 3, .h = 9, .w = 9, .c_in = 24, .c_out = 20, .kh = 5, .kw = 5, .pad_h = 2, .pad_w = 2},
      {.n = 21, .h = 7, .w = 7, .c_in = 16, .c_out = 16, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1},
      {.n = 4, .h = 9, .w = 9, .c_in = 48, .c_out = 64, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1},
      {.n = 18, .h = 9, .w = 7, .c_in = 64, .c_out = 48, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1},
  };
  std::uint32_t seed = 200;
  for (const auto& s : shapes) {
    INFO("shape " << s.to_string());
    const auto x = random_vector(x_size(s), seed++);
    const auto w = random_vector(w_size(s), seed++);
    const auto dy = random_vector(y_size(s), seed++);
    const auto a = run_all(one, s, x, w, dy);
    const auto b = run_all(three, s, x, w, dy);
    CHECK(a.y == b.y);
    CHECK(a.dx == b.dx);
    CHECK(a.dw == b.dw);
    // Repeated calls reuse scratch and give the same answer.
    const auto c = run_all(three, s, x, w, dy);
    CHECK(c.dw == b.dw);
  }
}

TEST_CASE("conv2d_backward_input_add adds the backward input to dx as a separate add would", "[cpu][conv]") {
  // Every odd shape (stride phases without taps leave dx as it is), the row kernel's transposed
  // shapes on AVX-512 (16 dx channels, 3-wide kernels, from 16 or 3 dy channels), partial channel
  // vectors, and 1 and 3 threads: each element dx + conv2d_backward_input's value, rounded once.
  std::vector<Conv2dShape> shapes = kShapes;
  shapes.push_back({.n = 3, .h = 9, .w = 19, .c_in = 16, .c_out = 16, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1});
  shapes.push_back({.n = 2, .h = 6, .w = 33, .c_in = 16, .c_out = 3, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1});
  shapes.push_back({.n = 5, .h = 13, .w = 13, .c_in = 13, .c_out = 32, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1});
  std::uint32_t seed = 700;
  for (const int threads : {1, 3}) {
    CpuContext ctx(threads);
    for (const auto& s : shapes) {
      INFO("shape " << s.to_string() << ", " << threads << " threads");
      const auto w = random_vector(w_size(s), seed++);
      const auto dy = random_vector(y_size(s), seed++);
      const auto base = random_vector(x_size(s), seed++);
      std::vector<float> dx(x_size(s), NAN);
      conv2d_backward_input(ctx, s, dy.data(), w.data(), dx.data());
      std::vector<float> want(base.size());
      for (std::size_t i = 0; i < want.size(); ++i) want[i] = base[i] + dx[i];
      std::vector<float> sum = base;
      conv2d_backward_input_add(ctx, s, dy.data(), w.data(), sum.data());
      CHECK(sum == want);
    }
  }
}

TEST_CASE("conv2d bias variants add and reduce the bias", "[cpu][conv]") {
  CpuContext ctx(2);
  const Conv2dShape s{.n = 2, .h = 7, .w = 9, .c_in = 5, .c_out = 19, .kh = 5, .kw = 5, .pad_h = 2, .pad_w = 2};
  const auto x = random_vector(x_size(s), 300);
  const auto w = random_vector(w_size(s), 301);
  const auto bias = random_vector(std::size_t(s.c_out), 302);
  std::vector<float> y(y_size(s), NAN);
  conv2d_forward_bias(ctx, s, x.data(), w.data(), bias.data(), y.data());
  auto want = ref_forward(s, x, w);
  for (std::size_t i = 0; i < want.size(); ++i) want[i] += bias[i % s.c_out];
  const auto cy = compare(y, want);
  INFO(cy.describe());
  CHECK(cy.max_error < 1e-5);

  const auto dy = random_vector(y_size(s), 303);
  std::vector<float> db(std::size_t(s.c_out), NAN);
  conv2d_backward_bias(ctx, s, dy.data(), db.data());
  std::vector<double> want_db(std::size_t(s.c_out));
  for (std::size_t i = 0; i < dy.size(); ++i) want_db[i % s.c_out] += dy[i];
  const auto cb = compare(db, want_db);
  INFO(cb.describe());
  CHECK(cb.max_error < 1e-6);
}

TEST_CASE("conv2d rejects impossible shapes with the field named", "[cpu][conv]") {
  CpuContext ctx(1);
  std::vector<float> buf(4096);
  auto fails_with = [&](Conv2dShape s, const std::string& field) {
    INFO("shape " << s.to_string() << ", expecting a message about " << field);
    try {
      conv2d_forward(ctx, s, buf.data(), buf.data(), buf.data());
      FAIL("no exception");
    } catch (const towerflow::InvalidArgument& e) {
      CHECK_THAT(e.what(), Catch::Contains(field));
    }
    CHECK_THROWS_AS(conv2d_backward_input(ctx, s, buf.data(), buf.data(), buf.data()),
                    towerflow::InvalidArgument);
    CHECK_THROWS_AS(conv2d_backward_weight(ctx, s, buf.data(), buf.data(), buf.data()),
                    towerflow::InvalidArgument);
  };
  const Conv2dShape ok{.n = 1, .h = 4, .w = 4, .c_in = 2, .c_out = 2, .kh = 3, .kw = 3};
  auto with = [&](auto change) {
    Conv2dShape s = ok;
    change(s);
    return s;
  };
  fails_with(with([](auto& s) { s.n = 0; }), "n = 0");
  fails_with(with([](auto& s) { s.c_in = -1; }), "c_in = -1");
  fails_with(with([](auto& s) { s.kw = 0; }), "kw = 0");
  fails_with(with([](auto& s) { s.stride_h = 0; }), "stride_h = 0");
  fails_with(with([](auto& s) { s.pad_w = -1; }), "pad_w = -1");
  fails_with(with([](auto& s) { s.kh = 5; }), "kernel height kh = 5");
  fails_with(with([](auto& s) { s.kw = 7; s.pad_w = 1; }), "kernel width kw = 7");
  fails_with(with([](auto& s) { s.n = 1 << 20; s.h = 64; s.w = 64; }), "2^31");
}

TEST_CASE("Winograd F(2x2, 3x3) kernels (all three passes) match the reference on 3x3 stride-1 shapes", "[cpu][conv]") {
  // Odd output sizes (2x2 tiles cut by the edge), padding 0, 1 and 2 (the backward input's
  // transposed padding 2, 1 and 0), tile groups that span images, 8 to 64 channels each way
  // (8-lane and 16-lane blocks, partial last blocks of the products), with and without a bias,
  // and 1 and 3 threads, which must agree bit for bit.
  const std::vector<Conv2dShape> shapes = {
      {.n = 2, .h = 5, .w = 7, .c_in = 8, .c_out = 8, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1},
      {.n = 3, .h = 9, .w = 6, .c_in = 16, .c_out = 16, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1},
      {.n = 1, .h = 8, .w = 9, .c_in = 24, .c_out = 40, .kh = 3, .kw = 3},
      {.n = 2, .h = 6, .w = 5, .c_in = 32, .c_out = 48, .kh = 3, .kw = 3, .pad_h = 2, .pad_w = 2},
      {.n = 2, .h = 7, .w = 8, .c_in = 64, .c_out = 64, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 0},
      {.n = 9, .h = 8, .w = 8, .c_in = 16, .c_out = 32, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1},
      // Batches large enough for the weight gradient's image groups.
      {.n = 17, .h = 5, .w = 6, .c_in = 8, .c_out = 24, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1},
      {.n = 16, .h = 8, .w = 8, .c_in = 64, .c_out = 64, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1},
  };
  CpuContext one(1), three(3);
  std::uint32_t seed = 900;
  for (const auto& s : shapes) {
    INFO("shape " << s.to_string());
    const auto x = random_vector(x_size(s), seed++);
    const auto w = random_vector(w_size(s), seed++);
    const auto dy = random_vector(y_size(s), seed++);
    const auto bias = random_vector(static_cast<std::size_t>(s.c_out), seed++);
    std::vector<float> y(y_size(s), NAN), yb(y_size(s), NAN), dx(x_size(s), NAN), dw(w_size(s), NAN);
    REQUIRE(conv2d_backward_weight_winograd(three, s, x.data(), dy.data(), dw.data()));
    REQUIRE(conv2d_forward_winograd(three, s, x.data(), w.data(), nullptr, y.data()));
    REQUIRE(conv2d_forward_winograd(three, s, x.data(), w.data(), bias.data(), yb.data()));
    REQUIRE(conv2d_backward_input_winograd(three, s, dy.data(), w.data(), dx.data()));
    std::vector<double> want_y = ref_forward(s, x, w), want_yb = want_y;
    for (std::size_t i = 0; i < want_yb.size(); ++i) want_yb[i] += bias[i % s.c_out];
    const auto fy = compare(y, want_y), fyb = compare(yb, want_yb);
    const auto fdx = compare(dx, ref_backward_input(s, dy, w));
    INFO("forward: " << fy.describe() << "; with bias: " << fyb.describe());
    const auto fdw = compare(dw, ref_backward_weight(s, x, dy));
    INFO("backward input: " << fdx.describe() << "; backward weight: " << fdw.describe());
    CHECK(fy.max_error < 1e-5);
    CHECK(fyb.max_error < 1e-5);
    CHECK(fdx.max_error < 1e-5);
    CHECK(fdw.max_error < 1e-5);

    std::vector<float> y1(y_size(s), NAN), dx1(x_size(s), NAN), dw1(w_size(s), NAN);
    REQUIRE(conv2d_forward_winograd(one, s, x.data(), w.data(), nullptr, y1.data()));
    REQUIRE(conv2d_backward_input_winograd(one, s, dy.data(), w.data(), dx1.data()));
    REQUIRE(conv2d_backward_weight_winograd(one, s, x.data(), dy.data(), dw1.data()));
    CHECK(y1 == y);
    CHECK(dx1 == dx);
    CHECK(dw1 == dw);

    // The add variant: the backward input added to dx, rounded once.
    const auto base = random_vector(x_size(s), seed++);
    std::vector<float> want(base.size()), sum = base;
    for (std::size_t i = 0; i < want.size(); ++i) want[i] = base[i] + dx[i];
    REQUIRE(conv2d_backward_input_add_winograd(three, s, dy.data(), w.data(), sum.data()));
    CHECK(sum == want);
  }
}

TEST_CASE("Winograd kernels decline the shapes they do not compute, writing nothing", "[cpu][conv]") {
  CpuContext ctx(2);
  const std::vector<Conv2dShape> shapes = {
      // stride 2, a 5x5 kernel, a 3x1 kernel, 3 input channels, 12 output channels, padding 3
      {.n = 1, .h = 9, .w = 9, .c_in = 16, .c_out = 16, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1},
      {.n = 1, .h = 8, .w = 8, .c_in = 16, .c_out = 16, .kh = 5, .kw = 5, .pad_h = 2, .pad_w = 2},
      {.n = 1, .h = 8, .w = 8, .c_in = 16, .c_out = 16, .kh = 3, .kw = 1, .pad_h = 1},
      {.n = 1, .h = 8, .w = 8, .c_in = 3, .c_out = 16, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1},
      {.n = 1, .h = 8, .w = 8, .c_in = 16, .c_out = 12, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1},
      {.n = 1, .h = 4, .w = 4, .c_in = 8, .c_out = 8, .kh = 3, .kw = 3, .pad_h = 3, .pad_w = 3},
  };
  for (const auto& s : shapes) {
    INFO("shape " << s.to_string());
    const auto x = random_vector(x_size(s), 1), w = random_vector(w_size(s), 2), dy = random_vector(y_size(s), 3);
    std::vector<float> y(y_size(s), 7.0f), dx(x_size(s), 7.0f), dw(w_size(s), 7.0f);
    CHECK_FALSE(conv2d_backward_weight_winograd(ctx, s, x.data(), dy.data(), dw.data()));
    CHECK(std::all_of(dw.begin(), dw.end(), [](float v) { return v == 7.0f; }));
    CHECK_FALSE(conv2d_forward_winograd(ctx, s, x.data(), w.data(), nullptr, y.data()));
    CHECK_FALSE(conv2d_backward_input_winograd(ctx, s, dy.data(), w.data(), dx.data()));
    CHECK_FALSE(conv2d_backward_input_add_winograd(ctx, s, dy.data(), w.data(), dx.data()));
    CHECK(std::all_of(y.begin(), y.end(), [](float v) { return v == 7.0f; }));
    CHECK(std::all_of(dx.begin(), dx.end(), [](float v) { return v == 7.0f; }));
  }
}
