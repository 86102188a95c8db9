#pragma once
// Subset: some items of another dataset, by index; holdout: a validation set kept out of a
// training set.
//
//   auto [train, val] = tw::data::holdout(cifar_train, 0.1, /*seed=*/1);   // 45000 and 5000 images
//   tw::train::fit(trainer, sgd, train, &test, {.validation_set = &val, ...});
//
// Contract: a Subset reads through to its parent (which must outlive it), item i being the
// parent's item indices()[i]; it is as thread-safe as the parent. holdout() is stratified: of each
// class's n items, round(fraction * n) go to the validation set, chosen by a shuffle that is a pure
// function of (seed, class), so the same seed holds out the same images on every machine and in
// every process; both subsets keep the parent's order. InvalidArgument for a fraction outside
// (0, 1) or one that leaves either side without an image.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/dataset.h"

namespace towerflow::data {

class Subset : public Dataset {
 public:
  // `what` names the subset in describe(): "training part", "validation part".
  Subset(const Dataset& parent, std::vector<std::int64_t> indices, std::string what);

  std::int64_t size() const override { return static_cast<std::int64_t>(indices_.size()); }
  int num_classes() const override { return parent_.num_classes(); }
  const std::vector<std::string>& class_names() const override { return parent_.class_names(); }
  ImageShape shape() const override { return parent_.shape(); }
  std::int32_t read(std::int64_t i, std::span<std::uint8_t> out) const override;
  std::int32_t label(std::int64_t i) const override;
  std::string describe() const override;

  const std::vector<std::int64_t>& indices() const { return indices_; }

 private:
  const Dataset& parent_;
  std::vector<std::int64_t> indices_;
  std::string what_;
};

struct Holdout {
  std::unique_ptr<Subset> train;
  std::unique_ptr<Subset> validation;
};
Holdout holdout(const Dataset& set, double fraction, std::uint64_t seed);

}  // namespace towerflow::data
