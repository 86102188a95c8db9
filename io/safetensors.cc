#include "io/safetensors.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/crc32c.h"

namespace towerflow::io {
namespace {

using nlohmann::json;

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  std::size_t size;
};

constexpr std::array<DTypeInfo, 13> kDTypes{{
    {DType::F64, "F64", 8}, {DType::F32, "F32", 4}, {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2}, {DType::I64, "I64", 8}, {DType::I32, "I32", 4},
    {DType::I16, "I16", 2}, {DType::I8, "I8", 1}, {DType::U64, "U64", 8},
    {DType::U32, "U32", 4}, {DType::U16, "U16", 2}, {DType::U8, "U8", 1},
    {DType::BOOL, "BOOL", 1},
}};

// The Python implementation refuses headers above 100 MB; a larger length is a corrupt file.
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

std::string hex_checksum(std::uint32_t c) {
  char text[9];
  std::snprintf(text, sizeof text, "%08x", c);
  return text;
}

std::string known_dtypes() {
  std::string out;
  for (const auto& d : kDTypes) out += (out.empty() ? "" : ", ") + std::string(d.name);
  return out;
}

}  // namespace

std::string_view to_string(DType dtype) {
  for (const auto& d : kDTypes)
    if (d.dtype == dtype) return d.name;
  return "?";
}

std::size_t dtype_size(DType dtype) {
  for (const auto& d : kDTypes)
    if (d.dtype == dtype) return d.size;
  return 0;
}

DType parse_dtype(std::string_view name) {
  for (const auto& d : kDTypes)
    if (d.name == name) return d.dtype;
  raise<InvalidArgument>("unknown safetensors dtype \"", name, "\"; expected one of ", known_dtypes());
}

