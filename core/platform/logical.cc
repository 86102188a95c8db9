#include "core/platform/logical.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <set>

#include "core/error.h"

namespace towerflow {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

std::size_t mib_to_bytes(double mib) { return static_cast<std::size_t>(std::llround(mib * static_cast<double>(kMiB))); }

std::string list_devices(const std::vector<LogicalDevice>& devices) {
  std::string out;
  for (const auto& d : devices) out += (out.empty() ? "" : ", ") + d.device.str();
  return out.empty() ? std::string("none") : out;
}

std::string visible_ids_hint(int visible_count) {
  if (visible_count == 0)
    return "this process sees no GPU (check the driver and CUDA_VISIBLE_DEVICES), so leave "
           "visible_device_list empty";
  return str("this process sees ", visible_count, " GPU", visible_count == 1 ? "" : "s", " (ids 0..",
             visible_count - 1, " after CUDA_VISIBLE_DEVICES); list ids among them, e.g. visible_device_list=\"",
             visible_count > 1 ? "1,0" : "0", "\"");
}

// The parts of one logical device before it gets its number and description.
struct Planned {
  DeviceKind kind;
  int physical_index;
  std::size_t limit;
  bool explicit_limit;  // set by the user (virtual devices, memory_limit), not a default
  bool growth;
  int threads;
  bool from_free_memory = false;  // a GPU's default without fraction or growth: set at first use
};

std::string describe(const LogicalDevice& d, const std::vector<GpuDescription>& gpus) {
  std::string out;
  if (d.device.is_gpu()) {
    const auto& g = gpus[d.physical_index];
    out = str("physical GPU ", d.physical_index, " (", g.name);
    if (!g.pci_bus_id.empty()) out += str(", pci bus id ", g.pci_bus_id);
    out += str(", compute capability ", g.compute_capability(), ")");
  } else {
    out = str("physical CPU ", d.physical_index);
  }
  if (d.limit_from_free_memory)
    out += str(", memory limit at first use: free memory less the reserve (at most ",
               format_byte_size(d.memory_limit_bytes), ")");
  else
    out += str(", memory limit ", format_byte_size(d.memory_limit_bytes));
  out += str(", growth ", d.allow_growth ? "on" : "off");
  if (d.device.is_cpu())
    out += str(", ", d.intra_op_threads, " intra-op thread", d.intra_op_threads == 1 ? "" : "s");
  return out;
}

}  // namespace

std::string format_byte_size(std::size_t bytes) {
  char buf[64];
  double b = static_cast<double>(bytes);
  if (bytes >= (std::size_t{1} << 30))
    std::snprintf(buf, sizeof buf, "%.1f GiB", b / double(std::size_t{1} << 30));
  else if (bytes >= kMiB)
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / double(kMiB));
  else if (bytes >= 1024)
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  else
    std::snprintf(buf, sizeof buf, "%zu B", bytes);
  return buf;
}

std::size_t gpu_system_memory_reserve(std::size_t total_bytes, int compute_major) {
  if (total_bytes < (std::size_t{1} << 31)) return 225 * kMiB;
  if (compute_major <= 6) return 500 * kMiB;
  if (compute_major <= 7) return 1050 * kMiB;
  return 1536 * kMiB;
}

std::size_t gpu_memory_limit_at_open(const std::string& device, std::size_t free_bytes,
                                     std::size_t total_bytes, std::optional<double> fraction,
                                     std::size_t reserve_bytes) {
  if (fraction) return static_cast<std::size_t>(static_cast<double>(total_bytes) * *fraction);
  if (free_bytes < reserve_bytes || free_bytes - reserve_bytes < 256)
    raise<OutOfMemory>(
        device, " has ", format_byte_size(free_bytes), " free of its ", format_byte_size(total_bytes),
        " at first use, not more than the ", format_byte_size(reserve_bytes),
        " left to the system and libraries (the default limit is free memory less that reserve); "
        "other processes or libraries hold the rest. Set per_process_gpu_memory_fraction or a "
        "memory_limit for this device, or allow_growth=true, or free the GPU");
  return free_bytes - reserve_bytes;
}

std::vector<int> parse_visible_device_list(const std::string& list, int visible_count) {
  std::vector<int> ids;
  std::string compact;
  for (char c : list)
    if (c != ' ') compact += c;
  if (compact.empty()) {
    for (int i = 0; i < visible_count; ++i) ids.push_back(i);
    return ids;
  }
  std::set<int> seen;
  std::string_view rest = compact;
  while (true) {
    auto comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    int id = -1;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), id);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size())
      raise<InvalidArgument>("Could not parse entry in 'visible_device_list': '", item,
                             "'. visible_device_list = ", compact,
                             "; write GPU ids separated by commas, e.g. \"1,0\"");
    if (id < 0 || id >= visible_count)
      raise<InvalidArgument>("'visible_device_list' listed an invalid GPU id '", id,
                             "' but visible device count is ", visible_count, "; ", visible_ids_hint(visible_count));
    if (!seen.insert(id).second)
      raise<InvalidArgument>("visible_device_list contained a duplicate entry: ", compact,
                             "; list each GPU id once (GPU ", id,
                             " twice would give two allocators for one device; use virtual_devices to split a GPU)");
    ids.push_back(id);
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return ids;
}

