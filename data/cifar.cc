#include "data/cifar.h"

#include <fstream>
#include <system_error>

#include "core/error.h"
#include "core/log.h"

namespace towerflow::data {

namespace fs = std::filesystem;

std::string_view to_string(Split split) { return split == Split::Train ? "train" : "test"; }

namespace {

struct Format {
  const char* name;             // "CIFAR-10"
  const char* subdir;           // the folder the release tarball creates
  const char* url;
  const char* tarball;
  std::vector<std::string> train_files, test_files;
  int label_bytes;              // 1 (CIFAR-10) or 2 (CIFAR-100: coarse, fine)
};

const Format& cifar10_format() {
  static const Format f{"CIFAR-10", "cifar-10-batches-bin", "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz",
                        "cifar-10-binary.tar.gz",
                        {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin",
                         "data_batch_5.bin"},
                        {"test_batch.bin"}, 1};
  return f;
}

const Format& cifar100_format() {
  static const Format f{"CIFAR-100", "cifar-100-binary", "https://www.cs.toronto.edu/~kriz/cifar-100-binary.tar.gz",
                        "cifar-100-binary.tar.gz", {"train.bin"}, {"test.bin"}, 2};
  return f;
}

std::string layout_hint(const Format& f, const fs::path& dir) {
  std::string files;
  for (const auto& name : f.train_files) files += (files.empty() ? "" : ", ") + name;
  for (const auto& name : f.test_files) files += ", " + name;
  return str("Download ", f.url, " and unpack it (tar -xzf ", f.tarball, " creates ", f.subdir,
             "/); pass that folder or its parent as the data directory, so that ", (dir / f.subdir).string(),
             " or ", dir.string(), " holds ", files,
             ". To train without any files, use the built-in synthetic set (DatasetKind::Builtin).");
}

// Accepts the folder holding the files or its parent.
fs::path resolve_dir(const Format& f, const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    raise<NotFound>(f.name, " data directory '", dir.string(), "' does not exist. ", layout_hint(f, dir));
  const fs::path first = f.train_files.front();
  if (!fs::exists(dir / first, ec) && fs::is_directory(dir / f.subdir, ec)) return dir / f.subdir;
  return dir;
}

std::vector<std::uint8_t> read_file(const Format& f, const fs::path& dir, const fs::path& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    raise<NotFound>(f.name, " file '", path.string(), "' is missing. ", layout_hint(f, dir));
  const auto bytes = fs::file_size(path, ec);
  if (ec) raise<DataError>(f.name, " file '", path.string(), "' cannot be read: ", ec.message());
  std::vector<std::uint8_t> data(bytes);
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(data.data()), static_cast<std::streamsize>(bytes));
  if (!in || static_cast<std::uint64_t>(in.gcount()) != bytes)
    raise<DataError>(f.name, " file '", path.string(), "' could not be read in full (", in.gcount(), " of ",
                     bytes, " bytes); check the disk and the file's permissions");
  return data;
}

std::vector<std::string> read_names(const fs::path& path, std::size_t expected, std::vector<std::string> fallback) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return fallback;
  std::ifstream in(path);
  std::vector<std::string> names;
  for (std::string line; std::getline(in, line);) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (!line.empty()) names.push_back(line);
  }
  if (names.size() != expected) {
    log_warning(str("class-name file '", path.string(), "' lists ", names.size(), " names, expected ", expected,
                    "; using generic names"));
    return fallback;
  }
  return names;
}

std::vector<std::string> numbered(const char* prefix, int n) {
  std::vector<std::string> names;
  for (int i = 0; i < n; ++i) names.push_back(str(prefix, i));
  return names;
}

// Parses every record of every file. `label_limits[k]` bounds label byte k of each record.
struct Parsed {
  std::vector<std::uint8_t> pixels;
  std::vector<std::vector<std::int32_t>> labels;  // one vector per label byte
};

