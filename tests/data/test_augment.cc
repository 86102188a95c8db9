#include <catch2/catch.hpp>

#include <cmath>
#include <map>

#include "core/error.h"
#include "data/augment.h"
#include "data/rng.h"
#include "tests/data/helpers.h"

using namespace towerflow;
using namespace towerflow::data;
using testing::require_throws_mentioning;

namespace {

constexpr ImageShape kShape{32, 32, 3};

std::vector<std::uint8_t> random_image(std::uint64_t seed) {
  SampleRng rng(seed, RngStream::Augment, 999);
  std::vector<std::uint8_t> img(kShape.bytes());
  for (auto& v : img) v = static_cast<std::uint8_t>(rng.below(256));
  return img;
}

// The reference: pad the image with zeros into (h+2p) x (w+2p), crop at (dy, dx), flip, normalise,
// cut out; written the slow, obvious way.
std::vector<float> reference(const std::vector<std::uint8_t>& src, const Augment& a, const AugmentChoice& ch) {
  const int h = kShape.h, w = kShape.w, p = a.crop_padding;
  std::vector<int> padded(static_cast<std::size_t>((h + 2 * p) * (w + 2 * p) * 3), 0);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) padded[((y + p) * (w + 2 * p) + x + p) * 3 + c] = src[(y * w + x) * 3 + c];
  std::vector<float> out(kShape.bytes());
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      const int cx = ch.flip ? w - 1 - x : x;
      for (int c = 0; c < 3; ++c) {
        const int v = padded[((y + ch.dy) * (w + 2 * p) + cx + ch.dx) * 3 + c];
        float f = (static_cast<float>(v) / 255.0f - a.mean[c]) / a.std[c];
        if (ch.cut_y >= 0 && y >= ch.cut_y - a.cutout / 2 && y < ch.cut_y - a.cutout / 2 + a.cutout &&
            x >= ch.cut_x - a.cutout / 2 && x < ch.cut_x - a.cutout / 2 + a.cutout)
          f = 0.0f;
        out[(y * w + x) * 3 + c] = f;
      }
    }
  return out;
}

float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

}  // namespace

TEST_CASE("Augmentation matches a pad-crop-flip-normalise-cutout reference for many samples", "[data][augment]") {
  const Augment a = cifar_augment(/*cutout=*/12);
  const Augmenter aug(a, kShape);
  float worst = 0;
  for (int i = 0; i < 200; ++i) {
    const auto img = random_image(static_cast<std::uint64_t>(i));
    const AugmentChoice ch = aug.choose(7, 3, i);
    std::vector<float> out(kShape.bytes());
    aug.apply(img.data(), out.data(), ch);
    worst = std::max(worst, max_diff(out, reference(img, a, ch)));
  }
  INFO("max abs error " << worst);
  CHECK(worst < 1e-5f);
}

TEST_CASE("Crop offsets stay within the padding and cover it uniformly, flips are fair", "[data][augment]") {
  const Augmenter aug(cifar_augment(), kShape);
  std::map<int, int> dy_count, dx_count;
  int flips = 0;
  const int n = 9000;
  for (int i = 0; i < n; ++i) {
    const auto ch = aug.choose(1, 0, i);
    REQUIRE(ch.dy >= 0);
    REQUIRE(ch.dy <= 8);
    REQUIRE(ch.dx >= 0);
    REQUIRE(ch.dx <= 8);
    CHECK(ch.cut_y == -1);
    ++dy_count[ch.dy];
    ++dx_count[ch.dx];
    flips += ch.flip;
  }
  CHECK(dy_count.size() == 9);
  CHECK(dx_count.size() == 9);
  for (int v = 0; v <= 8; ++v) {  // 1000 expected each; 5 sigma is about 150
    CHECK(std::abs(dy_count[v] - 1000) < 160);
    CHECK(std::abs(dx_count[v] - 1000) < 160);
  }
  CHECK(std::abs(flips - n / 2) < 250);

  // A crop is a shifted copy: every output pixel is the source pixel at the offset, or padding.
  const auto img = random_image(5);
  std::vector<float> out(kShape.bytes());
  const auto ch = aug.choose(1, 0, 17);
  aug.apply(img.data(), out.data(), ch);
  int padding = 0;
  for (int y = 0; y < 32; ++y)
    for (int x = 0; x < 32; ++x) {
      const int sx = (ch.flip ? 31 - x : x) + ch.dx - 4, sy = y + ch.dy - 4;
      const bool inside = sx >= 0 && sx < 32 && sy >= 0 && sy < 32;
      padding += !inside;
      for (int c = 0; c < 3; ++c)
        REQUIRE(out[(y * 32 + x) * 3 + c] == aug.normalise(c, inside ? img[(sy * 32 + sx) * 3 + c] : 0));
    }
  CHECK(padding == 32 * 32 - (32 - std::abs(ch.dy - 4)) * (32 - std::abs(ch.dx - 4)));
}

