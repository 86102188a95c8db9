#pragma once
// ImageFolder: root/<class>/**/*.{jpg,jpeg,png}, as torchvision's ImageFolder lays it out.
//
// Classes are the sub-folders of root sorted by name (byte order), labelled 0, 1, ...; files are
// found recursively in each class folder (symlinks followed), sorted by path, and recognised by
// extension (case-insensitive). Images are decoded to 8-bit RGB (see image_codec.h).
//
// Size: every item has one shape, {height, width, 3}; with height = width = 0 it is the first
// image's. An image of another size is resized (bilinear) or, with SizePolicy::Reject, is a bad
// file.
// Bad files (undecodable, truncated, or rejected for size): with `validate`, every file is decoded
// once when the folder is opened (on `threads` threads); then BadFilePolicy::Fail throws DataError
// naming the first bad path and the reason, and BadFilePolicy::Skip leaves them out, logs a
// warning with their count, and lists them in skipped(). Without `validate` (for folders too large
// to scan), a bad file is found when read() reaches it and throws DataError naming its path.
// Throws NotFound for a missing root, DataError for a root without classes or a class without
// images. read() is thread-safe.

#include <filesystem>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace towerflow::data {

enum class SizePolicy { Resize, Reject };
enum class BadFilePolicy { Fail, Skip };

struct ImageFolderOptions {
  int height = 0, width = 0;                  // 0: the first image's size
  SizePolicy wrong_size = SizePolicy::Resize;
  BadFilePolicy bad_files = BadFilePolicy::Fail;
  bool validate = true;                       // decode every file at open time
  bool cache = false;                         // keep the decoded pixels in memory (needs validate)
  int threads = 0;                            // for validation; 0: all hardware threads
};

struct BadFile {
  std::filesystem::path path;
  std::string reason;
};

class ImageFolder : public Dataset {
 public:
  explicit ImageFolder(const std::filesystem::path& root, ImageFolderOptions options = {});

  std::int64_t size() const override { return static_cast<std::int64_t>(files_.size()); }
  int num_classes() const override { return static_cast<int>(class_names_.size()); }
  const std::vector<std::string>& class_names() const override { return class_names_; }
  ImageShape shape() const override { return shape_; }
  std::int32_t read(std::int64_t i, std::span<std::uint8_t> out) const override;
  std::int32_t label(std::int64_t i) const override { return labels_[static_cast<std::size_t>(i)]; }
  std::string describe() const override;

  const std::filesystem::path& path(std::int64_t i) const { return files_[static_cast<std::size_t>(i)]; }
  const std::vector<BadFile>& skipped() const { return skipped_; }

 private:
  // Decodes file i into out (shape_.bytes()), resizing or rejecting per the options.
  void decode_into(const std::filesystem::path& file, std::span<std::uint8_t> out) const;

  std::filesystem::path root_;
  ImageFolderOptions options_;
  ImageShape shape_;
  std::vector<std::string> class_names_;
  std::vector<std::filesystem::path> files_;
  std::vector<std::int32_t> labels_;
  std::vector<BadFile> skipped_;
  std::vector<std::uint8_t> cache_;  // size() * shape_.bytes() when options_.cache
};

}  // namespace towerflow::data