Parsed parse(const Format& f, const fs::path& dir, Split split, const std::vector<int>& label_limits,
             const std::vector<const char*>& label_names) {
  const auto& files = split == Split::Train ? f.train_files : f.test_files;
  const std::size_t record = f.label_bytes + CifarBinary::kPixelBytes;
  // Check that every file exists before reading any, so a missing one is reported at once.
  for (const auto& name : files) {
    std::error_code ec;
    if (!fs::is_regular_file(dir / name, ec))
      raise<NotFound>(f.name, " file '", (dir / name).string(), "' is missing (", to_string(split),
                      " split). ", layout_hint(f, dir));
  }
  Parsed out;
  out.labels.resize(f.label_bytes);
  for (const auto& name : files) {
    const fs::path path = dir / name;
    const auto data = read_file(f, dir, path);
    if (data.empty() || data.size() % record != 0)
      raise<DataError>(f.name, " file '", path.string(), "' has ", data.size(), " bytes, not a whole number of ",
                       record, "-byte records (", f.label_bytes, " label byte", f.label_bytes > 1 ? "s" : "",
                       " + 3072 pixel bytes): ", data.size() / record, " whole records and ", data.size() % record,
                       " bytes left over from byte offset ", data.size() / record * record,
                       ". The file is truncated, has extra bytes, or is not ", f.name,
                       " binary; download it again (", f.url, ")");
    const std::size_t n = data.size() / record;
    const std::size_t base = out.pixels.size();
    out.pixels.resize(base + n * CifarBinary::kPixelBytes);
    for (std::size_t r = 0; r < n; ++r) {
      const std::uint8_t* rec = data.data() + r * record;
      for (int k = 0; k < f.label_bytes; ++k) {
        if (rec[k] >= label_limits[k])
          raise<DataError>(f.name, " file '", path.string(), "' record ", r, " (byte offset ", r * record + k,
                           ") has ", label_names[k], " ", int(rec[k]), ", expected 0..", label_limits[k] - 1,
                           ". The file is corrupt or not ", f.name, " binary; download it again (", f.url, ")");
        out.labels[k].push_back(rec[k]);
      }
      std::copy_n(rec + f.label_bytes, CifarBinary::kPixelBytes,
                  out.pixels.data() + base + r * CifarBinary::kPixelBytes);
    }
  }
  return out;
}

}  // namespace

std::int32_t CifarBinary::read(std::int64_t i, std::span<std::uint8_t> out) const {
  TW_CHECK(i >= 0 && i < size(), "item ", i, " out of range for ", description_);
  TW_CHECK(out.size() >= static_cast<std::size_t>(kPixelBytes), "output of ", out.size(), " bytes is too small");
  // Planar (CHW) to interleaved (HWC).
  const std::uint8_t* r = pixels_.data() + static_cast<std::size_t>(i) * kPixelBytes;
  const std::uint8_t* g = r + 1024;
  const std::uint8_t* b = g + 1024;
  std::uint8_t* o = out.data();
  for (int p = 0; p < 1024; ++p) {
    o[3 * p + 0] = r[p];
    o[3 * p + 1] = g[p];
    o[3 * p + 2] = b[p];
  }
  return labels_[static_cast<std::size_t>(i)];
}

Cifar10::Cifar10(const fs::path& dir, Split split) {
  const Format& f = cifar10_format();
  dir_ = resolve_dir(f, dir);
  Parsed p = parse(f, dir_, split, {10}, {"label"});
  pixels_ = std::move(p.pixels);
  labels_ = std::move(p.labels[0]);
  class_names_ = read_names(dir_ / "batches.meta.txt", 10,
                            {"airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"});
  description_ = str("CIFAR-10 ", to_string(split), " (", labels_.size(), " images from ", dir_.string(), ")");
}

Cifar100::Cifar100(const fs::path& dir, Split split, Cifar100Options options) {
  const Format& f = cifar100_format();
  dir_ = resolve_dir(f, dir);
  Parsed p = parse(f, dir_, split, {20, 100}, {"coarse label", "fine label"});
  pixels_ = std::move(p.pixels);
  coarse_ = std::move(p.labels[0]);
  fine_ = std::move(p.labels[1]);
  const bool fine = options.labels == Cifar100Labels::Fine;
  labels_ = fine ? fine_ : coarse_;
  class_names_ = fine ? read_names(dir_ / "fine_label_names.txt", 100, numbered("fine_", 100))
                      : read_names(dir_ / "coarse_label_names.txt", 20, numbered("coarse_", 20));
  description_ = str("CIFAR-100 ", to_string(split), " (", labels_.size(), " images, ", fine ? "fine" : "coarse",
                     " labels, from ", dir_.string(), ")");
}

}  // namespace towerflow::data
