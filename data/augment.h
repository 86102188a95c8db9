#pragma once
// Augmentation and normalisation: uint8 HWC in, normalised float32 HWC out, in one pass.
//
// The order is torchvision's CIFAR recipe: random crop from the image padded with zeros
// (RandomCrop(size, padding)) or mirrored at its edges (PadMode::Reflect), random horizontal flip,
// normalisation ((x/255 - mean) / std per channel), then cutout (a square set to 0 after
// normalisation, centred anywhere in the image and clipped at its edges, as DeVries & Taylor 2017).
// Every random choice is drawn from a generator keyed by (seed, epoch, dataset index), so a
// sample's augmentation in an epoch does not depend on the number of threads, on the batch it
// lands in, or on sharding.
//
// The airbench94 CIFAR-10 recipe (Jordan 2024, arXiv 2404.00498) is
//   Augment{.crop_padding = 2, .pad_mode = PadMode::Reflect, .flip = true,
//           .flip_mode = FlipMode::Alternating}

#include <array>
#include <cstdint>

#include "data/dataset.h"

namespace towerflow::data {

// Per-channel statistics of the CIFAR-10 training set, for pixels scaled to [0, 1].
inline constexpr std::array<float, 3> kCifar10Mean = {0.4914f, 0.4822f, 0.4465f};
inline constexpr std::array<float, 3> kCifar10Std = {0.2470f, 0.2435f, 0.2616f};

// What the random crop's padding holds.
enum class PadMode {
  Zeros,    // black (torchvision's RandomCrop(size, padding)); any padding up to the image side
  Reflect,  // the image mirrored without repeating the edge pixel, as PyTorch's
            // F.pad(mode='reflect'): for padding 2, row -1 is row 1 and row -2 is row 2;
            // the padding must be smaller than the image's height and width
};

// How flip decides, when it is on.
enum class FlipMode {
  Random,       // a fresh coin per (seed, epoch, index)
  Alternating,  // one coin per (seed, index), used in even epochs and inverted in odd ones, so
                // over any two consecutive epochs every image is seen once flipped and once not
                // (airbench's alternating flip)
};

struct Augment {
  int crop_padding = 0;  // random crop of the image's own size from it padded by this much (0: none)
  PadMode pad_mode = PadMode::Zeros;  // what the padding holds (with crop_padding > 0)
  bool flip = false;     // horizontal flip of half the images in each epoch, chosen as flip_mode says
  FlipMode flip_mode = FlipMode::Random;  // Alternating needs flip = true
  int cutout = 0;        // side of the cutout square in pixels (0: none)
  std::array<float, 3> mean = kCifar10Mean;
  std::array<float, 3> std = kCifar10Std;
};

// Training: crop with padding 4, flip, CIFAR-10 normalisation; cutout as given (16 is usual).
Augment cifar_augment(int cutout = 0);
// Evaluation: normalisation only (the default of LoaderOptions).
Augment eval_transform();

// The random choices for one sample, resolved: flip is the decision for this epoch, whatever
// the FlipMode.
struct AugmentChoice {
  int dy = 0, dx = 0;            // crop offset in the padded image, 0..2*crop_padding (uniform)
  bool flip = false;
  int cut_y = -1, cut_x = -1;    // cutout centre, or -1 without cutout
};

// Applies an Augment to images of one shape. Construction validates the options against the
// shape (InvalidArgument: 3 channels expected, std > 0, padding and cutout >= 0 and sensible,
// reflect padding smaller than the image's height and width, FlipMode::Alternating only with
// flip). apply() is const and thread-safe.
class Augmenter {
 public:
  Augmenter(const Augment& augment, ImageShape shape);

  // The choices for sample `index` in `epoch` (>= 0). Turning one option on or off, or changing
  // pad_mode or flip_mode, leaves the other options' choices unchanged.
  AugmentChoice choose(std::uint64_t seed, std::int64_t epoch, std::int64_t index) const;
  // src: shape.bytes() uint8 HWC; dst: shape.bytes() floats HWC.
  void apply(const std::uint8_t* src, float* dst, const AugmentChoice& choice) const;
  void apply(const std::uint8_t* src, float* dst, std::uint64_t seed, std::int64_t epoch,
             std::int64_t index) const {
    apply(src, dst, choose(seed, epoch, index));
  }
  // The value a uint8 pixel v of channel c normalises to.
  float normalise(int c, std::uint8_t v) const { return lut_[c][v]; }

 private:
  Augment augment_;
  ImageShape shape_;
  std::array<std::array<float, 256>, 3> lut_;
};

// Mixing pairs of training images (Zhang et al. 2018, mixup; Yun et al. 2019, CutMix), as
// torchvision's MixUp/CutMix: within each global batch, row g is mixed with row g-1 (the batch
// rolled by one), both augmented as above, with one lambda ~ Beta(alpha, alpha) per batch. Mixup
// blends the images, lambda * own + (1 - lambda) * partner; CutMix pastes the partner's pixels in
// a box of area (1 - lambda) * h * w centred anywhere (clipped at the edges), and lambda becomes
// the share of the image left its own. The targets are lambda * onehot(own label) +
// (1 - lambda) * onehot(partner's). With both alphas set, each batch takes one of the two with
// probability 1/2 (timm's switch). The choice is drawn from (seed, epoch, step), so every rank
// and thread agrees on it and a run is reproducible.
struct MixOptions {
  float mixup_alpha = 0;   // > 0: mixup with lambda ~ Beta(alpha, alpha) (0.2 is usual for CIFAR)
  float cutmix_alpha = 0;  // > 0: CutMix with lambda ~ Beta(alpha, alpha) (1.0 is usual)
  bool any() const { return mixup_alpha > 0 || cutmix_alpha > 0; }
};

struct MixChoice {
  enum class Kind { None, Mixup, CutMix } kind = Kind::None;
  float lambda = 1;            // the weight of each row's own label
  int y0 = 0, x0 = 0, y1 = 0, x1 = 0;  // CutMix: the pasted box, [y0, y1) x [x0, x1)
};

// InvalidArgument for a negative or non-finite alpha.
MixChoice choose_mix(const MixOptions& options, ImageShape shape, std::uint64_t seed, std::int64_t epoch,
                     std::int64_t step);
// Mixes the partner's augmented pixels (HWC floats) into `own` as `choice` says.
void apply_mix(const MixChoice& choice, ImageShape shape, float* own, const float* partner);

}  // namespace towerflow::data
