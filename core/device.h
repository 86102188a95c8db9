#pragma once
// Device: a value naming one logical device, kind and index.
//
// Parses and prints every TensorFlow form and PyTorch's:
//   /cpu:0   /gpu:1   /device:GPU:1   /job:localhost/replica:0/task:0/device:GPU:1   cuda:1
// (kind case-insensitive; "cpu" and "gpu"/"cuda" alone mean index 0). Anything else raises
// InvalidArgument quoting the string and showing a valid example.

#include <compare>
#include <cstddef>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace towerflow {

enum class DeviceKind { CPU, GPU };

std::string_view to_string(DeviceKind kind);  // "CPU" or "GPU"

struct Device {
  DeviceKind kind = DeviceKind::CPU;
  int index = 0;

  static Device cpu(int index = 0) { return {DeviceKind::CPU, index}; }
  static Device gpu(int index = 0) { return {DeviceKind::GPU, index}; }

  // Throws InvalidArgument on anything that is not a device name.
  static Device parse(std::string_view name);

  bool is_cpu() const { return kind == DeviceKind::CPU; }
  bool is_gpu() const { return kind == DeviceKind::GPU; }

  std::string str() const;        // short form: "/cpu:0", "/gpu:1"
  std::string full_name() const;  // "/job:localhost/replica:0/task:0/device:GPU:1"

  auto operator<=>(const Device&) const = default;
};

std::ostream& operator<<(std::ostream& os, const Device& d);  // short form
// "/cpu:0, /cpu:1": short forms joined, for messages.
std::string device_list(const std::vector<Device>& devices);

// The task of a TensorFlow cluster name ("/job:worker/replica:0/task:1/device:GPU:0" -> 1), or
// nullopt for a name without one. In a job of several processes, task t is the process of rank t
// (TensorFlow's cluster naming): such a name is a device of that process. Throws as parse().
std::optional<int> device_task(std::string_view name);

}  // namespace towerflow

template <>
struct std::hash<towerflow::Device> {
  std::size_t operator()(const towerflow::Device& d) const noexcept {
    return std::hash<int>{}(d.index * 2 + (d.kind == towerflow::DeviceKind::GPU ? 1 : 0));
  }
};
