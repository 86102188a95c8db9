#pragma once
// The safetensors format: what checkpoints are made of, readable by PyTorch as they are
// (`safetensors.torch.load_file`).
//
// Layout: an 8-byte little-endian header length N, N bytes of JSON, then the data buffer. The
// JSON maps each tensor name to {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}
// (offsets relative to the data buffer) and may hold "__metadata__", a map of strings.
//
// Contract:
// - serialize_safetensors() writes tensors sorted by element size (largest first) then name, with
//   the header padded by spaces so the data buffer starts 8-byte aligned, like the Python writer.
//   Duplicate names, a name "__metadata__", or a data span whose size is not shape x dtype size
//   raise InvalidArgument naming the tensor.
// - SafetensorsFile::parse() validates the whole file before returning: header length within the
//   file, JSON syntax, each entry's dtype, shape and offsets, offsets that tile the data buffer
//   exactly (no overlap, no gap, nothing past the end), metadata values that are strings. Any
//   violation raises DataError naming the file, the tensor or field, what was found and what
//   was expected. A returned file is always consistent.
// - Checksums: a file may record a CRC-32C (io/crc32c.h) of each tensor's bytes in its metadata
//   (with_checksums(); towerflow checkpoints do): key "towerflow.crc32c.<tensor name>", value 8
//   lowercase hex digits ("e3069283"). PyTorch's reader ignores metadata, so such a file loads
//   there as any other. When the metadata holds any such key, parse() also requires one for every
//   tensor and none for a tensor the file lacks, and computes every tensor's checksum: a mismatch
//   raises DataError naming the file, the tensor, the recorded and the computed checksum, and the
//   fix. A file without checksum keys (written before they existed, or by another writer) parses
//   as before; checksummed() tells which it was.
// - load_into() checks every destination slot against the file (presence, dtype, shape, and in
//   strict mode no unexpected tensor) and only then copies; on DataError no slot was written.
// Objects are immutable after construction and may be read from several threads.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace towerflow::io {

enum class DType { F64, F32, F16, BF16, I64, I32, I16, I8, U64, U32, U16, U8, BOOL };

std::string_view to_string(DType dtype);  // "F32", as safetensors spells it
std::size_t dtype_size(DType dtype);      // bytes per element
// Parses a safetensors dtype name; InvalidArgument listing the known names otherwise.
DType parse_dtype(std::string_view name);

using Metadata = std::map<std::string, std::string>;
using Shape = std::vector<std::int64_t>;

std::string shape_string(const Shape& shape);  // "[16, 3, 3, 3]"
std::int64_t numel_of(const Shape& shape);

// A tensor to write: the bytes must stay valid during the call that takes it.
struct TensorView {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  std::span<const std::byte> data;
};

// A destination for loading: data must be exactly numel x dtype_size bytes.
struct TensorSlot {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  std::span<std::byte> data;
};

// The metadata key of a tensor's checksum: kChecksumKeyPrefix + name.
inline constexpr std::string_view kChecksumKeyPrefix = "towerflow.crc32c.";
// `metadata` plus a checksum key for every tensor (replacing any already there).
Metadata with_checksums(std::span<const TensorView> tensors, Metadata metadata);

std::string serialize_safetensors(std::span<const TensorView> tensors, const Metadata& metadata = {});

// serialize_safetensors() then write_file_atomically().
void save_safetensors(const std::filesystem::path& path, std::span<const TensorView> tensors,
                      const Metadata& metadata = {});

class SafetensorsFile {
 public:
  struct Entry {
    std::string name;
    DType dtype = DType::F32;
    Shape shape;
    std::size_t begin = 0;  // offsets into the data buffer
    std::size_t end = 0;
  };

  // Reads and validates a file (NotFound if missing, DataError if corrupt).
  static SafetensorsFile load(const std::filesystem::path& path);
  // Validates bytes already in memory; `source` names them in messages.
  static SafetensorsFile parse(std::string bytes, std::string source);

  const std::string& source() const { return source_; }
  const std::vector<Entry>& entries() const { return entries_; }  // in data-buffer order
  const Metadata& metadata() const { return metadata_; }
  // True when the file records checksums (then parse() verified every tensor against them).
  bool checksummed() const { return checksummed_; }
  const Entry* find(std::string_view name) const;  // nullptr if absent
  // The entry; NotFound naming the file and the tensor if absent.
  const Entry& at(std::string_view name) const;
  std::span<const std::byte> data(const Entry& entry) const;

 private:
  void verify_checksums();  // Note [Checksums in the metadata]

  std::string source_;
  std::string bytes_;
  std::size_t data_start_ = 0;
  std::vector<Entry> entries_;
  Metadata metadata_;
  bool checksummed_ = false;
};

struct LoadOptions {
  // Only file tensors whose names start with prefix take part; the prefix is stripped before
  // matching slot names.
  std::string prefix = {};
  // Every file tensor (under prefix) must have a slot: a checkpoint with extra tensors is not
  // the model it claims to be.
  bool strict = true;
  // Names of the destination in messages: "the model resnet20".
  std::string destination = "the destination";
};

void load_into(const SafetensorsFile& file, std::span<const TensorSlot> slots,
               const LoadOptions& options = {});

}  // namespace towerflow::io
