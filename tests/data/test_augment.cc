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

// The reference: pad the image with zeros into (h+2p) x (w+2p) (or, for PadMode::Reflect, copy the
// image into the middle, mirror each row's first and last p columns about its edge pixels, then
// mirror whole padded rows, corners included, about the first and last image rows), crop at
// (dy, dx), flip, normalise, cut out; written the slow, obvious way.
std::vector<float> reference(const std::vector<std::uint8_t>& src, const Augment& a, const AugmentChoice& ch) {
  const int h = kShape.h, w = kShape.w, p = a.crop_padding, pw = w + 2 * p;
  std::vector<int> padded(static_cast<std::size_t>((h + 2 * p) * pw * 3), 0);
  auto at = [&](int py, int px, int c) -> int& { return padded[static_cast<std::size_t>((py * pw + px) * 3 + c)]; };
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) at(y + p, x + p, c) = src[(y * w + x) * 3 + c];
  if (a.pad_mode == PadMode::Reflect) {
    for (int py = p; py < p + h; ++py)
      for (int k = 1; k <= p; ++k)
        for (int c = 0; c < 3; ++c) {
          at(py, p - k, c) = at(py, p + k, c);
          at(py, p + w - 1 + k, c) = at(py, p + w - 1 - k, c);
        }
    for (int k = 1; k <= p; ++k)
      for (int px = 0; px < pw; ++px)
        for (int c = 0; c < 3; ++c) {
          at(p - k, px, c) = at(p + k, px, c);
          at(p + h - 1 + k, px, c) = at(p + h - 1 - k, px, c);
        }
  }
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
  Augment a = cifar_augment(/*cutout=*/12);
  for (PadMode pad : {PadMode::Zeros, PadMode::Reflect}) {
    a.pad_mode = pad;
    a.flip_mode = pad == PadMode::Reflect ? FlipMode::Alternating : FlipMode::Random;
    const Augmenter aug(a, kShape);
    float worst = 0;
    for (int i = 0; i < 200; ++i) {
      const auto img = random_image(static_cast<std::uint64_t>(i));
      const AugmentChoice ch = aug.choose(7, 3, i);
      std::vector<float> out(kShape.bytes());
      aug.apply(img.data(), out.data(), ch);
      worst = std::max(worst, max_diff(out, reference(img, a, ch)));
    }
    INFO((pad == PadMode::Reflect ? "reflect" : "zero") << " padding: max abs error " << worst);
    CHECK(worst < 1e-5f);
  }
}

