#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <new>

#include "core/cpu/kernel_test_util.h"
#include "core/cpu/pool.h"
#include "core/error.h"

using namespace towerflow::cpu;
using towerflow::Conv2dShape;
using towerflow::Pool2dShape;
using namespace towerflow::cpu::testing;

namespace {

std::size_t in_size(const Pool2dShape& s) { return std::size_t(s.n) * s.h * s.w * s.c; }
std::size_t out_size(const Pool2dShape& s) { return std::size_t(s.n) * s.out_h() * s.out_w() * s.c; }

// Reference max pool straight from the definition: padding is -inf, first maximum wins.
void ref_max_pool(const Pool2dShape& s, const std::vector<float>& x, std::vector<double>& y,
                  std::vector<std::int32_t>& arg) {
  y.assign(out_size(s), 0.0);
  arg.assign(out_size(s), -1);
  std::size_t o = 0;
  for (int n = 0; n < s.n; ++n)
    for (int oh = 0; oh < s.out_h(); ++oh)
      for (int ow = 0; ow < s.out_w(); ++ow)
        for (int c = 0; c < s.c; ++c, ++o) {
          double best = -std::numeric_limits<double>::infinity();
          for (int i = 0; i < s.kh; ++i)
            for (int j = 0; j < s.kw; ++j) {
              const int ih = oh * s.stride_h - s.pad_h + i, iw = ow * s.stride_w - s.pad_w + j;
              if (ih < 0 || ih >= s.h || iw < 0 || iw >= s.w) continue;
              const double v = x[((std::size_t(n) * s.h + ih) * s.w + iw) * s.c + c];
              if (v > best) {
                best = v;
                arg[o] = ih * s.w + iw;
              }
            }
          y[o] = best;
        }
}

// Reference average pool (count_include_pad) and its backward, scattering each output's
// gradient over its window.
std::vector<double> ref_avg_pool(const Pool2dShape& s, const std::vector<float>& x) {
  std::vector<double> y(out_size(s));
  std::size_t o = 0;
  for (int n = 0; n < s.n; ++n)
    for (int oh = 0; oh < s.out_h(); ++oh)
      for (int ow = 0; ow < s.out_w(); ++ow)
        for (int c = 0; c < s.c; ++c, ++o) {
          double sum = 0.0;
          for (int i = 0; i < s.kh; ++i)
            for (int j = 0; j < s.kw; ++j) {
              const int ih = oh * s.stride_h - s.pad_h + i, iw = ow * s.stride_w - s.pad_w + j;
              if (ih >= 0 && ih < s.h && iw >= 0 && iw < s.w)
                sum += x[((std::size_t(n) * s.h + ih) * s.w + iw) * s.c + c];
            }
          y[o] = sum / (s.kh * s.kw);
        }
  return y;
}

// max pool's backward as a scatter: each output's gradient added to the input its argmax names,
// in output order.
std::vector<float> scatter_max_grad(const Pool2dShape& s, const std::vector<float>& dy,
                                    const std::vector<std::int32_t>& arg) {
  std::vector<float> scatter(in_size(s), 0.0f);
  const std::size_t image_in = std::size_t(s.h) * s.w * s.c, image_out = out_size(s) / s.n;
  for (int n = 0; n < s.n; ++n)
    for (std::size_t p = 0; p < image_out; p += s.c)
      for (int ch = 0; ch < s.c; ++ch) {
        const std::size_t o = n * image_out + p + ch;
        scatter[n * image_in + std::size_t(arg[o]) * s.c + ch] += dy[o];
      }
  return scatter;
}

const std::vector<Pool2dShape> kShapes = {
    {.n = 2, .h = 7, .w = 9, .c = 5, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1},
    {.n = 1, .h = 8, .w = 8, .c = 16, .kh = 2, .kw = 2, .stride_h = 2, .stride_w = 2},
    {.n = 3, .h = 5, .w = 6, .c = 1, .kh = 3, .kw = 3, .stride_h = 1, .stride_w = 1},
    {.n = 2, .h = 8, .w = 8, .c = 19, .kh = 8, .kw = 8, .stride_h = 1, .stride_w = 1},
    {.n = 2, .h = 16, .w = 16, .c = 64, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1},
    {.n = 1, .h = 6, .w = 5, .c = 3, .kh = 3, .kw = 2, .stride_h = 3, .stride_w = 1, .pad_h = 1, .pad_w = 1},
};

}  // namespace

