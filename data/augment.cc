#include "data/augment.h"

#include <algorithm>

#include "core/error.h"
#include "data/rng.h"

namespace towerflow::data {

Augment cifar_augment(int cutout) {
  return Augment{.crop_padding = 4, .flip = true, .cutout = cutout};
}

Augment eval_transform() { return Augment{}; }

Augmenter::Augmenter(const Augment& augment, ImageShape shape) : augment_(augment), shape_(shape) {
  if (shape.c != 3)
    raise<InvalidArgument>("augmentation expects 3-channel (RGB) images, the dataset has ", shape.c, " channels");
  if (augment.crop_padding < 0 || augment.crop_padding > std::max(shape.h, shape.w))
    raise<InvalidArgument>("crop padding ", augment.crop_padding, " is out of range for ", shape.h, "x", shape.w,
                           " images; use 0 (no crop) .. ", std::max(shape.h, shape.w), " (4 is usual for 32x32)");
  if (augment.cutout < 0 || augment.cutout > std::max(shape.h, shape.w))
    raise<InvalidArgument>("cutout size ", augment.cutout, " is out of range for ", shape.h, "x", shape.w,
                           " images; use 0 (off) .. ", std::max(shape.h, shape.w), " (16 is usual for CIFAR-10)");
  for (int c = 0; c < 3; ++c) {
    if (!(augment.std[c] > 0.0f))
      raise<InvalidArgument>("normalisation std[", c, "] = ", augment.std[c], " must be > 0");
    for (int v = 0; v < 256; ++v) lut_[c][v] = (v / 255.0f - augment.mean[c]) / augment.std[c];
  }
}

AugmentChoice Augmenter::choose(std::uint64_t seed, std::int64_t epoch, std::int64_t index) const {
  // Always draw in the same order, whatever is enabled, so turning one option on does not change
  // the others' choices.
  SampleRng rng(seed, RngStream::Augment, static_cast<std::uint64_t>(epoch), static_cast<std::uint64_t>(index));
  const auto span = static_cast<std::uint32_t>(2 * augment_.crop_padding + 1);
  AugmentChoice ch;
  ch.dy = static_cast<int>(rng.below(span));
  ch.dx = static_cast<int>(rng.below(span));
  ch.flip = rng.coin() && augment_.flip;
  const int cy = static_cast<int>(rng.below(static_cast<std::uint32_t>(shape_.h)));
  const int cx = static_cast<int>(rng.below(static_cast<std::uint32_t>(shape_.w)));
  if (augment_.cutout > 0) {
    ch.cut_y = cy;
    ch.cut_x = cx;
  }
  return ch;
}

void Augmenter::apply(const std::uint8_t* src, float* dst, const AugmentChoice& ch) const {
  const int h = shape_.h, w = shape_.w, pad = augment_.crop_padding;
  const float zero[3] = {lut_[0][0], lut_[1][0], lut_[2][0]};  // what a padding pixel becomes
  for (int y = 0; y < h; ++y) {
    const int sy = y + ch.dy - pad;
    float* out = dst + static_cast<std::size_t>(y) * w * 3;
    if (sy < 0 || sy >= h) {
      for (int x = 0; x < w; ++x) std::copy_n(zero, 3, out + 3 * x);
      continue;
    }
    const std::uint8_t* row = src + static_cast<std::size_t>(sy) * w * 3;
    // Output column x reads source column sx = (flip ? w-1-x : x) + dx - pad.
    for (int x = 0; x < w; ++x) {
      const int sx = (ch.flip ? w - 1 - x : x) + ch.dx - pad;
      float* o = out + 3 * x;
      if (sx < 0 || sx >= w) {
        std::copy_n(zero, 3, o);
      } else {
        const std::uint8_t* p = row + 3 * sx;
        o[0] = lut_[0][p[0]];
        o[1] = lut_[1][p[1]];
        o[2] = lut_[2][p[2]];
      }
    }
  }
  if (ch.cut_y >= 0) {
    const int half = augment_.cutout / 2;
    const int y0 = std::max(0, ch.cut_y - half), y1 = std::min(h, ch.cut_y - half + augment_.cutout);
    const int x0 = std::max(0, ch.cut_x - half), x1 = std::min(w, ch.cut_x - half + augment_.cutout);
    for (int y = y0; y < y1; ++y)
      std::fill(dst + (static_cast<std::size_t>(y) * w + x0) * 3, dst + (static_cast<std::size_t>(y) * w + x1) * 3,
                0.0f);
  }
}

}  // namespace towerflow::data
