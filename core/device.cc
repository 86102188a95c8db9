#include "core/device.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <string>

#include "core/error.h"
#include "core/strings.h"

namespace towerflow {

std::string_view to_string(DeviceKind kind) { return kind == DeviceKind::CPU ? "CPU" : "GPU"; }

namespace {

[[noreturn]] void bad_name(std::string_view name, std::string_view why) {
  raise<InvalidArgument>("invalid device name '", name, "': ", why,
                         "; expected a name such as '/gpu:0', '/cpu:0', '/device:GPU:1', "
                         "'/job:localhost/replica:0/task:0/device:GPU:1' or 'cuda:1'");
}

int parse_index(std::string_view name, std::string_view digits) {
  int value = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || value < 0)
    bad_name(name, towerflow::str("'", digits, "' is not a device index (a whole number >= 0)"));
  return value;
}

// Parses "kind" or "kind:index" where kind is cpu, gpu or cuda (any case).
Device parse_kind_index(std::string_view name, std::string_view spec) {
  auto colon = spec.find(':');
  std::string kind = lower(spec.substr(0, colon));
  int index = colon == std::string_view::npos ? 0 : parse_index(name, spec.substr(colon + 1));
  if (kind == "cpu") return Device::cpu(index);
  if (kind == "gpu" || kind == "cuda") return Device::gpu(index);
  bad_name(name, towerflow::str("unknown device kind '", spec.substr(0, colon), "' (use CPU or GPU)"));
}

}  // namespace

Device Device::parse(std::string_view name) {
  const std::string_view s = trim(name);
  if (s.empty()) bad_name(name, "the name is empty");
  if (s.front() != '/') {
    if (lower(s).rfind("cuda", 0) == 0 || lower(s).rfind("cpu", 0) == 0 ||
        lower(s).rfind("gpu", 0) == 0)
      return parse_kind_index(name, s);
    bad_name(name, "it does not start with '/' or 'cuda:'");
  }
  // Split "/a:b/c:d/..." into components; the last must be "device:KIND:N" or "KIND:N".
  std::string_view device_part;
  std::string_view rest = s.substr(1);
  while (!rest.empty()) {
    auto slash = rest.find('/');
    std::string_view part = rest.substr(0, slash);
    rest = slash == std::string_view::npos ? std::string_view{} : rest.substr(slash + 1);
    if (part.empty()) bad_name(name, "it has an empty component ('//')");
    std::string key = lower(part.substr(0, part.find(':')));
    if (key == "job" || key == "replica" || key == "task") {
      if (!device_part.empty()) bad_name(name, towerflow::str("'", part, "' comes after the device"));
      if (key != "job") parse_index(name, part.substr(part.find(':') + 1));
      continue;
    }
    if (!device_part.empty()) bad_name(name, towerflow::str("unexpected component '", part, "'"));
    device_part = part;
  }
  if (device_part.empty()) bad_name(name, "it names no device");
  if (lower(device_part).rfind("device:", 0) == 0) device_part.remove_prefix(7);
  if (device_part.find(':') == std::string_view::npos)
    bad_name(name, "the device has no index (write '/gpu:0', not '/gpu')");
  return parse_kind_index(name, device_part);
}

std::optional<int> device_task(std::string_view name) {
  (void)Device::parse(name);  // the same errors
  std::optional<int> task;
  std::string_view rest = name;
  while (!rest.empty()) {
    const auto slash = rest.find('/');
    std::string_view part = rest.substr(0, slash);
    rest = slash == std::string_view::npos ? std::string_view{} : rest.substr(slash + 1);
    if (lower(part.substr(0, part.find(':'))) == "task") task = parse_index(name, part.substr(part.find(':') + 1));
  }
  return task;
}

std::string Device::str() const {
  return std::string(is_cpu() ? "/cpu:" : "/gpu:") + std::to_string(index);
}

std::string Device::full_name() const {
  return "/job:localhost/replica:0/task:0/device:" + std::string(to_string(kind)) + ":" +
         std::to_string(index);
}

std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }

std::string device_list(const std::vector<Device>& devices) {
  std::string s;
  for (const Device& d : devices) s += (s.empty() ? "" : ", ") + d.str();
  return s;
}

}  // namespace towerflow
