#pragma once
// CIFAR-10 and CIFAR-100 in their binary release formats, held in memory (150 MB for CIFAR-10
// train).
//
//   CIFAR-10  (cifar-10-batches-bin/): data_batch_1.bin .. data_batch_5.bin (train),
//             test_batch.bin (test); records of 1 label byte + 3072 pixel bytes.
//   CIFAR-100 (cifar-100-binary/): train.bin, test.bin; records of 1 coarse label byte +
//             1 fine label byte + 3072 pixel bytes.
// Pixels are stored as planes (1024 R, then G, then B, rows top to bottom); read() returns HWC.
//
// `dir` may be the folder holding the .bin files or its parent (holding cifar-10-batches-bin/ or
// cifar-100-binary/). Opening validates everything and throws:
//   NotFound   the folder or a file is missing (the message says where to get the dataset and
//              how to lay it out);
//   DataError  a file whose size is not a whole number of records, or a label out of range (the
//              message names the file, the record and its byte offset, and what was expected).

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace towerflow::data {

// Shared by both formats: records in memory, decoded to HWC on read().
class CifarBinary : public Dataset {
 public:
  std::int64_t size() const override { return static_cast<std::int64_t>(labels_.size()); }
  int num_classes() const override { return static_cast<int>(class_names_.size()); }
  const std::vector<std::string>& class_names() const override { return class_names_; }
  ImageShape shape() const override { return {32, 32, 3}; }
  std::int32_t read(std::int64_t i, std::span<std::uint8_t> out) const override;
  std::int32_t label(std::int64_t i) const override { return labels_[static_cast<std::size_t>(i)]; }
  std::string describe() const override { return description_; }
  const std::filesystem::path& directory() const { return dir_; }

  static constexpr int kPixelBytes = 3072;

 protected:
  CifarBinary() = default;
  std::filesystem::path dir_;
  std::vector<std::uint8_t> pixels_;   // size() * kPixelBytes, planar, as in the files
  std::vector<std::int32_t> labels_;
  std::vector<std::string> class_names_;
  std::string description_;
};

class Cifar10 : public CifarBinary {
 public:
  Cifar10(const std::filesystem::path& dir, Split split);
};

enum class Cifar100Labels { Fine, Coarse };  // 100 fine classes or 20 superclasses

struct Cifar100Options {
  Cifar100Labels labels = Cifar100Labels::Fine;
};

class Cifar100 : public CifarBinary {
 public:
  Cifar100(const std::filesystem::path& dir, Split split, Cifar100Options options = {});
  // Both labels of item i, whichever one read() returns.
  std::int32_t fine_label(std::int64_t i) const { return fine_[static_cast<std::size_t>(i)]; }
  std::int32_t coarse_label(std::int64_t i) const { return coarse_[static_cast<std::size_t>(i)]; }

 private:
  std::vector<std::int32_t> fine_, coarse_;
};

}  // namespace towerflow::data