TEST_CASE("Reflect padding mirrors about the edge pixel without repeating it, as PyTorch does", "[data][augment]") {
  // A 4x4 image with distinct pixels: (y, x, c) holds 10 * (4y + x) + c.
  constexpr ImageShape small{4, 4, 3};
  std::vector<std::uint8_t> img(small.bytes());
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 4; ++x)
      for (int c = 0; c < 3; ++c) img[(y * 4 + x) * 3 + c] = static_cast<std::uint8_t>(10 * (4 * y + x) + c);
  const Augmenter aug(Augment{.crop_padding = 2, .pad_mode = PadMode::Reflect, .flip = true}, small);
  auto pixel = [&](const std::vector<float>& out, int y, int x, int c) { return out[(y * 4 + x) * 3 + c]; };

  // By hand: with padding 2, padded coordinate 0..7 reads image row/column 2 1 | 0 1 2 3 | 2 1.
  constexpr int kMirror[8] = {2, 1, 0, 1, 2, 3, 2, 1};
  for (int dy = 0; dy <= 4; ++dy)
    for (int dx = 0; dx <= 4; ++dx)
      for (bool flip : {false, true}) {
        std::vector<float> out(small.bytes());
        aug.apply(img.data(), out.data(), AugmentChoice{.dy = dy, .dx = dx, .flip = flip});
        for (int y = 0; y < 4; ++y)
          for (int x = 0; x < 4; ++x)
            for (int c = 0; c < 3; ++c) {
              const int sy = kMirror[y + dy], sx = kMirror[(flip ? 3 - x : x) + dx];
              INFO("dy " << dy << " dx " << dx << " flip " << flip << " at (" << y << ", " << x << ", " << c << ")");
              REQUIRE(pixel(out, y, x, c) == aug.normalise(c, img[(sy * 4 + sx) * 3 + c]));
            }
      }

  // From PyTorch 2.15: F.pad(image as 1x3x4x4, (2, 2, 2, 2), mode='reflect'), cropped at [dy:dy+4,
  // dx:dx+4], then .flip(-1) where flip is set; printed as HWC rows.
  struct Fixture {
    int dy, dx;
    bool flip;
    int hwc[4][12];
  };
  const Fixture fixtures[] = {
      {0, 3, false, {{90, 91, 92, 100, 101, 102, 110, 111, 112, 100, 101, 102},
                     {50, 51, 52, 60, 61, 62, 70, 71, 72, 60, 61, 62},
                     {10, 11, 12, 20, 21, 22, 30, 31, 32, 20, 21, 22},
                     {50, 51, 52, 60, 61, 62, 70, 71, 72, 60, 61, 62}}},
      {4, 1, false, {{90, 91, 92, 80, 81, 82, 90, 91, 92, 100, 101, 102},
                     {130, 131, 132, 120, 121, 122, 130, 131, 132, 140, 141, 142},
                     {90, 91, 92, 80, 81, 82, 90, 91, 92, 100, 101, 102},
                     {50, 51, 52, 40, 41, 42, 50, 51, 52, 60, 61, 62}}},
      {1, 4, true, {{50, 51, 52, 60, 61, 62, 70, 71, 72, 60, 61, 62},
                    {10, 11, 12, 20, 21, 22, 30, 31, 32, 20, 21, 22},
                    {50, 51, 52, 60, 61, 62, 70, 71, 72, 60, 61, 62},
                    {90, 91, 92, 100, 101, 102, 110, 111, 112, 100, 101, 102}}},
  };
  for (const Fixture& f : fixtures) {
    std::vector<float> out(small.bytes());
    aug.apply(img.data(), out.data(), AugmentChoice{.dy = f.dy, .dx = f.dx, .flip = f.flip});
    for (int y = 0; y < 4; ++y)
      for (int x = 0; x < 4; ++x)
        for (int c = 0; c < 3; ++c) {
          INFO("PyTorch fixture dy " << f.dy << " dx " << f.dx << " at (" << y << ", " << x << ", " << c << ")");
          REQUIRE(pixel(out, y, x, c) == aug.normalise(c, static_cast<std::uint8_t>(f.hwc[y][x * 3 + c])));
        }
  }

  // A non-square image reflects each axis about its own edges; padding 2 < 3 rows is allowed.
  constexpr ImageShape wide{3, 5, 3};
  std::vector<std::uint8_t> w(wide.bytes());
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<std::uint8_t>(i);
  const Augmenter wide_aug(Augment{.crop_padding = 2, .pad_mode = PadMode::Reflect}, wide);
  std::vector<float> out(wide.bytes());
  wide_aug.apply(w.data(), out.data(), AugmentChoice{.dy = 0, .dx = 4});
  // Output row 0 is image row 2 (padded row -2); output columns 0..4 are image columns 2 3 4 3 2.
  constexpr int kCols[5] = {2, 3, 4, 3, 2};
  for (int x = 0; x < 5; ++x)
    for (int c = 0; c < 3; ++c) REQUIRE(out[x * 3 + c] == wide_aug.normalise(c, w[(2 * 5 + kCols[x]) * 3 + c]));
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

