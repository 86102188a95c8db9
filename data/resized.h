#pragma once
// Resized: another dataset's images at another size (bilinear, image_codec.h's resize_bilinear),
// for inputs of a size the data does not have (cifar10_train --image_size 64 on CIFAR's 32x32).
// An image folder resizes as it decodes (ImageFolderOptions); this is for the sets that do not.
//
// Contract: item i is the parent's item i resized to {height, width}; the parent must outlive it;
// as thread-safe as the parent. InvalidArgument for a size below 1x1.

#include <memory>
#include <string>

#include "data/dataset.h"

namespace towerflow::data {

class Resized : public Dataset {
 public:
  Resized(const Dataset& parent, int height, int width);
  // Owning its parent.
  Resized(std::unique_ptr<const Dataset> parent, int height, int width);

  std::int64_t size() const override { return parent_.size(); }
  int num_classes() const override { return parent_.num_classes(); }
  const std::vector<std::string>& class_names() const override { return parent_.class_names(); }
  ImageShape shape() const override { return shape_; }
  std::int32_t read(std::int64_t i, std::span<std::uint8_t> out) const override;
  std::int32_t label(std::int64_t i) const override { return parent_.label(i); }
  std::string describe() const override;

 private:
  std::unique_ptr<const Dataset> owned_;  // declared first: parent_ may refer to it
  const Dataset& parent_;
  ImageShape shape_;
};

}  // namespace towerflow::data