TEST_CASE("max pool matches the reference, argmax included", "[cpu][pool]") {
  CpuContext ctx(2);
  std::uint32_t seed = 1;
  for (const auto& s : kShapes) {
    INFO("shape " << s.to_string());
    const auto x = random_vector(in_size(s), seed++);
    std::vector<double> want;
    std::vector<std::int32_t> want_arg;
    ref_max_pool(s, x, want, want_arg);
    std::vector<float> y(out_size(s), NAN);
    std::vector<std::int32_t> arg(out_size(s), -7);
    max_pool_forward(ctx, s, x.data(), y.data(), arg.data());
    const auto c = compare(y, want);
    INFO(c.describe());
    CHECK(c.max_error == 0.0);
    CHECK(arg == want_arg);
    std::vector<float> y2(out_size(s), NAN);
    max_pool_forward(ctx, s, x.data(), y2.data(), nullptr);
    CHECK(y2 == y);

    // Backward: dx[argmax] accumulates dy.
    const auto dy = random_vector(out_size(s), seed++);
    std::vector<double> want_dx(in_size(s));
    const std::size_t plane = std::size_t(s.out_h()) * s.out_w();
    for (std::size_t o = 0; o < dy.size(); ++o) {
      const std::size_t n = o / (plane * s.c), c = o % s.c;
      want_dx[(n * s.h * s.w + want_arg[o]) * s.c + c] += dy[o];
    }
    std::vector<float> dx(in_size(s), NAN);
    max_pool_backward(ctx, s, dy.data(), arg.data(), dx.data());
    const auto cd = compare(dx, want_dx);
    INFO("backward: " << cd.describe());
    CHECK(cd.max_error < 1e-6);
  }
}

TEST_CASE("max pool takes the first of equal maxima and propagates NaN", "[cpu][pool]") {
  CpuContext ctx(1);
  const Pool2dShape s{.n = 1, .h = 2, .w = 2, .c = 2, .kh = 2, .kw = 2, .stride_h = 2, .stride_w = 2};
  // Channel 0: all equal -> index 0. Channel 1: a NaN at position 2.
  const std::vector<float> x = {1.0f, 0.0f, 1.0f, 5.0f, 1.0f, NAN, 1.0f, 7.0f};
  std::vector<float> y(2);
  std::vector<std::int32_t> arg(2);
  max_pool_forward(ctx, s, x.data(), y.data(), arg.data());
  CHECK(y[0] == 1.0f);
  CHECK(arg[0] == 0);
  CHECK(std::isnan(y[1]));
  CHECK(arg[1] == 2);
}