TEST_CASE("A horizontal flip is an involution: the flipped crop mirrored back is the unflipped one", "[data][augment]") {
  const Augmenter aug(cifar_augment(), kShape);
  const auto img = random_image(11);
  for (int dx : {0, 3, 8}) {
    AugmentChoice plain{.dy = 2, .dx = dx, .flip = false};
    AugmentChoice flipped{.dy = 2, .dx = dx, .flip = true};  // crop, then mirror
    std::vector<float> a(kShape.bytes()), b(kShape.bytes());
    aug.apply(img.data(), a.data(), plain);
    aug.apply(img.data(), b.data(), flipped);
    for (int y = 0; y < 32; ++y)
      for (int x = 0; x < 32; ++x)
        for (int c = 0; c < 3; ++c) REQUIRE(a[(y * 32 + x) * 3 + c] == b[(y * 32 + 31 - x) * 3 + c]);
  }
  // And with no padding, flipping twice returns the original (mirror the mirror).
  const Augmenter no_pad(Augment{.flip = true}, kShape);
  std::vector<float> once(kShape.bytes()), base(kShape.bytes());
  no_pad.apply(img.data(), base.data(), AugmentChoice{});
  no_pad.apply(img.data(), once.data(), AugmentChoice{.flip = true});
  std::vector<float> twice(kShape.bytes());
  for (int y = 0; y < 32; ++y)
    for (int x = 0; x < 32; ++x)
      for (int c = 0; c < 3; ++c) twice[(y * 32 + x) * 3 + c] = once[(y * 32 + 31 - x) * 3 + c];
  CHECK(twice == base);
}

TEST_CASE("Normalisation with a set's own statistics gives zero mean and unit variance", "[data][augment]") {
  // Per-channel pixels with different distributions.
  const int n = 64;
  std::vector<std::vector<std::uint8_t>> images;
  double sum[3] = {}, sq[3] = {};
  for (int i = 0; i < n; ++i) {
    SampleRng rng(3, RngStream::Augment, i);
    std::vector<std::uint8_t> img(kShape.bytes());
    for (int p = 0; p < 1024; ++p) {
      img[3 * p + 0] = static_cast<std::uint8_t>(rng.below(256));
      img[3 * p + 1] = static_cast<std::uint8_t>(100 + rng.below(50));
      img[3 * p + 2] = static_cast<std::uint8_t>(rng.below(2) * 255);
    }
    for (int p = 0; p < 1024; ++p)
      for (int c = 0; c < 3; ++c) {
        const double v = img[3 * p + c] / 255.0;
        sum[c] += v;
        sq[c] += v * v;
      }
    images.push_back(std::move(img));
  }
  Augment a;
  const double count = n * 1024.0;
  for (int c = 0; c < 3; ++c) {
    a.mean[c] = static_cast<float>(sum[c] / count);
    a.std[c] = static_cast<float>(std::sqrt(sq[c] / count - a.mean[c] * a.mean[c]));
  }
  const Augmenter aug(a, kShape);
  double osum[3] = {}, osq[3] = {};
  std::vector<float> out(kShape.bytes());
  for (const auto& img : images) {
    aug.apply(img.data(), out.data(), 0, 0, 0);
    for (int p = 0; p < 1024; ++p)
      for (int c = 0; c < 3; ++c) {
        osum[c] += out[3 * p + c];
        osq[c] += out[3 * p + c] * out[3 * p + c];
      }
  }
  for (int c = 0; c < 3; ++c) {
    INFO("channel " << c);
    CHECK(std::abs(osum[c] / count) < 1e-4);
    CHECK(std::abs(osq[c] / count - 1.0) < 1e-3);
  }
  // The default statistics are CIFAR-10's.
  CHECK(Augment{}.mean == kCifar10Mean);
  CHECK(Augmenter(Augment{}, kShape).normalise(0, 255) == Approx((1.0f - 0.4914f) / 0.2470f));
}

