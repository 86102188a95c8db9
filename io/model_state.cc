#include "io/model_state.h"

#include <cstring>

#include "core/error.h"
#include "io/atomic_file.h"

namespace towerflow::io {
namespace {

// Parameters first, as state_dict lists them within a module; the pair order is kept.
nn::NamedTensors all_tensors(const nn::Module& module) {
  nn::NamedTensors all = module.named_parameters();
  for (auto& b : module.named_buffers()) all.push_back(std::move(b));
  return all;
}

void copy_to_host(const Tensor& t, std::span<std::byte> out) {
  switch (t.dtype()) {
    case towerflow::DType::kFloat32:
      t.to_host(std::span<float>(reinterpret_cast<float*>(out.data()), out.size() / sizeof(float)));
      return;
    case towerflow::DType::kInt32:
      t.to_host(std::span<std::int32_t>(reinterpret_cast<std::int32_t*>(out.data()), out.size() / 4));
      return;
    default:
      raise<InvalidArgument>("cannot save ", t.describe(), ": only float32 and int32 tensors are saved");
  }
}

void copy_from_host(const Tensor& t, std::span<const std::byte> in) {
  Tensor target = t;
  switch (t.dtype()) {
    case towerflow::DType::kFloat32:
      target.copy_from_host(std::span<const float>(reinterpret_cast<const float*>(in.data()), in.size() / 4));
      return;
    case towerflow::DType::kInt32:
      target.copy_from_host(
          std::span<const std::int32_t>(reinterpret_cast<const std::int32_t*>(in.data()), in.size() / 4));
      return;
    default:
      raise<InvalidArgument>("cannot load ", t.describe(), ": only float32 and int32 tensors are loaded");
  }
}

}  // namespace

DType safetensors_dtype(towerflow::DType dtype) {
  switch (dtype) {
    case towerflow::DType::kFloat32: return DType::F32;
    case towerflow::DType::kInt32: return DType::I32;
    case towerflow::DType::kUInt8: return DType::U8;
    case towerflow::DType::kBFloat16: return DType::BF16;
    case towerflow::DType::kFloat16: return DType::F16;
  }
  raise<InternalError>("unknown tensor dtype");
}

std::vector<HostTensor> module_state(const nn::Module& module) {
  std::vector<HostTensor> out;
  for (const auto& [name, t] : all_tensors(module)) {
    HostTensor h{name, safetensors_dtype(t.dtype()), t.shape(), std::vector<std::byte>(t.nbytes())};
    copy_to_host(t, h.bytes);
    out.push_back(std::move(h));
  }
  return out;
}

std::string serialize_module(const nn::Module& module, const Metadata& metadata) {
  auto state = module_state(module);
  std::vector<TensorView> views;
  views.reserve(state.size());
  for (const auto& h : state) views.push_back(h.view());
  return serialize_safetensors(views, metadata);
}

void save_module(const nn::Module& module, const std::filesystem::path& path, const Metadata& metadata) {
  write_file_atomically(path, serialize_module(module, metadata));
}

void load_module(nn::Module& module, const SafetensorsFile& file, LoadOptions options) {
  auto tensors = all_tensors(module);
  // Stage through host buffers: load_into validates everything before filling any of them, and
  // the device copies happen only after that.
  std::vector<std::vector<std::byte>> staging(tensors.size());
  std::vector<TensorSlot> slots;
  slots.reserve(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i].second;
    staging[i].resize(t.nbytes());
    slots.push_back({tensors[i].first, safetensors_dtype(t.dtype()), t.shape(), staging[i]});
  }
  if (options.destination == LoadOptions{}.destination) options.destination = "the model";
  load_into(file, slots, options);
  for (std::size_t i = 0; i < tensors.size(); ++i) copy_from_host(tensors[i].second, staging[i]);
}

void load_module(nn::Module& module, const std::filesystem::path& path, LoadOptions options) {
  load_module(module, SafetensorsFile::load(path), std::move(options));
}

}  // namespace towerflow::io