// The same rule in every channel group the kernel uses (91 = 64 + 16 + 8 + 3 with 16 lanes,
// 2 * 32 + 3 * 8 + 3 with 8):
// many ties (values on a grid of 0.5), NaNs, infinities and huge values scattered over all
// channels, against the rule
// written out per element (start from the window's first element, take v > best or NaN).
TEST_CASE("max pool ties and NaN follow PyTorch's rule in every lane width", "[cpu][pool]") {
  CpuContext ctx(2);
  const Pool2dShape s{.n = 2, .h = 9, .w = 8, .c = 91, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1};
  auto x = random_vector(in_size(s), 77);
  for (auto& v : x) v = std::round(v * 2.0f) / 2.0f;
  for (std::size_t i = 5; i < x.size(); i += 37) x[i] = NAN;
  // Infinities, and finite values whose window sums overflow: the windows the kernel scans again
  // with the NaN test (Note [Max pool without the NaN test]) must give the same rule.
  for (std::size_t i = 11; i < x.size(); i += 41) x[i] = INFINITY;
  for (std::size_t i = 17; i < x.size(); i += 43) x[i] = -INFINITY;
  for (std::size_t i = 23; i < x.size(); i += 29) x[i] = (i / 29) % 2 ? 3e38f : -3e38f;
  std::vector<float> y(out_size(s));
  std::vector<std::int32_t> arg(out_size(s));
  max_pool_forward(ctx, s, x.data(), y.data(), arg.data());
  std::size_t o = 0, nans = 0, ties = 0;
  for (int n = 0; n < s.n; ++n)
    for (int oh = 0; oh < s.out_h(); ++oh)
      for (int ow = 0; ow < s.out_w(); ++ow)
        for (int c = 0; c < s.c; ++c, ++o) {
          float best = 0.0f;
          std::int32_t at = -1;
          int equal = 0;
          for (int i = 0; i < s.kh; ++i)
            for (int j = 0; j < s.kw; ++j) {
              const int ih = oh * s.stride_h - s.pad_h + i, iw = ow * s.stride_w - s.pad_w + j;
              if (ih < 0 || ih >= s.h || iw < 0 || iw >= s.w) continue;
              const float v = x[((std::size_t(n) * s.h + ih) * s.w + iw) * s.c + c];
              if (at < 0 || v > best || std::isnan(v)) {
                best = v;
                at = ih * s.w + iw;
              } else if (v == best) {
                ++equal;
              }
            }
          INFO("output " << o << " (channel " << c << ")");
          CHECK(arg[o] == at);
          if (std::isnan(best)) {
            ++nans;
            CHECK(std::isnan(y[o]));
          } else {
            CHECK(y[o] == best);
          }
          ties += equal > 0;
        }
  CHECK(nans > 20);  // the case covers what it claims
  CHECK(ties > 100);
}

TEST_CASE("average pool matches the reference, backward matches finite differences", "[cpu][pool]") {
  CpuContext ctx(2);
  std::uint32_t seed = 50;
  for (const auto& s : kShapes) {
    INFO("shape " << s.to_string());
    auto x = random_vector(in_size(s), seed++);
    std::vector<float> y(out_size(s), NAN);
    avg_pool_forward(ctx, s, x.data(), y.data());
    const auto c = compare(y, ref_avg_pool(s, x));
    INFO(c.describe());
    CHECK(c.max_error < 1e-6);

    // Average pooling is linear: central differences of L = sum(g * y) are exact up to rounding.
    const auto g = random_vector(out_size(s), seed++);
    std::vector<float> dx(in_size(s), NAN);
    avg_pool_backward(ctx, s, g.data(), dx.data());
    std::vector<double> fd(x.size());
    const float h = 0.5f;
    for (std::size_t i = 0; i < x.size(); i += 1 + x.size() / 200) {
      const float keep = x[i];
      x[i] = keep + h;
      avg_pool_forward(ctx, s, x.data(), y.data());
      const double up = dot(g, y);
      x[i] = keep - h;
      avg_pool_forward(ctx, s, x.data(), y.data());
      const double down = dot(g, y);
      x[i] = keep;
      fd[i] = (up - down) / (2 * h);
      INFO("dx[" << i << "] = " << dx[i] << ", finite difference " << fd[i]);
      CHECK(std::abs(dx[i] - fd[i]) < 1e-4);
    }
  }
}

TEST_CASE("max pool backward matches finite differences", "[cpu][pool]") {
  CpuContext ctx(1);
  const Pool2dShape s{.n = 2, .h = 5, .w = 5, .c = 3, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1};
  auto x = random_vector(in_size(s), 77);
  const auto g = random_vector(out_size(s), 78);
  std::vector<float> y(out_size(s)), dx(in_size(s));
  std::vector<std::int32_t> arg(out_size(s));
  max_pool_forward(ctx, s, x.data(), y.data(), arg.data());
  max_pool_backward(ctx, s, g.data(), arg.data(), dx.data());
  // Random normal inputs have gaps far above h between neighbours, so the argmax does not move.
  const float h = 1e-3f;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float keep = x[i];
    x[i] = keep + h;
    max_pool_forward(ctx, s, x.data(), y.data(), nullptr);
    const double up = dot(g, y);
    x[i] = keep - h;
    max_pool_forward(ctx, s, x.data(), y.data(), nullptr);
    const double down = dot(g, y);
    x[i] = keep;
    const double fd = (up - down) / (2 * h);
    INFO("dx[" << i << "] = " << dx[i] << ", finite difference " << fd);
    CHECK(std::abs(dx[i] - fd) < 1e-2 * (1 + std::abs(fd)));
  }
}

