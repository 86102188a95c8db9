#pragma once
// Builtin: a synthetic dataset in CIFAR's shape (32x32 RGB, 10 classes), generated from a seed, so
// training runs out of the box with no files.
//
// Each class is a shape (disc, square, ring, cross, horizontal bars, vertical bars, triangle,
// diagonal cross, checkerboard, frame) drawn at a random position, scale and orientation in a
// colour whose hue is centred on a per-class value but jittered so far that colour alone is an
// unreliable cue, over a random low-saturation background with per-pixel noise. A small CNN
// learns it well above chance in a few hundred steps; a nearest-mean classifier on raw pixels
// gets about 40% (colour is a partial cue), so most of the signal is in the shapes. The train and test splits come from different random
// streams of the same seed, so they never share an image. Labels cycle 0..9, so classes are
// balanced. Generation is done once, on construction (about 10 ms per thousand images).

#include <cstdint>

#include "data/dataset.h"

namespace towerflow::data {

struct BuiltinOptions {
  std::int64_t train_size = 5000;
  std::int64_t test_size = 1000;
  std::uint64_t seed = 20261122;
};

class Builtin : public Dataset {
 public:
  explicit Builtin(Split split, BuiltinOptions options = {});

  static constexpr int kClasses = 10;
  std::int64_t size() const override { return static_cast<std::int64_t>(labels_.size()); }
  int num_classes() const override { return kClasses; }
  const std::vector<std::string>& class_names() const override;
  ImageShape shape() const override { return {32, 32, 3}; }
  std::int32_t read(std::int64_t i, std::span<std::uint8_t> out) const override;
  std::int32_t label(std::int64_t i) const override { return labels_[static_cast<std::size_t>(i)]; }
  std::string describe() const override { return description_; }

 private:
  std::vector<std::uint8_t> pixels_;  // HWC
  std::vector<std::int32_t> labels_;
  std::string description_;
};

}  // namespace towerflow::data