std::vector<LogicalDevice> resolve_logical_devices(const ProcessOptions& opts, const Platform& platform) {
  const std::vector<GpuDescription> gpus = platform.gpus();
  const HostDescription host = platform.host();
  const int visible_count = static_cast<int>(gpus.size());

  // ---- which GPUs, in which order -------------------------------------------------------------
  std::vector<int> order = parse_visible_device_list(opts.visible_device_list.value_or(""), visible_count);
  if (auto it = opts.device_count.find("GPU"); it != opts.device_count.end() && it->second < static_cast<int>(order.size()))
    order.resize(it->second);  // device_count GPU=N caps the GPUs, as in TensorFlow

  // ---- GPU memory options -----------------------------------------------------------------------
  const auto& fraction = opts.per_process_gpu_memory_fraction;
  if (fraction && !(*fraction > 0.0 && *fraction <= 1.0))
    raise<InvalidArgument>("per_process_gpu_memory_fraction is ", *fraction,
                           " but must be in (0, 1]: the share of each GPU's memory this process may use, "
                           "e.g. 0.4; leave it unset to use all but a system reserve");
  const auto& gpu_virtual = opts.virtual_devices.gpu_memory_limits_mb;
  if (gpu_virtual) {
    if (fraction)
      raise<InvalidArgument>("It's invalid to set per_process_gpu_memory_fraction when virtual_devices is set "
                             "(per_process_gpu_memory_fraction=", *fraction,
                             "); give each virtual device its memory limit instead, or drop virtual_devices");
    if (gpu_virtual->size() != order.size())
      raise<InvalidArgument>(
          "The number of GPUs in use doesn't match the number of elements in the virtual_devices list: ",
          order.size(), " GPU", order.size() == 1 ? "" : "s", " in use (visible_device_list=\"",
          opts.visible_device_list.value_or(""), "\", ", visible_count, " visible",
          opts.device_count.count("GPU") ? str(", device_count GPU=", opts.device_count.at("GPU")) : "",
          ") but virtual_devices has ", gpu_virtual->size(), " GPU entr", gpu_virtual->size() == 1 ? "y" : "ies",
          "; give one entry per GPU in use, in visible_device_list order (\"N:\" keeps GPU N whole)");
  }
  for (const auto& [id, growth] : opts.memory_growth)
    if (std::find(order.begin(), order.end(), id) == order.end())
      raise<InvalidArgument>("memory_growth names GPU ", id, " but the GPUs in use are {",
                             [&] {
                               std::string s;
                               for (int i : order) s += (s.empty() ? "" : ",") + std::to_string(i);
                               return s;
                             }(),
                             "}; set growth only for GPUs in visible_device_list");
  const bool default_growth = opts.allow_growth.value_or(false);
  std::optional<bool> common_growth;
  for (int id : order) {
    auto it = opts.memory_growth.find(id);
    bool growth = it != opts.memory_growth.end() ? it->second : default_growth;
    if (common_growth && *common_growth != growth)
      raise<InvalidArgument>("Memory growth cannot differ between GPU devices: GPU ", order.front(), " has ",
                             *common_growth ? "true" : "false", ", GPU ", id, " has ", growth ? "true" : "false",
                             " (memory_growth overrides allow_growth=", default_growth ? "true" : "false",
                             "); set the same growth for every GPU, e.g. allow_growth=true without memory_growth");
    common_growth = growth;
  }

  std::vector<Planned> planned;
  for (std::size_t pos = 0; pos < order.size(); ++pos) {
    const int id = order[pos];
    const GpuDescription& g = gpus[id];
    const bool growth = common_growth.value_or(default_growth);
    std::size_t default_limit =
        fraction ? static_cast<std::size_t>(static_cast<double>(g.memory_bytes) * *fraction)
                 : g.memory_bytes - std::min(g.memory_bytes, gpu_system_memory_reserve(g.memory_bytes, g.compute_major));
    if (gpu_virtual && !(*gpu_virtual)[pos].empty()) {
      for (double mb : (*gpu_virtual)[pos]) planned.push_back({DeviceKind::GPU, id, mib_to_bytes(mb), true, growth, 1});
    } else {
      // Without a fraction and without growth the pool reserves its whole limit at first use, so
      // the limit is taken then, from the memory free at that moment (gpu_memory_limit_at_open);
      // default_limit is its upper bound until then.
      planned.push_back({DeviceKind::GPU, id, default_limit, false, growth, 1, !fraction && !growth});
    }
  }

  // ---- CPU devices --------------------------------------------------------------------------------
  const auto& cpu_virtual = opts.virtual_devices.cpu_memory_limits_mb;
  int cpu_count = 1;
  if (auto it = opts.device_count.find("CPU"); it != opts.device_count.end()) {
    if (it->second < 1)
      raise<InvalidArgument>("device_count CPU=", it->second,
                             " leaves the process without a CPU device; use CPU=1 or more");
    cpu_count = it->second;
  }
  if (cpu_virtual) {
    if (opts.device_count.count("CPU") && static_cast<int>(cpu_virtual->size()) != cpu_count)
      raise<InvalidArgument>("virtual_devices lists ", cpu_virtual->size(), " CPU device",
                             cpu_virtual->size() == 1 ? "" : "s", " but device_count has CPU=", cpu_count,
                             "; make them agree or drop one of the two (either alone sets the CPU count)");
    cpu_count = static_cast<int>(cpu_virtual->size());
  }
  if (opts.intra_op_threads && *opts.intra_op_threads < 0)
    raise<InvalidArgument>("intra_op_threads is ", *opts.intra_op_threads, "; use a thread count >= 0 (0 = automatic)");
  const int threads = opts.intra_op_threads.value_or(0) > 0 ? *opts.intra_op_threads
                                                           : std::max(1, host.cores / cpu_count);
  for (int i = 0; i < cpu_count; ++i) {
    if (cpu_virtual)
      planned.push_back({DeviceKind::CPU, 0, mib_to_bytes((*cpu_virtual)[i]), true, true, threads});
    else
      planned.push_back({DeviceKind::CPU, 0, host.memory_bytes, false, true, threads});
  }

  // ---- numbering, per-device limits, checks against the devices ----------------------------------
  std::vector<LogicalDevice> devices;
  int next_gpu = 0, next_cpu = 0;
  for (const auto& p : planned) {
    LogicalDevice d;
    d.device = p.kind == DeviceKind::GPU ? Device::gpu(next_gpu++) : Device::cpu(next_cpu++);
    d.physical_index = p.physical_index;
    d.memory_limit_bytes = p.limit;
    d.allow_growth = p.growth;
    d.limit_from_free_memory = p.from_free_memory;
    d.intra_op_threads = p.threads;
    devices.push_back(d);
  }
  std::vector<bool> explicit_limit;
  for (const auto& p : planned) explicit_limit.push_back(p.explicit_limit);
  for (const auto& [dev, mb] : opts.memory_limit_mb) {
    auto it = std::find_if(devices.begin(), devices.end(), [&](const LogicalDevice& d) { return d.device == dev; });
    if (it == devices.end())
      raise<InvalidArgument>("memory_limit names ", dev, " but the logical devices are ", list_devices(devices),
                             "; limit one of those (logical numbering, after visible_device_list and virtual_devices)");
    it->memory_limit_bytes = mib_to_bytes(mb);
    it->limit_from_free_memory = false;
    explicit_limit[it - devices.begin()] = true;
  }
  // A physical device's explicit limits must fit in it; defaults fit by construction (and the
  // host's default is shared by every CPU device, as the host's memory is).
  std::map<std::pair<DeviceKind, int>, std::size_t> explicit_sum;
  for (std::size_t i = 0; i < devices.size(); ++i) {
    const auto& d = devices[i];
    std::size_t capacity = d.device.is_gpu() ? gpus[d.physical_index].memory_bytes : host.memory_bytes;
    std::string physical = d.device.is_gpu() ? str("GPU ", d.physical_index, " (", gpus[d.physical_index].name, ")")
                                             : std::string("the host");
    if (d.memory_limit_bytes > capacity)
      raise<InvalidArgument>("memory limit of ", d.device, " is ", format_byte_size(d.memory_limit_bytes), " but ", physical,
                             " has ", format_byte_size(capacity), "; use a limit of at most ", capacity / kMiB, " MiB");
    if (explicit_limit[i]) {
      std::size_t& sum = explicit_sum[{d.device.kind, d.physical_index}];
      sum += d.memory_limit_bytes;
      if (sum > capacity) {
        std::string on;
        for (std::size_t j = 0; j <= i; ++j)
          if (explicit_limit[j] && devices[j].device.kind == d.device.kind && devices[j].physical_index == d.physical_index)
            on += (on.empty() ? "" : " + ") + str(devices[j].device, " ", format_byte_size(devices[j].memory_limit_bytes));
        raise<InvalidArgument>("the memory limits on ", physical, " add up to more than its ", format_byte_size(capacity),
                               ": ", on, "; lower the virtual_devices or memory_limit values so they fit");
      }
    }
  }
  for (auto& d : devices) d.description = describe(d, gpus);
  return devices;
}

}  // namespace towerflow