// max_pool_backward against its definition, the scatter dx = 0, dx[argmax] += dy over the
// outputs in order, bit for bit: with overlapping windows and ties (so that one input takes
// several windows), padding, inputs no window covers (dx starts as 7 to see them written), and
// channel counts off the vector width.
TEST_CASE("max pool backward equals the scatter over the outputs bit for bit", "[cpu][pool]") {
  CpuContext ctx(2);
  const Pool2dShape shapes[] = {
      {.n = 3, .h = 9, .w = 7, .c = 19, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1},
      {.n = 2, .h = 8, .w = 8, .c = 8, .kh = 2, .kw = 2, .stride_h = 2, .stride_w = 2},
      {.n = 2, .h = 6, .w = 5, .c = 3, .kh = 3, .kw = 2, .stride_h = 1, .stride_w = 1, .pad_h = 1, .pad_w = 0},
      {.n = 2, .h = 7, .w = 7, .c = 9, .kh = 1, .kw = 2, .stride_h = 3, .stride_w = 3},
      {.n = 2, .h = 8, .w = 7, .c = 91, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1}};
  for (const Pool2dShape& s : shapes) {
    INFO(s.to_string());
    auto x = random_vector(in_size(s), 41);
    for (std::size_t i = 0; i < x.size(); i += 3) x[i] = 0.5f;  // ties: one input wins several windows
    const auto dy = random_vector(out_size(s), 42);
    std::vector<float> y(out_size(s)), dx(in_size(s), 7.0f);
    std::vector<std::int32_t> arg(out_size(s));
    max_pool_forward(ctx, s, x.data(), y.data(), arg.data());
    max_pool_backward(ctx, s, dy.data(), arg.data(), dx.data());
    const std::vector<float> scatter = scatter_max_grad(s, dy, arg);
    REQUIRE(dx.size() == scatter.size());
    CHECK(std::memcmp(dx.data(), scatter.data(), dx.size() * sizeof(float)) == 0);
  }
}

// A gradient of 4 MiB or more, 64-byte aligned, is written with streaming stores (Note
// [Streaming stores] in core/cpu/simd_impl.h); the same call on a buffer 16 bytes off that
// alignment takes the plain stores. Both give the scatter's bits, for max and for average pooling.
TEST_CASE("pool gradients written with streaming stores equal the plain stores' bit for bit", "[cpu][pool]") {
  CpuContext ctx(2);
  const Pool2dShape s{.n = 64, .h = 32, .w = 32, .c = 64, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1};
  REQUIRE(in_size(s) * sizeof(float) >= std::size_t{4} << 20);
  const auto x = random_vector(in_size(s), 43);
  const auto dy = random_vector(out_size(s), 44);
  std::vector<float> y(out_size(s));
  std::vector<std::int32_t> arg(out_size(s));
  max_pool_forward(ctx, s, x.data(), y.data(), arg.data());
  const std::vector<float> scatter = scatter_max_grad(s, dy, arg);
  // One buffer, 64-byte aligned, with room for the 16-byte offset.
  const std::size_t bytes = (in_size(s) + 16) * sizeof(float);
  std::unique_ptr<float[], void (*)(float*)> buffer(
      static_cast<float*>(::operator new[](bytes, std::align_val_t{64})),
      [](float* p) { ::operator delete[](p, std::align_val_t{64}); });
  for (const std::size_t offset : {std::size_t{0}, std::size_t{4}}) {
    INFO("dx " << offset * sizeof(float) << " bytes past a 64-byte boundary");
    float* dx = buffer.get() + offset;
    std::fill(dx, dx + in_size(s), 7.0f);
    max_pool_backward(ctx, s, dy.data(), arg.data(), dx);
    CHECK(std::memcmp(dx, scatter.data(), scatter.size() * sizeof(float)) == 0);
  }
  std::vector<float> avg_plain(in_size(s));
  avg_pool_backward(ctx, s, dy.data(), buffer.get() + 4);
  std::memcpy(avg_plain.data(), buffer.get() + 4, avg_plain.size() * sizeof(float));
  float* avg_streamed = buffer.get();
  avg_pool_backward(ctx, s, dy.data(), avg_streamed);
  CHECK(std::memcmp(avg_streamed, avg_plain.data(), avg_plain.size() * sizeof(float)) == 0);
  // And against the definition: the corner pixel lies in one window only, and gets its dy / 9.
  CHECK(avg_streamed[0] == dy[0] * (1.0f / 9.0f));
}

