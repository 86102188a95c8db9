#pragma once
// Dataset: a fixed, indexable collection of labelled images, the loader's only input.
//
// Contract: every item has the same shape(); read(i, out) writes item i as uint8 HWC
// (shape().bytes() bytes) and returns its label in [0, num_classes()). read() is const and
// thread-safe: the loader's workers call it concurrently. Files are validated when the dataset
// is opened, so a corrupt file is reported before training starts (image folders decode lazily;
// see ImageFolderOptions::validate). Errors: NotFound for missing paths, DataError for corrupt
// or mismatched files, InvalidArgument for bad options; each message names the file and the fix.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace towerflow::data {

enum class Split { Train, Test };
std::string_view to_string(Split split);

struct ImageShape {
  int h = 0, w = 0, c = 0;
  std::size_t bytes() const { return static_cast<std::size_t>(h) * w * c; }
  bool operator==(const ImageShape&) const = default;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual std::int64_t size() const = 0;
  virtual int num_classes() const = 0;
  virtual const std::vector<std::string>& class_names() const = 0;
  virtual ImageShape shape() const = 0;
  // Writes item i (0 <= i < size()) into out (at least shape().bytes() bytes) as uint8 HWC.
  virtual std::int32_t read(std::int64_t i, std::span<std::uint8_t> out) const = 0;
  // The label alone (cheap; no pixels are touched).
  virtual std::int32_t label(std::int64_t i) const = 0;
  // For messages: "CIFAR-10 train (50000 images from /data/cifar-10-batches-bin)".
  virtual std::string describe() const = 0;
};

}  // namespace towerflow::data
