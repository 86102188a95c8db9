#pragma once
// A module's parameters and buffers as a safetensors file, under the module's state_dict names:
// what `safetensors.torch.load_file` + `model.load_state_dict` read in PyTorch.
//
//   io::save_module(*model, "model.safetensors");
//   io::load_module(*other, "model.safetensors");   // any device; all or nothing
//
// Contract:
// - save_module writes every parameter, then every buffer, copied to the host (waits for the
//   device), atomically (atomic_file.h). Layouts are the module's (PyTorch's: OIHW conv weights,
//   [out, in] linear weights).
// - load_module checks the whole file against the module first: every name present, dtype and
//   shape equal, and (strict, the default) no tensor the module lacks. A mismatch raises DataError
//   naming the tensor, the file's and the module's dtype or shape, and nothing is written. Only
//   then are values copied to the module's device.
// Thread-safety: as the module's (one thread at a time).

#include <filesystem>
#include <string>
#include <vector>

#include "core/nn/module.h"
#include "io/safetensors.h"

namespace towerflow::io {

// The safetensors dtype of a tensor dtype (float32 -> F32, int32 -> I32, ...).
DType safetensors_dtype(towerflow::DType dtype);

// A tensor copied to host memory.
struct HostTensor {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  std::vector<std::byte> bytes;

  TensorView view() const { return {name, dtype, shape, bytes}; }
};

// Parameters then buffers, named as state_dict names them, copied to the host.
std::vector<HostTensor> module_state(const nn::Module& module);

std::string serialize_module(const nn::Module& module, const Metadata& metadata = {});
void save_module(const nn::Module& module, const std::filesystem::path& path, const Metadata& metadata = {});

void load_module(nn::Module& module, const SafetensorsFile& file, LoadOptions options = {});
void load_module(nn::Module& module, const std::filesystem::path& path, LoadOptions options = {});

}  // namespace towerflow::io