// The forward's argmax, 4 MiB here, is written with streaming stores where its buffer is 64-byte
// aligned (Note [Streaming the argmax] in pool.cc) and with plain ones where it is not: the
// reference's positions either way, with and without the ReLU.
TEST_CASE("max pool argmax written with streaming stores equals the reference's", "[cpu][pool]") {
  CpuContext ctx(2);
  const Pool2dShape s{.n = 64, .h = 32, .w = 32, .c = 64, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1};
  REQUIRE(out_size(s) * sizeof(std::int32_t) >= std::size_t{1} << 20);
  const auto x = random_vector(in_size(s), 45);
  std::vector<double> want;
  std::vector<std::int32_t> want_arg;
  ref_max_pool(s, x, want, want_arg);
  std::vector<std::int32_t> want_relu_arg = want_arg;
  for (std::size_t o = 0; o < want.size(); ++o)
    if (!(want[o] > 0.0)) want_relu_arg[o] = -1;
  const std::size_t bytes = (out_size(s) + 16) * sizeof(std::int32_t);
  std::unique_ptr<std::int32_t[], void (*)(std::int32_t*)> buffer(
      static_cast<std::int32_t*>(::operator new[](bytes, std::align_val_t{64})),
      [](std::int32_t* p) { ::operator delete[](p, std::align_val_t{64}); });
  std::vector<float> y(out_size(s));
  for (const std::size_t offset : {std::size_t{0}, std::size_t{4}}) {
    INFO("argmax " << offset * sizeof(std::int32_t) << " bytes past a 64-byte boundary");
    std::int32_t* arg = buffer.get() + offset;
    std::fill(arg, arg + out_size(s), -7);
    max_pool_forward(ctx, s, x.data(), y.data(), arg);
    CHECK(std::equal(arg, arg + out_size(s), want_arg.begin()));
    std::fill(arg, arg + out_size(s), -7);
    max_pool_relu_forward(ctx, s, x.data(), y.data(), arg);
    CHECK(std::equal(arg, arg + out_size(s), want_relu_arg.begin()));
  }
}

