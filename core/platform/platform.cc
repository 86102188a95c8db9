#include "core/platform/platform.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/platform/cuda_query.h"

namespace towerflow {

std::string GpuDescription::compute_capability() const { return str(compute_major, ".", compute_minor); }

namespace {

// A cgroup memory limit, if one applies: containers often get far less than the machine has,
// and a default limit of "all host memory" should mean what the process can actually use.
std::size_t cgroup_memory_limit() {
  for (const char* path : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream in(path);
    std::string text;
    if (!(in >> text) || text == "max") continue;
    std::size_t value = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec == std::errc() && value > 0) return value;
  }
  return 0;
}

class DescribedPlatform final : public Platform {
 public:
  DescribedPlatform(HostDescription host, std::vector<GpuDescription> gpus, std::string name)
      : host_(host), gpus_(std::move(gpus)), name_(std::move(name)) {}
  HostDescription host() const override { return host_; }
  std::vector<GpuDescription> gpus() const override { return gpus_; }
  std::string name() const override { return name_; }

 private:
  HostDescription host_;
  std::vector<GpuDescription> gpus_;
  std::string name_;
};

// Queries run on first use, so building a platform costs nothing and a CPU-only program that
// never asks about GPUs never loads the CUDA driver.
class SystemPlatform final : public Platform {
 public:
  HostDescription host() const override {
    std::call_once(host_once_, [this] { host_ = query_host(); });
    return host_;
  }
  std::vector<GpuDescription> gpus() const override {
    std::call_once(gpus_once_, [this] { gpus_ = detail::query_cuda_gpus(&why_no_gpu_); });
    return gpus_;
  }
  std::string name() const override {
    gpus();
    return gpus_.empty() ? str("this machine (no GPU: ", why_no_gpu_, ")") : std::string("this machine");
  }

 private:
  mutable std::once_flag host_once_, gpus_once_;
  mutable HostDescription host_;
  mutable std::vector<GpuDescription> gpus_;
  mutable std::string why_no_gpu_;
};

std::size_t json_size(const nlohmann::json& j, std::string_view source, std::string_view field) {
  if (!j.is_number_unsigned() && !(j.is_number_integer() && j.get<long long>() >= 0))
    raise<DataError>(source, ": field '", field, "' must be a whole number of bytes >= 0, not ", j.dump());
  return j.get<std::size_t>();
}

const nlohmann::json& json_field(const nlohmann::json& obj, std::string_view source, const std::string& path,
                                 const char* key) {
  if (!obj.is_object() || !obj.contains(key))
    raise<DataError>(source, ": the description lacks '", path, key,
                     "'; a platform is {\"cpu\": {\"cores\": N, \"memory_bytes\": N}, \"gpus\": [{\"name\", "
                     "\"memory_bytes\", \"pci_bus_id\", \"compute_capability\"}, ...]}");
  return obj.at(key);
}

}  // namespace

HostDescription query_host() {
  HostDescription host;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0)
    host.cores = CPU_COUNT(&set);
  else
    host.cores = static_cast<int>(std::thread::hardware_concurrency());
  host.cores = std::max(host.cores, 1);
  long pages = sysconf(_SC_PHYS_PAGES);
  long page_size = sysconf(_SC_PAGE_SIZE);
  host.memory_bytes = pages > 0 && page_size > 0 ? static_cast<std::size_t>(pages) * page_size : 0;
  if (std::size_t limit = cgroup_memory_limit(); limit > 0 && (host.memory_bytes == 0 || limit < host.memory_bytes))
    host.memory_bytes = limit;
  return host;
}

std::unique_ptr<Platform> make_system_platform() { return std::make_unique<SystemPlatform>(); }

std::unique_ptr<Platform> make_described_platform(HostDescription host, std::vector<GpuDescription> gpus,
                                                  std::string name) {
  return std::make_unique<DescribedPlatform>(host, std::move(gpus), std::move(name));
}