std::string shape_string(const Shape& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

std::int64_t numel_of(const Shape& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

Metadata with_checksums(std::span<const TensorView> tensors, Metadata metadata) {
  for (const auto& t : tensors) metadata[str(kChecksumKeyPrefix, t.name)] = hex_checksum(crc32c(t.data));
  return metadata;
}

std::string serialize_safetensors(std::span<const TensorView> tensors, const Metadata& metadata) {
  std::vector<const TensorView*> order;
  std::set<std::string_view> names;
  for (const auto& t : tensors) {
    if (t.name == "__metadata__")
      raise<InvalidArgument>("a tensor cannot be named \"__metadata__\" (reserved by safetensors)");
    if (!names.insert(t.name).second)
      raise<InvalidArgument>("tensor \"", t.name, "\" appears twice; tensor names must be unique");
    for (auto d : t.shape)
      if (d < 0) raise<InvalidArgument>("tensor \"", t.name, "\" has a negative dimension in shape ", shape_string(t.shape));
    std::size_t want = static_cast<std::size_t>(numel_of(t.shape)) * dtype_size(t.dtype);
    if (t.data.size() != want)
      raise<InvalidArgument>("tensor \"", t.name, "\": shape ", shape_string(t.shape), " of ",
                             to_string(t.dtype), " needs ", want, " bytes but ", t.data.size(),
                             " were given");
    order.push_back(&t);
  }
  // Largest elements first keeps every tensor naturally aligned inside the 8-aligned buffer.
  std::stable_sort(order.begin(), order.end(), [](const TensorView* a, const TensorView* b) {
    std::size_t sa = dtype_size(a->dtype), sb = dtype_size(b->dtype);
    return sa != sb ? sa > sb : a->name < b->name;
  });

  // Insertion order (metadata, then tensors in buffer order, each dtype/shape/offsets) is the
  // Python writer's order, so files without metadata come out byte for byte identical.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::size_t offset = 0;
  for (const TensorView* t : order) {
    header[t->name] = {{"dtype", to_string(t->dtype)},
                       {"shape", t->shape},
                       {"data_offsets", {offset, offset + t->data.size()}}};
    offset += t->data.size();
  }
  // Metadata is the caller's text (paths, class names): bytes that are not UTF-8 become U+FFFD
  // rather than an exception that would lose the checkpoint.
  std::string text = header.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  text.append((8 - text.size() % 8) % 8, ' ');

  std::string out;
  out.reserve(8 + text.size() + offset);
  std::uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out += text;
  for (const TensorView* t : order)
    out.append(reinterpret_cast<const char*>(t->data.data()), t->data.size());
  return out;
}

void save_safetensors(const std::filesystem::path& path, std::span<const TensorView> tensors,
                      const Metadata& metadata) {
  write_file_atomically(path, serialize_safetensors(tensors, metadata));
}

SafetensorsFile SafetensorsFile::load(const std::filesystem::path& path) {
  return parse(read_file(path), path.string());
}

SafetensorsFile SafetensorsFile::parse(std::string bytes, std::string source) {
  SafetensorsFile f;
  f.source_ = std::move(source);
  const std::string& src = f.source_;
  auto bad = [&](const auto&... parts) -> void {
    raise<DataError>("corrupt safetensors file ", src, ": ", parts...);
  };

  if (bytes.size() < 8)
    bad("it is ", bytes.size(), " bytes long, shorter than the 8-byte header length (truncated?)");
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  if (n > kMaxHeaderBytes) bad("header length ", n, " exceeds the 100 MB limit (not a safetensors file?)");
  if (n > bytes.size() - 8)
    bad("header length ", n, " runs past the end of the ", bytes.size(), "-byte file (truncated?)");
  f.data_start_ = 8 + static_cast<std::size_t>(n);
  const std::size_t buffer_size = bytes.size() - f.data_start_;

  json header;
  try {
    header = json::parse(bytes.begin() + 8, bytes.begin() + static_cast<std::ptrdiff_t>(f.data_start_));
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number like 1E400
    bad("the header is not valid JSON (", e.what(), ")");
  }
  if (!header.is_object()) bad("the header is JSON but not an object");

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) bad("field \"__metadata__\" must be an object of strings");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          bad("metadata field \"", m.key(), "\" is ", m.value().type_name(), ", expected a string");
        f.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!v.is_object()) bad("tensor \"", name, "\": entry is ", v.type_name(), ", expected an object");
    Entry e;
    e.name = name;

    auto dt = v.find("dtype");
    if (dt == v.end() || !dt->is_string()) bad("tensor \"", name, "\": missing or non-string field \"dtype\"");
    try {
      e.dtype = parse_dtype(dt->get<std::string>());
    } catch (const InvalidArgument& ex) {
      bad("tensor \"", name, "\": field \"dtype\": ", ex.what());
    }

    auto sh = v.find("shape");
    if (sh == v.end() || !sh->is_array()) bad("tensor \"", name, "\": missing or non-array field \"shape\"");
    std::uint64_t numel = 1;
    for (const auto& d : *sh) {
      if (!d.is_number_unsigned())
        bad("tensor \"", name, "\": field \"shape\" holds ", d.dump(), ", expected non-negative integers");
      std::uint64_t dim = d.get<std::uint64_t>();
      if (dim > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) ||
          (dim != 0 && numel > std::numeric_limits<std::uint64_t>::max() / dim))
        bad("tensor \"", name, "\": field \"shape\" ", sh->dump(), " overflows");
      numel *= dim;
      e.shape.push_back(static_cast<std::int64_t>(dim));
    }

    auto off = v.find("data_offsets");
    if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned())
      bad("tensor \"", name, "\": field \"data_offsets\" must be [begin, end] with non-negative integers");
    std::uint64_t begin = (*off)[0].get<std::uint64_t>(), end = (*off)[1].get<std::uint64_t>();
    if (begin > end) bad("tensor \"", name, "\": data_offsets [", begin, ", ", end, "] end before they begin");
    if (end > buffer_size)
      bad("tensor \"", name, "\": data_offsets [", begin, ", ", end, "] run past the end of the ",
          buffer_size, "-byte data buffer (truncated file?)");
    std::size_t esize = dtype_size(e.dtype);
    if (numel > std::numeric_limits<std::uint64_t>::max() / esize || numel * esize != end - begin)
      bad("tensor \"", name, "\": shape ", shape_string(e.shape), " of ", to_string(e.dtype),
          " needs ", numel * esize, " bytes but data_offsets [", begin, ", ", end, "] hold ",
          end - begin);
    e.begin = static_cast<std::size_t>(begin);
    e.end = static_cast<std::size_t>(end);
    f.entries_.push_back(std::move(e));
  }

  std::sort(f.entries_.begin(), f.entries_.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::size_t expect = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : f.entries_) {
    if (e.begin < expect)
      bad("tensor \"", e.name, "\": data_offsets [", e.begin, ", ", e.end, "] overlap tensor \"",
          prev->name, "\" [", prev->begin, ", ", prev->end, "]");
    if (e.begin > expect)
      bad("tensor \"", e.name, "\": data_offsets begin at ", e.begin, " leaving a gap after byte ",
          expect, prev ? str(" (the end of tensor \"", prev->name, "\")") : std::string());
    expect = e.end;
    prev = &e;
  }
  if (expect != buffer_size)
    bad("the data buffer holds ", buffer_size, " bytes but the tensors describe ", expect,
        " (extra bytes at the end)");
  f.bytes_ = std::move(bytes);
  f.verify_checksums();
  return f;
}