// max_pool_backward_channel_sums: dx as max_pool_backward writes it, bit for bit, and per channel
// the sum of dx over every pixel, against a sum in double of the dx max_pool_backward wrote, within
// the float rounding of a row's sums; the sums' bits the same for 1, 2 and 3 threads. tfcnn's pool1
// at a batch whose gradient takes the streaming stores, and odd shapes whose blocks of 1024 pixels
// end inside a row, with channels outside the vector groups; NaN and infinities in dy.
TEST_CASE("max pool gradient's channel sums are the sums of its dx, the same bits for any thread count", "[cpu][pool]") {
  const Pool2dShape shapes[] = {
      {.n = 16, .h = 32, .w = 32, .c = 64, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1},
      {.n = 37, .h = 9, .w = 7, .c = 19, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1},
      {.n = 5, .h = 30, .w = 27, .c = 40, .kh = 2, .kw = 2, .stride_h = 2, .stride_w = 2},
      {.n = 1, .h = 3, .w = 5, .c = 3, .kh = 3, .kw = 3, .stride_h = 1, .stride_w = 1, .pad_h = 1, .pad_w = 1}};
  for (const Pool2dShape& s : shapes) {
    INFO(s.to_string());
    auto x = random_vector(in_size(s), 61);
    for (std::size_t i = 0; i < x.size(); i += 3) x[i] = -0.25f;  // ties, and ReLU zeros
    auto dy = random_vector(out_size(s), 62);
    std::vector<float> y(out_size(s));
    std::vector<std::int32_t> arg(out_size(s));
    CpuContext one(1);
    max_pool_relu_forward(one, s, x.data(), y.data(), arg.data());
    for (const bool special : {false, true}) {
      INFO((special ? "NaN and infinities in dy" : "finite dy"));
      if (special) {
        dy[1] = NAN;
        dy[dy.size() / 2] = std::numeric_limits<float>::infinity();
      }
      std::vector<float> dx(in_size(s));
      max_pool_backward(one, s, dy.data(), arg.data(), dx.data());
      std::vector<double> want(static_cast<std::size_t>(s.c)), magnitude(static_cast<std::size_t>(s.c));
      for (std::size_t i = 0; i < dx.size(); ++i) {
        want[i % s.c] += dx[i];
        magnitude[i % s.c] += std::abs(dx[i]);
      }
      std::vector<float> first;
      for (int threads : {1, 2, 3}) {
        INFO(threads << " threads");
        CpuContext ctx(threads);
        // 64-byte aligned, as the streaming stores need.
        std::unique_ptr<float[], void (*)(float*)> fused_dx(
            static_cast<float*>(::operator new[](in_size(s) * sizeof(float), std::align_val_t{64})),
            [](float* p) { ::operator delete[](p, std::align_val_t{64}); });
        std::vector<float> sums(static_cast<std::size_t>(s.c), 7.0f);
        max_pool_backward_channel_sums(ctx, s, dy.data(), arg.data(), fused_dx.get(), sums.data());
        CHECK(std::memcmp(fused_dx.get(), dx.data(), dx.size() * sizeof(float)) == 0);
        for (int ch = 0; ch < s.c; ++ch) {
          INFO("channel " << ch << ": " << sums[ch] << ", want " << want[ch]);
          if (std::isnan(want[ch]) || std::isinf(want[ch])) {
            CHECK(std::isnan(sums[ch]) == std::isnan(want[ch]));
            CHECK(std::isinf(sums[ch]) == std::isinf(want[ch]));
          } else {
            // A row's float sum rounds at most w times, by half an ulp of its magnitude each.
            CHECK(std::abs(sums[ch] - want[ch]) <= 1e-7 * s.w * magnitude[ch] + 1e-30);
          }
        }
        if (first.empty()) first = sums;
        CHECK(std::memcmp(sums.data(), first.data(), sums.size() * sizeof(float)) == 0);
      }
    }
  }
}

// max_pool_backward_rows: each span of rows max_pool_backward's bits, and each row's channel sums
// a float sum over its pixels in pixel order (an independent loop over those dx); with and
// without the sums, over spans that cross images; rows outside the batch refused.
TEST_CASE("max pool gradient a few rows at a time: max_pool_backward's rows and each row's sums", "[cpu][pool]") {
  const Pool2dShape shapes[] = {
      {.n = 3, .h = 32, .w = 32, .c = 64, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1},
      {.n = 4, .h = 9, .w = 7, .c = 19, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1},
      {.n = 2, .h = 10, .w = 27, .c = 40, .kh = 2, .kw = 2, .stride_h = 2, .stride_w = 2},
      {.n = 2, .h = 3, .w = 5, .c = 3, .kh = 3, .kw = 3, .stride_h = 1, .stride_w = 1, .pad_h = 1, .pad_w = 1}};
  for (const Pool2dShape& s : shapes) {
    INFO(s.to_string());
    auto x = random_vector(in_size(s), 71);
    for (std::size_t i = 0; i < x.size(); i += 3) x[i] = -0.25f;  // ties, and ReLU zeros
    const auto dy = random_vector(out_size(s), 72);
    std::vector<float> y(out_size(s)), dx(in_size(s));
    std::vector<std::int32_t> arg(out_size(s));
    CpuContext ctx(2);
    max_pool_relu_forward(ctx, s, x.data(), y.data(), arg.data());
    max_pool_backward(ctx, s, dy.data(), arg.data(), dx.data());
    const std::int64_t rows = std::int64_t{s.n} * s.h, row_size = std::int64_t{s.w} * s.c;
    for (const std::int64_t span : {std::int64_t{1}, std::int64_t{4}, rows}) {
      INFO("spans of " << span << " rows");
      for (std::int64_t r0 = 0; r0 < rows; r0 += span) {
        const std::int64_t r1 = std::min(rows, r0 + span);
        std::vector<float> got(static_cast<std::size_t>((r1 - r0) * row_size), 7.0f), plain(got.size(), 7.0f);
        std::vector<float> sums(static_cast<std::size_t>((r1 - r0) * s.c), 7.0f);
        max_pool_backward_rows(s, dy.data(), arg.data(), r0, r1, got.data(), sums.data());
        max_pool_backward_rows(s, dy.data(), arg.data(), r0, r1, plain.data(), nullptr);
        CHECK(std::memcmp(got.data(), dx.data() + r0 * row_size, got.size() * sizeof(float)) == 0);
        CHECK(plain == got);
        for (std::int64_t r = r0; r < r1; ++r)
          for (int ch = 0; ch < s.c; ++ch) {
            float want = 0.0f;
            for (int iw = 0; iw < s.w; ++iw) want += dx[(r * s.w + iw) * s.c + ch];
            INFO("row " << r << ", channel " << ch);
            CHECK(std::bit_cast<std::uint32_t>(sums[(r - r0) * s.c + ch]) == std::bit_cast<std::uint32_t>(want));
          }
      }
    }
    std::vector<float> buf(static_cast<std::size_t>(row_size));
    CHECK_THROWS_AS(max_pool_backward_rows(s, dy.data(), arg.data(), rows, rows + 1, buf.data(), nullptr),
                    towerflow::InternalError);
  }
}