std::unique_ptr<Platform> parse_platform_json(std::string_view text, std::string_view source) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for a number like 1E400
    raise<DataError>(source, ": not valid JSON (", e.what(), ")");
  }
  if (!doc.is_object()) raise<DataError>(source, ": a platform description must be a JSON object, not ", doc.type_name());
  for (const auto& [key, value] : doc.items())
    if (key != "cpu" && key != "gpus" && key != "name")
      raise<DataError>(source, ": unknown field '", key, "'; the fields are cpu, gpus and name");
  HostDescription host;
  const auto& cpu = json_field(doc, source, "", "cpu");
  const auto& cores = json_field(cpu, source, "cpu.", "cores");
  if (!cores.is_number_integer() || cores.get<long long>() < 1)
    raise<DataError>(source, ": cpu.cores must be a whole number >= 1, not ", cores.dump());
  host.cores = cores.get<int>();
  host.memory_bytes = json_size(json_field(cpu, source, "cpu.", "memory_bytes"), source, "cpu.memory_bytes");
  if (host.memory_bytes == 0) raise<DataError>(source, ": cpu.memory_bytes must be > 0");

  std::vector<GpuDescription> gpus;
  if (doc.contains("gpus")) {
    const auto& list = doc.at("gpus");
    if (!list.is_array()) raise<DataError>(source, ": 'gpus' must be a list, not ", list.type_name());
    for (std::size_t i = 0; i < list.size(); ++i) {
      const auto& g = list[i];
      std::string path = str("gpus[", i, "].");
      GpuDescription gpu;
      const auto& name = json_field(g, source, path, "name");
      if (!name.is_string()) raise<DataError>(source, ": ", path, "name must be a string");
      gpu.name = name.get<std::string>();
      gpu.memory_bytes = json_size(json_field(g, source, path, "memory_bytes"), source, path + "memory_bytes");
      if (gpu.memory_bytes == 0) raise<DataError>(source, ": ", path, "memory_bytes must be > 0");
      if (g.contains("pci_bus_id")) {
        if (!g.at("pci_bus_id").is_string()) raise<DataError>(source, ": ", path, "pci_bus_id must be a string such as \"0000:3b:00.0\"");
        gpu.pci_bus_id = g.at("pci_bus_id").get<std::string>();
      }
      if (g.contains("compute_capability")) {
        const auto& cc = g.at("compute_capability");
        std::string text = cc.is_string() ? cc.get<std::string>() : cc.is_number() ? cc.dump() : "";
        auto dot = text.find('.');
        auto parse = [&](std::string_view s, int& out) {
          auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
          return !s.empty() && ec == std::errc() && end == s.data() + s.size();
        };
        if (dot == std::string::npos || !parse(std::string_view(text).substr(0, dot), gpu.compute_major) ||
            !parse(std::string_view(text).substr(dot + 1), gpu.compute_minor))
          raise<DataError>(source, ": ", path, "compute_capability must be \"MAJOR.MINOR\" such as \"8.0\", not ",
                           cc.dump());
      }
      for (const auto& [key, value] : g.items())
        if (key != "name" && key != "memory_bytes" && key != "pci_bus_id" && key != "compute_capability")
          raise<DataError>(source, ": unknown field '", path, key,
                           "'; a GPU has name, memory_bytes, pci_bus_id and compute_capability");
      gpus.push_back(std::move(gpu));
    }
  }
  std::string name = doc.contains("name") && doc.at("name").is_string()
                         ? doc.at("name").get<std::string>()
                         : str("described machine '", source, "'");
  return make_described_platform(host, std::move(gpus), name);
}

std::unique_ptr<Platform> load_platform_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) raise<NotFound>("cannot open the platform description '", path, "'; check the path");
  std::stringstream buffer;
  buffer << in.rdbuf();
  return parse_platform_json(buffer.str(), path);
}

std::vector<GpuDescription> apply_cuda_environment(std::vector<GpuDescription> gpus, const char* visible,
                                                   const char* order) {
  if (order != nullptr && std::string_view(order) == "PCI_BUS_ID")
    std::stable_sort(gpus.begin(), gpus.end(),
                     [](const GpuDescription& a, const GpuDescription& b) { return a.pci_bus_id < b.pci_bus_id; });
  if (visible == nullptr) return gpus;
  std::vector<GpuDescription> out;
  std::set<int> used;
  std::string_view rest = visible;
  while (!rest.empty()) {
    auto comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    int id = -1;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), id);
    // The driver stops at the first entry that is not a valid, new device index.
    if (item.empty() || ec != std::errc() || end != item.data() + item.size() || id < 0 ||
        id >= static_cast<int>(gpus.size()) || !used.insert(id).second)
      break;
    out.push_back(gpus[id]);
  }
  return out;
}

}  // namespace towerflow