// Note [Checksums in the metadata]: safetensors has no field for a checksum; a tensor's entry
// holds dtype, shape and data_offsets, and the one place the format leaves for more is
// "__metadata__", a map of strings that readers pass through. So the checksums are metadata
// strings, one per tensor, and the file loads in PyTorch as before (examples/cifar10/check_torch_load.py).
// A file that records any checksum must record all of them: a missing one means the header was
// edited or damaged, which the checksums exist to catch.
void SafetensorsFile::verify_checksums() {
  for (const auto& [key, value] : metadata_) {
    if (!key.starts_with(kChecksumKeyPrefix)) continue;
    checksummed_ = true;
    std::string_view tensor = std::string_view(key).substr(kChecksumKeyPrefix.size());
    if (!find(tensor))
      raise<DataError>("corrupt safetensors file ", source_, ": metadata field \"", key,
                       "\" records the checksum of tensor \"", tensor, "\", which the file does not hold "
                       "(a damaged or edited header); use an earlier checkpoint or copy the file again from an intact source");
  }
  if (!checksummed_) return;
  for (const Entry& e : entries_) {
    auto it = metadata_.find(str(kChecksumKeyPrefix, e.name));
    if (it == metadata_.end())
      raise<DataError>("corrupt safetensors file ", source_, ": it records tensor checksums but none for tensor \"",
                       e.name, "\" (a damaged or edited header); use an earlier checkpoint or copy the file again "
                       "from an intact source");
    const std::string computed = hex_checksum(crc32c(data(e)));
    if (it->second != computed)
      raise<DataError>("corrupt safetensors file ", source_, ": tensor \"", e.name, "\" ", to_string(e.dtype), " ",
                       shape_string(e.shape), " has CRC-32C ", computed, " but the file records ", it->second,
                       " (metadata \"", it->first, "\"): its bytes changed after it was written (a disk or copy "
                       "error); use an earlier checkpoint (a resumed run picks the newest intact one) or copy the file "
                       "again from an intact source");
  }
}

const SafetensorsFile::Entry* SafetensorsFile::find(std::string_view name) const {
  for (const auto& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

const SafetensorsFile::Entry& SafetensorsFile::at(std::string_view name) const {
  if (const Entry* e = find(name)) return *e;
  raise<NotFound>("safetensors file ", source_, " has no tensor \"", name, "\"");
}

std::span<const std::byte> SafetensorsFile::data(const Entry& entry) const {
  return {reinterpret_cast<const std::byte*>(bytes_.data()) + data_start_ + entry.begin,
          entry.end - entry.begin};
}

void load_into(const SafetensorsFile& file, std::span<const TensorSlot> slots, const LoadOptions& options) {
  auto bad = [&](const auto&... parts) -> void {
    raise<DataError>("checkpoint ", file.source(), " does not match ", options.destination, ": ", parts...);
  };
  std::vector<const SafetensorsFile::Entry*> sources;
  sources.reserve(slots.size());
  std::set<std::string> wanted;
  for (const TensorSlot& slot : slots) {
    std::string full = options.prefix + slot.name;
    wanted.insert(full);
    const auto* e = file.find(full);
    if (!e)
      bad("tensor \"", full, "\" (", to_string(slot.dtype), " ", shape_string(slot.shape),
          ") is missing from the file");
    if (e->dtype != slot.dtype)
      bad("tensor \"", full, "\" has dtype ", to_string(e->dtype), " in the file, expected ",
          to_string(slot.dtype));
    if (e->shape != slot.shape)
      bad("tensor \"", full, "\" has shape ", shape_string(e->shape), " in the file, expected ",
          shape_string(slot.shape));
    TW_CHECK(slot.data.size() == e->end - e->begin, "slot \"", slot.name, "\" holds ",
             slot.data.size(), " bytes for ", shape_string(slot.shape), " of ", to_string(slot.dtype));
    sources.push_back(e);
  }
  if (options.strict) {
    std::vector<std::string> extra;
    for (const auto& e : file.entries())
      if (e.name.starts_with(options.prefix) && !wanted.count(e.name)) extra.push_back(e.name);
    if (!extra.empty()) {
      std::string list;
      for (std::size_t i = 0; i < extra.size() && i < 5; ++i) list += (i ? ", \"" : "\"") + extra[i] + "\"";
      if (extra.size() > 5) list += str(" and ", extra.size() - 5, " more");
      bad("the file holds tensors that ", options.destination, " does not have: ", list,
          " (a checkpoint of a different model?)");
    }
  }
  // Everything matched: only now touch the destination.
  for (std::size_t i = 0; i < slots.size(); ++i) {
    auto src = file.data(*sources[i]);
    if (!src.empty()) std::memcpy(slots[i].data.data(), src.data(), src.size());
  }
}

}  // namespace towerflow::io