// max_pool_relu_forward against the two passes it fuses, bit for bit: y = relu(max pool), argmax
// the pool's where y > 0 and -1 elsewhere; and max_pool_backward over that argmax against
// max_pool_backward of relu_backward's (y > 0 ? dy : 0) over the pool's. Inputs with NaN, ties and
// zeros, and channel counts that use every channel group.
TEST_CASE("max pool with its ReLU in one pass equals the pool and the ReLU one after the other, bit for bit", "[cpu][pool]") {
  CpuContext ctx(2);
  const Pool2dShape shapes[] = {
      {.n = 3, .h = 9, .w = 7, .c = 19, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1},
      {.n = 2, .h = 8, .w = 8, .c = 8, .kh = 2, .kw = 2, .stride_h = 2, .stride_w = 2},
      {.n = 2, .h = 8, .w = 7, .c = 91, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1},
      {.n = 2, .h = 6, .w = 5, .c = 3, .kh = 3, .kw = 2, .stride_h = 1, .stride_w = 1, .pad_h = 1, .pad_w = 0}};
  for (const Pool2dShape& s : shapes) {
    INFO(s.to_string());
    auto x = random_vector(in_size(s), 51);
    for (std::size_t i = 0; i < x.size(); i += 3) x[i] = -0.25f;  // ties, below zero
    for (std::size_t i = 11; i < x.size(); i += 53) x[i] = NAN;
    for (std::size_t i = 17; i < x.size(); i += 41) x[i] = 0.0f;
    const auto dy = random_vector(out_size(s), 52);

    std::vector<float> y(out_size(s)), fused_y(out_size(s));
    std::vector<std::int32_t> arg(out_size(s)), fused_arg(out_size(s), -7);
    max_pool_forward(ctx, s, x.data(), y.data(), arg.data());
    max_pool_relu_forward(ctx, s, x.data(), fused_y.data(), fused_arg.data());
    std::size_t zeroed = 0, passing = 0;
    for (std::size_t o = 0; o < y.size(); ++o) {
      if (y[o] < 0.0f) {
        y[o] = 0.0f;  // relu_forward's rule; NaN stays
        ++zeroed;
      }
      if (y[o] > 0.0f) ++passing;
      INFO("output " << o << ", relu'd value " << y[o]);
      CHECK(fused_arg[o] == (y[o] > 0.0f ? arg[o] : -1));
    }
    CHECK(zeroed > 0);
    CHECK(passing > 0);
    REQUIRE(fused_y.size() == y.size());
    CHECK(std::memcmp(fused_y.data(), y.data(), y.size() * sizeof(float)) == 0);

    std::vector<float> masked(dy.size()), dx(in_size(s)), fused_dx(in_size(s), 7.0f);
    for (std::size_t o = 0; o < dy.size(); ++o) masked[o] = y[o] > 0.0f ? dy[o] : 0.0f;
    max_pool_backward(ctx, s, masked.data(), arg.data(), dx.data());
    max_pool_backward(ctx, s, dy.data(), fused_arg.data(), fused_dx.data());
    CHECK(std::memcmp(fused_dx.data(), dx.data(), dx.size() * sizeof(float)) == 0);

    // With y stored as bf16 bits: the float y rounded to nearest even, NaN kept (as a quiet NaN
    // of the same sign), the same argmax.
    std::vector<std::uint16_t> y16(out_size(s), 0x1234);
    std::vector<std::int32_t> arg16(out_size(s), -7);
    max_pool_relu_forward_bf16(ctx, s, x.data(), y16.data(), arg16.data());
    CHECK(arg16 == fused_arg);
    std::size_t nans = 0, mismatches = 0;
    for (std::size_t o = 0; o < y.size(); ++o) {
      std::uint32_t b;
      std::memcpy(&b, &y[o], sizeof b);
      const bool nan = std::isnan(y[o]);
      nans += nan;
      const std::uint16_t want = nan ? static_cast<std::uint16_t>((b >> 16) | 0x40u)
                                     : static_cast<std::uint16_t>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
      if (y16[o] != want && mismatches++ < 5) FAIL_CHECK("output " << o << ": " << y16[o] << ", want " << want << " from " << y[o]);
    }
    CHECK(mismatches == 0);
    CHECK(nans > 0);
  }
}

