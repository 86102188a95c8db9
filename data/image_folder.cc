#include "data/image_folder.h"

#include <algorithm>
#include <atomic>
#include <fstream>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "data/image_codec.h"

namespace towerflow::data {

namespace fs = std::filesystem;

namespace {

std::vector<std::uint8_t> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) raise<DataError>("cannot open image '", path.string(), "'; check that it exists and is readable");
  const auto size = static_cast<std::size_t>(in.tellg());
  std::vector<std::uint8_t> bytes(size);
  in.seekg(0);
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size));
  if (!in) raise<DataError>("cannot read image '", path.string(), "' in full (", size, " bytes expected)");
  return bytes;
}

const char* kLayout = "expected root/<class>/<image>.jpg|.jpeg|.png, one sub-folder per class";

}  // namespace

ImageFolder::ImageFolder(const fs::path& root, ImageFolderOptions options) : root_(root), options_(options) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) raise<NotFound>("image folder '", root.string(), "' does not exist; ", kLayout);
  if (options_.height < 0 || options_.width < 0 || (options_.height == 0) != (options_.width == 0))
    raise<InvalidArgument>("image folder size ", options_.height, "x", options_.width,
                           " is invalid; give both height and width (> 0), or neither to use the first image's size");
  if (options_.cache && !options_.validate)
    raise<InvalidArgument>("image folder option cache = true needs validate = true (caching decodes at open time)");

  for (const auto& entry : fs::directory_iterator(root, fs::directory_options::follow_directory_symlink))
    if (entry.is_directory()) class_names_.push_back(entry.path().filename().string());
  std::sort(class_names_.begin(), class_names_.end());
  if (class_names_.empty()) raise<DataError>("image folder '", root.string(), "' has no class sub-folders; ", kLayout);

  std::vector<fs::path> all_files;
  std::vector<std::int32_t> all_labels;
  for (std::size_t c = 0; c < class_names_.size(); ++c) {
    std::vector<fs::path> found;
    for (const auto& entry :
         fs::recursive_directory_iterator(root / class_names_[c], fs::directory_options::follow_directory_symlink))
      if (entry.is_regular_file() && is_image_file(entry.path())) found.push_back(entry.path());
    if (found.empty())
      raise<DataError>("class folder '", (root / class_names_[c]).string(),
                       "' holds no .jpg, .jpeg or .png file; remove the folder or add its images");
    std::sort(found.begin(), found.end());
    for (auto& f : found) {
      all_files.push_back(std::move(f));
      all_labels.push_back(static_cast<std::int32_t>(c));
    }
  }

  if (options_.height > 0) {
    shape_ = {options_.height, options_.width, 3};
  } else {
    const auto bytes = read_bytes(all_files.front());
    const Image header = decode_header(bytes, all_files.front().string());
    shape_ = {header.h, header.w, 3};
  }

  if (!options_.validate) {
    files_ = std::move(all_files);
    labels_ = std::move(all_labels);
    return;
  }

  // Decode everything once, in parallel; keep the reason for each failure, in file order.
  const std::size_t n = all_files.size();
  std::vector<std::string> errors(n);
  std::vector<std::uint8_t> decoded(options_.cache ? n * shape_.bytes() : 0);
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    std::vector<std::uint8_t> scratch(shape_.bytes());
    for (std::size_t i; (i = next.fetch_add(1)) < n;) {
      std::span<std::uint8_t> out = options_.cache ? std::span(decoded).subspan(i * shape_.bytes(), shape_.bytes())
                                                   : std::span(scratch);
      try {
        decode_into(all_files[i], out);
      } catch (const DataError& e) {
        errors[i] = e.what();
      }
    }
  };
  const int threads = std::max(1, options_.threads > 0 ? options_.threads
                                                       : static_cast<int>(std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();

  for (std::size_t i = 0; i < n; ++i) {
    if (errors[i].empty()) {
      if (options_.cache)
        cache_.insert(cache_.end(), decoded.begin() + i * shape_.bytes(), decoded.begin() + (i + 1) * shape_.bytes());
      files_.push_back(all_files[i]);
      labels_.push_back(all_labels[i]);
      continue;
    }
    if (options_.bad_files == BadFilePolicy::Fail)
      raise<DataError>(errors[i], " (in image folder '", root.string(),
                       "'; remove or replace the file, or skip bad files: ImageFolderOptions::bad_files = BadFilePolicy::Skip)");
    skipped_.push_back({all_files[i], errors[i]});
  }
  if (!skipped_.empty())
    log_warning(str("image folder '", root.string(), "': skipped ", skipped_.size(), " of ", n,
                    " files that could not be used; the first: ", skipped_.front().reason));
  if (files_.empty()) raise<DataError>("image folder '", root.string(), "' has no usable image (all ", n, " were bad)");
}

void ImageFolder::decode_into(const fs::path& file, std::span<std::uint8_t> out) const {
  const auto bytes = read_bytes(file);
  Image img = decode_image(bytes, file.string());
  if (img.h != shape_.h || img.w != shape_.w) {
    if (options_.wrong_size == SizePolicy::Reject)
      raise<DataError>("image '", file.string(), "' is ", img.h, "x", img.w, ", expected ", shape_.h, "x", shape_.w,
                       " (size policy: reject; resize instead to accept it)");
    img = resize_bilinear(img, shape_.h, shape_.w);
  }
  std::copy(img.pixels.begin(), img.pixels.end(), out.begin());
}

std::int32_t ImageFolder::read(std::int64_t i, std::span<std::uint8_t> out) const {
  TW_CHECK(i >= 0 && i < size(), "item ", i, " out of range for ", describe());
  TW_CHECK(out.size() >= shape_.bytes(), "output of ", out.size(), " bytes is too small");
  const auto k = static_cast<std::size_t>(i);
  if (!cache_.empty())
    std::copy_n(cache_.begin() + k * shape_.bytes(), shape_.bytes(), out.begin());
  else
    decode_into(files_[k], out);
  return labels_[k];
}

std::string ImageFolder::describe() const {
  return str("image folder ", root_.string(), " (", files_.size(), " images, ", class_names_.size(), " classes, ",
             shape_.h, "x", shape_.w,
             options_.wrong_size == SizePolicy::Resize ? str(": images of another size resized bilinearly to ", shape_.h, "x", shape_.w) : "",
             skipped_.empty() ? "" : str(", ", skipped_.size(), " skipped"), ")");
}

}  // namespace towerflow::data
