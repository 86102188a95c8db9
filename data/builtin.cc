#include "data/builtin.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "data/rng.h"

namespace towerflow::data {

namespace {

struct Rgb {
  float r, g, b;
};

Rgb hsv(float h, float s, float v) {
  h = h - std::floor(h);
  const float x = h * 6.0f;
  const int sector = static_cast<int>(x) % 6;
  const float f = x - std::floor(x);
  const float p = v * (1 - s), q = v * (1 - s * f), t = v * (1 - s * (1 - f));
  switch (sector) {
    case 0: return {v, t, p};
    case 1: return {q, v, p};
    case 2: return {p, v, t};
    case 3: return {p, q, v};
    case 4: return {t, p, v};
    default: return {v, p, q};
  }
}

// Whether the point (u, v), in the shape's own frame where the shape spans about [-1, 1], is in
// the shape of class k.
bool inside(int k, float u, float v) {
  const float au = std::fabs(u), av = std::fabs(v), r2 = u * u + v * v;
  switch (k) {
    case 0: return r2 <= 1.0f;                                            // disc
    case 1: return au <= 0.8f && av <= 0.8f;                              // square
    case 2: return r2 <= 1.0f && r2 >= 0.4f;                              // ring
    case 3: return (au <= 0.28f && av <= 1.0f) || (av <= 0.28f && au <= 1.0f);  // plus
    case 4: return au <= 1.0f && av <= 1.0f && static_cast<int>(std::floor((v + 1) * 2.5f)) % 2 == 0;  // h-bars
    case 5: return au <= 1.0f && av <= 1.0f && static_cast<int>(std::floor((u + 1) * 2.5f)) % 2 == 0;  // v-bars
    case 6: return v >= -0.8f && v <= 0.9f && au <= (v + 0.8f) * 0.6f;   // triangle, apex up
    case 7: return au <= 1.0f && av <= 1.0f && std::fabs(au - av) <= 0.3f;  // diagonal cross
    case 8: return au <= 1.0f && av <= 1.0f &&
                   (static_cast<int>(std::floor((u + 1) * 2)) + static_cast<int>(std::floor((v + 1) * 2))) % 2 == 0;
    default: return au <= 1.0f && av <= 1.0f && (au >= 0.65f || av >= 0.65f);  // frame
  }
}

void draw(std::int32_t k, SampleRng& rng, std::uint8_t* out) {
  // Background: a random, mostly grey colour.
  const Rgb bg = hsv(rng.uniform(), 0.25f * rng.uniform(), 0.2f + 0.6f * rng.uniform());
  // Foreground: hue centred on the class's, jittered by up to +-0.15 (classes are 0.1 apart).
  const float hue = k / 10.0f + 0.3f * (rng.uniform() - 0.5f);
  Rgb fg = hsv(hue, 0.5f + 0.5f * rng.uniform(), 0.5f + 0.5f * rng.uniform());
  // Keep the shape visible against the background.
  const float contrast = (fg.r + fg.g + fg.b) - (bg.r + bg.g + bg.b);
  if (std::fabs(contrast) < 0.45f) {
    const float shift = contrast >= 0 ? 0.3f : -0.3f;
    fg = {std::clamp(fg.r + shift, 0.f, 1.f), std::clamp(fg.g + shift, 0.f, 1.f), std::clamp(fg.b + shift, 0.f, 1.f)};
  }
  const float scale = 7.0f + 5.0f * rng.uniform();          // half-size in pixels
  const float cx = 15.5f + 10.0f * (rng.uniform() - 0.5f);  // +-5 px
  const float cy = 15.5f + 10.0f * (rng.uniform() - 0.5f);
  const float angle = 0.5f * (rng.uniform() - 0.5f);        // +-0.25 rad
  const bool flip = rng.coin();
  const float ca = std::cos(angle), sa = std::sin(angle);
  const float noise = 0.06f + 0.08f * rng.uniform();
  for (int y = 0; y < 32; ++y) {
    for (int x = 0; x < 32; ++x) {
      const float dx = (x - cx) / scale, dy = (cy - y) / scale;  // v points up
      float u = ca * dx + sa * dy;
      const float v = -sa * dx + ca * dy;
      if (flip) u = -u;
      const Rgb base = inside(k, u, v) ? fg : bg;
      std::uint8_t* px = out + (y * 32 + x) * 3;
      const float value[3] = {base.r, base.g, base.b};
      for (int ch = 0; ch < 3; ++ch) {
        const float p = value[ch] + noise * (2.0f * rng.uniform() - 1.0f);
        px[ch] = static_cast<std::uint8_t>(std::lround(std::clamp(p, 0.0f, 1.0f) * 255.0f));
      }
    }
  }
}

}  // namespace

Builtin::Builtin(Split split, BuiltinOptions options) {
  const std::int64_t n = split == Split::Train ? options.train_size : options.test_size;
  if (n <= 0 || n > (std::int64_t{1} << 24))
    raise<InvalidArgument>("built-in dataset ", to_string(split), " size ", n,
                           " is out of range; use 1 .. 16777216 images");
  const RngStream stream = split == Split::Train ? RngStream::BuiltinTrain : RngStream::BuiltinTest;
  pixels_.resize(static_cast<std::size_t>(n) * 3072);
  labels_.resize(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const auto k = static_cast<std::int32_t>(i % kClasses);
    SampleRng rng(options.seed, stream, static_cast<std::uint64_t>(i));
    labels_[static_cast<std::size_t>(i)] = k;
    draw(k, rng, pixels_.data() + static_cast<std::size_t>(i) * 3072);
  }
  description_ = str("built-in synthetic ", to_string(split), " (", n, " images, seed ", options.seed, ")");
}

const std::vector<std::string>& Builtin::class_names() const {
  static const std::vector<std::string> names = {"disc",  "square",   "ring",      "plus",    "hbars",
                                                  "vbars", "triangle", "diagonals", "checker", "frame"};
  return names;
}

std::int32_t Builtin::read(std::int64_t i, std::span<std::uint8_t> out) const {
  TW_CHECK(i >= 0 && i < size(), "item ", i, " out of range for ", description_);
  TW_CHECK(out.size() >= 3072u, "output of ", out.size(), " bytes is too small");
  std::copy_n(pixels_.begin() + i * 3072, 3072, out.begin());
  return labels_[static_cast<std::size_t>(i)];
}

}  // namespace towerflow::data