TEST_CASE("pooling results are identical for 1 and 3 threads", "[cpu][pool]") {
  CpuContext one(1), three(3);
  const Pool2dShape s{.n = 7, .h = 32, .w = 32, .c = 64, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1};
  const auto x = random_vector(in_size(s), 5);
  const auto dy = random_vector(out_size(s), 6);
  std::vector<float> results[2][4];
  const CpuContext* ctxs[2] = {&one, &three};
  for (int t = 0; t < 2; ++t) {
    auto& r = results[t];
    r[0].resize(out_size(s));
    r[1].resize(in_size(s));
    r[2].resize(out_size(s));
    r[3].resize(in_size(s));
    std::vector<std::int32_t> arg(out_size(s));
    max_pool_forward(*ctxs[t], s, x.data(), r[0].data(), arg.data());
    max_pool_backward(*ctxs[t], s, dy.data(), arg.data(), r[1].data());
    avg_pool_forward(*ctxs[t], s, x.data(), r[2].data());
    avg_pool_backward(*ctxs[t], s, dy.data(), r[3].data());
  }
  for (int k = 0; k < 4; ++k) CHECK(results[0][k] == results[1][k]);
}

TEST_CASE("pooling rejects impossible shapes with the field named", "[cpu][pool]") {
  CpuContext ctx(1);
  std::vector<float> buf(1024);
  auto message = [&](Pool2dShape s) -> std::string {
    try {
      avg_pool_forward(ctx, s, buf.data(), buf.data());
    } catch (const towerflow::InvalidArgument& e) {
      CHECK_THROWS_AS(max_pool_forward(ctx, s, buf.data(), buf.data(), nullptr),
                      towerflow::InvalidArgument);
      return e.what();
    }
    return "no exception";
  };
  const Pool2dShape ok{.n = 1, .h = 4, .w = 4, .c = 2, .kh = 2, .kw = 2, .stride_h = 2, .stride_w = 2};
  Pool2dShape s = ok;
  s.stride_w = 0;
  CHECK_THAT(message(s), Catch::Contains("stride_w = 0"));
  s = ok;
  s.c = 0;
  CHECK_THAT(message(s), Catch::Contains("c = 0"));
  s = ok;
  s.pad_h = 2;
  CHECK_THAT(message(s), Catch::Contains("more than half the window"));
  s = ok;
  s.kh = 7;
  s.pad_h = 1;
  CHECK_THAT(message(s), Catch::Contains("larger than the padded input"));
  s = ok;
  s.n = 1 << 20;
  s.h = s.w = 64;
  CHECK_THAT(message(s), Catch::Contains("more than 2^31"));
}
