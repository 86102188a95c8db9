#include "data/open.h"

#include "core/error.h"
#include "core/log.h"

namespace towerflow::data {

namespace fs = std::filesystem;

DatasetKind parse_dataset_kind(std::string_view name) {
  if (name == "cifar10") return DatasetKind::Cifar10;
  if (name == "cifar100") return DatasetKind::Cifar100;
  if (name == "folder" || name == "imagefolder") return DatasetKind::Folder;
  if (name == "builtin" || name == "synthetic") return DatasetKind::Builtin;
  raise<InvalidArgument>("unknown dataset '", name, "'; use one of cifar10, cifar100, folder, builtin");
}

std::string_view to_string(DatasetKind kind) {
  switch (kind) {
    case DatasetKind::Cifar10: return "cifar10";
    case DatasetKind::Cifar100: return "cifar100";
    case DatasetKind::Folder: return "folder";
    case DatasetKind::Builtin: return "builtin";
  }
  return "?";
}

DatasetKind detect_dataset_kind(const fs::path& dir) {
  if (dir.empty()) return DatasetKind::Builtin;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    raise<NotFound>("data directory '", dir.string(), "' does not exist; give a CIFAR-10/100 binary folder or an ",
                    "image folder, or no directory for the built-in synthetic set");
  auto holds = [&](const fs::path& d, std::initializer_list<const char*> names) {
    for (const char* n : names)
      if (fs::is_regular_file(d / n, ec)) return true;
    return false;
  };
  if (holds(dir, {"data_batch_1.bin", "test_batch.bin"}) ||
      holds(dir / "cifar-10-batches-bin", {"data_batch_1.bin", "test_batch.bin"}))
    return DatasetKind::Cifar10;
  if (holds(dir, {"train.bin", "test.bin"}) || holds(dir / "cifar-100-binary", {"train.bin", "test.bin"}))
    return DatasetKind::Cifar100;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.is_directory()) return DatasetKind::Folder;
  raise<DataError>("data directory '", dir.string(), "' matches no dataset layout: expected CIFAR-10 binary ",
                   "(data_batch_1.bin .. test_batch.bin), CIFAR-100 binary (train.bin, test.bin) or an image ",
                   "folder (<class>/<image>.jpg); name the dataset's kind (DatasetKind) instead of detecting it");
}

std::unique_ptr<Dataset> open_dataset(DatasetKind kind, const fs::path& dir, Split split,
                                      const DatasetOptions& options) {
  switch (kind) {
    case DatasetKind::Cifar10: return std::make_unique<Cifar10>(dir, split);
    case DatasetKind::Cifar100: return std::make_unique<Cifar100>(dir, split, options.cifar100);
    case DatasetKind::Builtin: return std::make_unique<Builtin>(split, options.builtin);
    case DatasetKind::Folder: {
      std::error_code ec;
      if (!fs::is_directory(dir, ec))
        raise<NotFound>("image folder '", dir.string(), "' does not exist; expected ", dir.string(),
                        "/<class>/<image>.jpg (or train/ and test/ folders laid out that way)");
      const bool has_splits = fs::is_directory(dir / "train", ec) || fs::is_directory(dir / "test", ec);
      if (!has_splits) {
        log_info(str("image folder '", dir.string(), "' has no train/ or test/ sub-folder; using it for the ",
                     to_string(split), " split"));
        return std::make_unique<ImageFolder>(dir, options.folder);
      }
      const fs::path sub = dir / std::string(to_string(split));
      if (!fs::is_directory(sub, ec))
        raise<NotFound>("image folder '", dir.string(), "' has no ", to_string(split), "/ sub-folder for the ",
                        to_string(split), " split; expected ", sub.string(), "/<class>/<image>.jpg");
      return std::make_unique<ImageFolder>(sub, options.folder);
    }
  }
  raise<InvalidArgument>("unknown dataset kind");
}

}  // namespace towerflow::data