TEST_CASE("Cutout zeroes a square clipped at the edges, centred anywhere", "[data][augment]") {
  const Augmenter aug(Augment{.cutout = 8}, kShape);
  const std::vector<std::uint8_t> img(kShape.bytes(), 200);
  std::map<bool, int> clipped;
  for (int i = 0; i < 300; ++i) {
    const auto ch = aug.choose(0, 0, i);
    REQUIRE(ch.cut_y >= 0);
    REQUIRE(ch.cut_y < 32);
    REQUIRE(ch.cut_x < 32);
    std::vector<float> out(kShape.bytes());
    aug.apply(img.data(), out.data(), ch);
    const int zeros = static_cast<int>(std::count(out.begin(), out.end(), 0.0f));
    const int rows = std::min(32, ch.cut_y + 4) - std::max(0, ch.cut_y - 4);
    const int cols = std::min(32, ch.cut_x + 4) - std::max(0, ch.cut_x - 4);
    REQUIRE(zeros == rows * cols * 3);
    ++clipped[rows * cols < 64];
  }
  CHECK(clipped[true] > 0);   // some squares cross an edge
  CHECK(clipped[false] > 0);  // and some do not
}

TEST_CASE("Augmentation choices depend only on (seed, epoch, index)", "[data][augment]") {
  const Augmenter aug(cifar_augment(16), kShape);
  auto same = [](const AugmentChoice& a, const AugmentChoice& b) {
    return a.dy == b.dy && a.dx == b.dx && a.flip == b.flip && a.cut_y == b.cut_y && a.cut_x == b.cut_x;
  };
  int differ_epoch = 0, differ_seed = 0;
  for (int i = 0; i < 100; ++i) {
    CHECK(same(aug.choose(5, 2, i), aug.choose(5, 2, i)));
    differ_epoch += !same(aug.choose(5, 2, i), aug.choose(5, 3, i));
    differ_seed += !same(aug.choose(5, 2, i), aug.choose(6, 2, i));
  }
  CHECK(differ_epoch > 90);
  CHECK(differ_seed > 90);
  // Turning cutout on does not change the crop and flip choices.
  const Augmenter no_cutout(cifar_augment(), kShape);
  for (int i = 0; i < 50; ++i) {
    const auto a = aug.choose(1, 1, i), b = no_cutout.choose(1, 1, i);
    CHECK((a.dy == b.dy && a.dx == b.dx && a.flip == b.flip));
  }
}

TEST_CASE("Bad augmentation options are InvalidArguments naming the value", "[data][augment]") {
  require_throws_mentioning<InvalidArgument>([] { Augmenter(Augment{.crop_padding = -1}, kShape); },
                                             {"crop padding -1"});
  require_throws_mentioning<InvalidArgument>([] { Augmenter(Augment{.cutout = 40}, kShape); }, {"cutout size 40"});
  require_throws_mentioning<InvalidArgument>([] { Augmenter(Augment{.std = {1, 0, 1}}, kShape); }, {"std[1] = 0"});
  require_throws_mentioning<InvalidArgument>([] { Augmenter(Augment{}, ImageShape{32, 32, 1}); }, {"1 channels"});
}
