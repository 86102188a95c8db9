#pragma once
// open_dataset: one entry point for the trainer's --dataset cifar10|cifar100|folder|builtin.
//
// For `folder`, `dir` is the root of an image-folder tree; when it holds train/ and test/
// sub-folders (as the CIFAR-10 JPEG release does) the split picks one, otherwise the root itself is
// used for either split. `dir` is ignored for `builtin`. Throws InvalidArgument for an unknown
// kind and whatever the dataset's constructor throws.

#include <filesystem>
#include <memory>
#include <string_view>

#include "data/builtin.h"
#include "data/cifar.h"
#include "data/dataset.h"
#include "data/image_folder.h"

namespace towerflow::data {

enum class DatasetKind { Cifar10, Cifar100, Folder, Builtin };

// "cifar10", "cifar100", "folder" (or "imagefolder"), "builtin" (or "synthetic").
DatasetKind parse_dataset_kind(std::string_view name);
std::string_view to_string(DatasetKind kind);

// For --dataset auto: builtin for an empty `dir`; cifar10 when `dir` (or dir/cifar-10-batches-bin)
// holds data_batch_1.bin or test_batch.bin; cifar100 when it (or dir/cifar-100-binary) holds
// train.bin or test.bin; folder when it has sub-folders. NotFound for a folder that does not
// exist, DataError for one that matches no layout (listing the layouts expected).
DatasetKind detect_dataset_kind(const std::filesystem::path& dir);

struct DatasetOptions {
  Cifar100Options cifar100 = {};
  ImageFolderOptions folder = {};
  BuiltinOptions builtin = {};
};

std::unique_ptr<Dataset> open_dataset(DatasetKind kind, const std::filesystem::path& dir, Split split,
                                      const DatasetOptions& options = {});

}  // namespace towerflow::data