TEST_CASE("Alternating flips: one coin per image, kept in even epochs and inverted in odd ones", "[data][augment]") {
  const Augment alternating{.crop_padding = 2, .pad_mode = PadMode::Reflect, .flip = true,
                            .flip_mode = FlipMode::Alternating, .cutout = 8};
  const Augmenter aug(alternating, kShape), random_flips(cifar_augment(), kShape);
  const int n = 10000;
  int flipped0 = 0, same_as_random = 0, differ_seed = 0;
  for (int i = 0; i < n; ++i) {
    bool f[4];
    for (int e = 0; e < 4; ++e) f[e] = aug.choose(3, e, i).flip;
    // Over any two consecutive epochs the image is seen once flipped and once not.
    REQUIRE(f[0] != f[1]);
    REQUIRE(f[1] != f[2]);
    REQUIRE(f[2] != f[3]);
    // Beyond its parity, the epoch does not matter.
    REQUIRE(aug.choose(3, 1000, i).flip == f[0]);
    REQUIRE(aug.choose(3, 1001, i).flip == f[1]);
    flipped0 += f[0];
    same_as_random += f[0] == random_flips.choose(3, 0, i).flip;
    differ_seed += f[0] != aug.choose(4, 0, i).flip;
  }
  // About half the images start flipped: 5000 expected, sigma 50; 150 is 1.5% of n.
  INFO("flipped in epoch 0: " << flipped0 << ", same as the Random coin: " << same_as_random
                              << ", other seed differs: " << differ_seed);
  CHECK(std::abs(flipped0 - n / 2) < 150);
  // The per-image coin is not the per-epoch one, and another seed gives other coins.
  CHECK(std::abs(same_as_random - n / 2) < 150);
  CHECK(std::abs(differ_seed - n / 2) < 150);

  // The mode changes flips only: crops and cutouts are those of FlipMode::Random.
  Augment random = alternating;
  random.flip_mode = FlipMode::Random;
  const Augmenter per_epoch(random, kShape);
  for (int i = 0; i < 200; ++i) {
    const auto a = aug.choose(3, 5, i), b = per_epoch.choose(3, 5, i);
    REQUIRE((a.dy == b.dy && a.dx == b.dx && a.cut_y == b.cut_y && a.cut_x == b.cut_x));
  }
}

TEST_CASE("Bad augmentation options are InvalidArguments naming the value", "[data][augment]") {
  require_throws_mentioning<InvalidArgument>([] { Augmenter(Augment{.crop_padding = -1}, kShape); },
                                             {"crop padding -1"});
  require_throws_mentioning<InvalidArgument>([] { Augmenter(Augment{.cutout = 40}, kShape); }, {"cutout size 40"});
  require_throws_mentioning<InvalidArgument>([] { Augmenter(Augment{.std = {1, 0, 1}}, kShape); }, {"std[1] = 0"});
  require_throws_mentioning<InvalidArgument>([] { Augmenter(Augment{}, ImageShape{32, 32, 1}); }, {"1 channels"});
  // Reflection needs padding below both sides (the smaller one counts); zeros allow up to the side.
  require_throws_mentioning<InvalidArgument>(
      [] { Augmenter(Augment{.crop_padding = 32, .pad_mode = PadMode::Reflect}, kShape); },
      {"crop padding 32", "Reflect", "0 .. 31", "Zeros"});
  require_throws_mentioning<InvalidArgument>(
      [] { Augmenter(Augment{.crop_padding = 3, .pad_mode = PadMode::Reflect}, ImageShape{3, 5, 3}); },
      {"crop padding 3", "3x5", "0 .. 2"});
  CHECK_NOTHROW(Augmenter(Augment{.crop_padding = 32}, kShape));
  CHECK_NOTHROW(Augmenter(Augment{.crop_padding = 31, .pad_mode = PadMode::Reflect}, kShape));
  require_throws_mentioning<InvalidArgument>([] { Augmenter(Augment{.flip_mode = FlipMode::Alternating}, kShape); },
                                             {"flip_mode Alternating", "flip = true"});
}
