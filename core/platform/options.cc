#include "core/platform/options.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "core/strings.h"

namespace towerflow {
namespace {

// Numbers print without trailing zeros so a printed option parses back to the same value.
std::string format_number(double v) {
  std::ostringstream os;
  os.precision(15);
  os << v;
  return os.str();
}

int parse_int(std::string_view option, std::string_view text, std::string_view expected) {
  text = trim(text);
  int value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size())
    raise<InvalidArgument>(option, ": '", text, "' is not a whole number; expected ", expected);
  return value;
}

double parse_double(std::string_view option, std::string_view text, std::string_view expected) {
  text = trim(text);
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || !std::isfinite(value))
    raise<InvalidArgument>(option, ": '", text, "' is not a number; expected ", expected);
  return value;
}

// A memory size in MiB: "1024", "1024M", "1024MiB", "1.5G", "1.5GiB" (binary units throughout).
double parse_mib(std::string_view option, std::string_view text) {
  text = trim(text);
  std::string_view digits = text;
  double scale = 1.0;
  std::string low = lower(text);
  for (auto [suffix, factor] : {std::pair{"gib", 1024.0}, {"gb", 1024.0}, {"g", 1024.0},
                                {"mib", 1.0}, {"mb", 1.0}, {"m", 1.0}}) {
    std::string_view sv = suffix;
    if (low.size() > sv.size() && low.ends_with(sv)) {
      digits = trim(text.substr(0, text.size() - sv.size()));
      scale = factor;
      break;
    }
  }
  double v = parse_double(option, digits,
                          "a memory size in MiB such as 1024, 1024MiB or 1.5GiB");
  if (v <= 0)
    raise<InvalidArgument>(option, ": memory size '", text,
                           "' must be positive (a limit in MiB such as 1024 or 1.5GiB)");
  // 2^30 MiB (1 PiB) is beyond any device and keeps the byte count representable.
  if (!(v * scale <= 1024.0 * 1024 * 1024))
    raise<InvalidArgument>(option, ": memory size '", text,
                           "' is larger than any device (at most 1 PiB); give a limit in MiB such as 1024 or 1.5GiB");
  return v * scale;
}

std::string format_limits(const std::vector<double>& limits) {
  std::string out;
  for (std::size_t i = 0; i < limits.size(); ++i)
    out += (i ? "," : "") + format_number(limits[i]);
  return out;
}

std::string format_virtual_devices(const VirtualDevices& v) {
  std::string out;
  if (v.gpu_memory_limits_mb)
    for (std::size_t i = 0; i < v.gpu_memory_limits_mb->size(); ++i)
      out += (out.empty() ? "" : ";") + str(i, ":", format_limits((*v.gpu_memory_limits_mb)[i]));
  if (v.cpu_memory_limits_mb)
    out += (out.empty() ? "" : ";") + str("cpu:", format_limits(*v.cpu_memory_limits_mb));
  return out.empty() ? "unset" : out;
}

std::string format_memory_limits(const std::map<Device, double>& m) {
  std::string out;
  for (const auto& [d, mb] : m) out += (out.empty() ? "" : ",") + str(d.str().substr(1), "=", format_number(mb));
  return out.empty() ? "unset" : out;
}

std::string format_device_count(const std::map<std::string, int>& m) {
  std::string out;
  for (const auto& [k, n] : m) out += (out.empty() ? "" : ",") + str(k, "=", n);
  return out.empty() ? "unset" : out;
}

std::string format_memory_growth(const std::map<int, bool>& m) {
  std::string out;
  for (const auto& [id, g] : m) out += (out.empty() ? "" : ",") + str(id, "=", g ? "true" : "false");
  return out.empty() ? "unset" : out;
}

std::string format_bool(bool b) { return b ? "true" : "false"; }

std::string normalised_list(std::string_view s) {
  std::string out;
  for (char c : s)
    if (!std::isspace(static_cast<unsigned char>(c))) out += c;
  return out;
}

// ---- the table ------------------------------------------------------------------------------
// One row per option: the flags (options_flags.cc), the INI reader, merged_with,
// option_differences, to_string and is_process_option all walk it, so an option is added here
// and nowhere else.
struct Row {
  ProcessOptionInfo info;
  // Parses `value` (trimmed) into the field; `key` is the spelling used, for messages.
  void (*set)(ProcessOptions& o, std::string_view key, std::string_view value);
  void (*merge)(ProcessOptions& into, const ProcessOptions& from);  // from's set values win
  std::string (*shown)(const ProcessOptions& o);      // to_string's value text; empty when unset
  std::string (*effective)(const ProcessOptions& o);  // the value in force, unset as its default
};

template <auto M>
void merge_optional(ProcessOptions& into, const ProcessOptions& from) {
  if (from.*M) into.*M = from.*M;
}
template <auto M>
void merge_entries(ProcessOptions& into, const ProcessOptions& from) {
  for (const auto& [k, v] : from.*M) (into.*M)[k] = v;
}
template <auto M>
void set_bool(ProcessOptions& o, std::string_view key, std::string_view value) {
  o.*M = parse_bool_option(key, value);
}
template <auto M>
std::string shown_bool(const ProcessOptions& o) {
  return o.*M ? format_bool(*(o.*M)) : "";
}
template <auto M>
std::string effective_bool(const ProcessOptions& o) {
  return format_bool((o.*M).value_or(false));
}
std::string or_empty(const std::string& s) { return s == "unset" ? "" : s; }

const Row kRows[] = {
    {{"visible_device_list", "", "IDS", "GPU ids this process uses, in logical order, e.g. \"1,0\"", "all"},
     [](ProcessOptions& o, std::string_view, std::string_view v) { o.visible_device_list = normalised_list(v); },
     merge_optional<&ProcessOptions::visible_device_list>,
     [](const ProcessOptions& o) {
       return o.visible_device_list ? str("\"", *o.visible_device_list, "\"") : std::string();
     },
     [](const ProcessOptions& o) {
       const std::string s = normalised_list(o.visible_device_list.value_or(""));
       return s.empty() ? std::string("all") : "\"" + s + "\"";
     }},
    {{"per_process_gpu_memory_fraction", "rate", "FRACTION", "share of each GPU's memory to use, in (0, 1]",
      "all but a reserve"},
     [](ProcessOptions& o, std::string_view key, std::string_view v) {
       o.per_process_gpu_memory_fraction =
           parse_double(key, v, "a fraction of each GPU's memory in (0, 1], e.g. 0.4");
     },
     merge_optional<&ProcessOptions::per_process_gpu_memory_fraction>,
     [](const ProcessOptions& o) {
       return o.per_process_gpu_memory_fraction ? format_number(*o.per_process_gpu_memory_fraction)
                                                : std::string();
     },
     [](const ProcessOptions& o) {
       return o.per_process_gpu_memory_fraction ? format_number(*o.per_process_gpu_memory_fraction)
                                                : std::string("unset");
     }},
    {{"allow_growth", "", "", "GPU pools grow on demand instead of reserving their limit", "false"},
     set_bool<&ProcessOptions::allow_growth>, merge_optional<&ProcessOptions::allow_growth>,
     shown_bool<&ProcessOptions::allow_growth>, effective_bool<&ProcessOptions::allow_growth>},
    {{"memory_growth", "", "ID=BOOL,...", "growth per visible GPU id, e.g. 0=true,1=true", "none"},
     [](ProcessOptions& o, std::string_view, std::string_view v) { o.memory_growth = parse_memory_growth(v); },
     merge_entries<&ProcessOptions::memory_growth>,
     [](const ProcessOptions& o) { return or_empty(format_memory_growth(o.memory_growth)); },
     [](const ProcessOptions& o) { return format_memory_growth(o.memory_growth); }},
    {{"virtual_devices", "", "SPEC",
      "split devices, limits in MiB: \"0:1024,2048;1:\" (N-th GPU in use), \"cpu:512,512\"", "none"},
     [](ProcessOptions& o, std::string_view, std::string_view v) { o.virtual_devices = parse_virtual_devices(v); },
     [](ProcessOptions& into, const ProcessOptions& from) {
       if (from.virtual_devices.gpu_memory_limits_mb)
         into.virtual_devices.gpu_memory_limits_mb = from.virtual_devices.gpu_memory_limits_mb;
       if (from.virtual_devices.cpu_memory_limits_mb)
         into.virtual_devices.cpu_memory_limits_mb = from.virtual_devices.cpu_memory_limits_mb;
     },
     [](const ProcessOptions& o) {
       return o.virtual_devices == VirtualDevices{}
                  ? std::string()
                  : str("\"", format_virtual_devices(o.virtual_devices), "\"");
     },
     [](const ProcessOptions& o) { return format_virtual_devices(o.virtual_devices); }},
    {{"memory_limit", "", "DEVICE=MiB,...", "hard limit per logical device in MiB, e.g. gpu:0=4096,cpu:0=2048",
      "none"},
     [](ProcessOptions& o, std::string_view, std::string_view v) { o.memory_limit_mb = parse_memory_limits(v); },
     merge_entries<&ProcessOptions::memory_limit_mb>,
     [](const ProcessOptions& o) { return or_empty(format_memory_limits(o.memory_limit_mb)); },
     [](const ProcessOptions& o) { return format_memory_limits(o.memory_limit_mb); }},
    {{"device_count", "", "KIND=N,...", "logical CPU devices and a GPU cap, e.g. CPU=2,GPU=1", "CPU=1"},
     [](ProcessOptions& o, std::string_view, std::string_view v) { o.device_count = parse_device_count(v); },
     merge_entries<&ProcessOptions::device_count>,
     [](const ProcessOptions& o) { return or_empty(format_device_count(o.device_count)); },
     [](const ProcessOptions& o) {
       std::map<std::string, int> m = o.device_count;
       m.try_emplace("CPU", 1);  // the default, so an explicit CPU=1 configures the same devices
       return format_device_count(m);
     }},
    {{"allow_soft_placement", "", "", "fall back to an existing device instead of failing", "false"},
     set_bool<&ProcessOptions::allow_soft_placement>, merge_optional<&ProcessOptions::allow_soft_placement>,
     shown_bool<&ProcessOptions::allow_soft_placement>, effective_bool<&ProcessOptions::allow_soft_placement>},
    {{"log_device_placement", "", "", "log the device mapping and where ops run", "false"},
     set_bool<&ProcessOptions::log_device_placement>, merge_optional<&ProcessOptions::log_device_placement>,
     shown_bool<&ProcessOptions::log_device_placement>, effective_bool<&ProcessOptions::log_device_placement>},
    {{"intra_op_threads", "intra_op_parallelism_threads", "N",
      "threads per logical CPU device (0 = split the host's threads)", "0"},
     [](ProcessOptions& o, std::string_view key, std::string_view v) {
       const int n = parse_int(key, v, "a thread count such as 4 (0 = split the host's threads)");
       if (n < 0)
         raise<InvalidArgument>(key, ": ", n, " is negative; use a thread count >= 0 (0 = automatic)");
       o.intra_op_threads = n;
     },
     merge_optional<&ProcessOptions::intra_op_threads>,
     [](const ProcessOptions& o) { return o.intra_op_threads ? str(*o.intra_op_threads) : std::string(); },
     [](const ProcessOptions& o) { return str(o.intra_op_threads.value_or(0)); }},
};

// The row of `name` or of its alias, in any case; null for an unknown name.
const Row* find_row(std::string_view name) {
  const std::string key = lower(trim(name));
  for (const Row& r : kRows)
    if (key == r.info.name || (!r.info.alias.empty() && key == r.info.alias)) return &r;
  return nullptr;
}

}  // namespace

bool parse_bool_option(std::string_view option, std::string_view value) {
  std::string v = lower(trim(value));
  if (v == "true" || v == "1" || v == "yes" || v == "on") return true;
  if (v == "false" || v == "0" || v == "no" || v == "off") return false;
  raise<InvalidArgument>(option, ": '", value, "' is not a boolean; use true or false");
}

// Syntax: entries separated by ';'. "N:MiB,MiB,..." is the N-th GPU in use (an empty list after
// the colon keeps one device with the default limit); "cpu:MiB,MiB,..." lists CPU devices.
VirtualDevices parse_virtual_devices(std::string_view value) {
  constexpr std::string_view kForm =
      "entries such as \"0:1024,2048;1:;cpu:512,512\" (N:limits for the N-th GPU in use, "
      "cpu:limits for the CPU, limits in MiB)";
  VirtualDevices out;
  std::map<int, std::vector<double>> gpus;
  if (trim(value).empty()) return out;
  for (std::string_view entry : split(value, ';')) {
    entry = trim(entry);
    if (entry.empty()) continue;  // tolerate "0:1024;" and ";;"
    auto colon = entry.find(':');
    if (colon == std::string_view::npos)
      raise<InvalidArgument>("virtual_devices: entry '", entry, "' has no 'N:' or 'cpu:' prefix; expected ",
                             kForm);
    std::string key = lower(trim(entry.substr(0, colon)));
    std::string_view list = trim(entry.substr(colon + 1));
    std::vector<double> limits;
    if (!list.empty())
      for (std::string_view item : split(list, ','))
        limits.push_back(parse_mib("virtual_devices", item));
    if (key == "cpu") {
      if (out.cpu_memory_limits_mb)
        raise<InvalidArgument>("virtual_devices: 'cpu' is given twice in '", value,
                               "'; list every CPU device in one entry, e.g. cpu:512,512");
      if (limits.empty())
        raise<InvalidArgument>("virtual_devices: 'cpu:' lists no memory limit in '", value,
                               "'; give one limit in MiB per CPU device, e.g. cpu:512,512");
      out.cpu_memory_limits_mb = limits;
      continue;
    }
    if (key == "gpu" || key == "cuda")
      raise<InvalidArgument>("virtual_devices: entry '", entry,
                             "' names no GPU position; write N:limits with N the GPU's position "
                             "in visible_device_list, e.g. 0:1024,2048");
    int position = parse_int("virtual_devices", key, kForm);
    if (position < 0)
      raise<InvalidArgument>("virtual_devices: GPU position ", position, " is negative; expected ", kForm);
    if (!gpus.emplace(position, limits).second)
      raise<InvalidArgument>("virtual_devices: GPU position ", position, " is given twice in '", value,
                             "'; list each GPU's devices in one entry, e.g. 0:1024,2048");
  }
  if (!gpus.empty()) {
    std::vector<std::vector<double>> list;
    for (const auto& [position, limits] : gpus) {
      if (position != static_cast<int>(list.size()))
        raise<InvalidArgument>("virtual_devices: GPU position ", list.size(), " is missing in '", value,
                               "'; give one entry per GPU in use, numbered from 0 (an empty entry "
                               "such as '", list.size(), ":' keeps a GPU whole)");
      list.push_back(limits);
    }
    out.gpu_memory_limits_mb = std::move(list);
  }
  return out;
}

std::map<Device, double> parse_memory_limits(std::string_view value) {
  std::map<Device, double> out;
  for (std::string_view entry : split(value, ',')) {
    entry = trim(entry);
    if (entry.empty()) continue;
    auto eq = entry.find('=');
    if (eq == std::string_view::npos)
      raise<InvalidArgument>("memory_limit: entry '", entry,
                             "' is not DEVICE=MiB; expected e.g. gpu:0=4096,cpu:0=2048");
    Device d = Device::parse(trim(entry.substr(0, eq)));
    if (!out.emplace(d, parse_mib("memory_limit", entry.substr(eq + 1))).second)
      raise<InvalidArgument>("memory_limit: device ", d, " is given twice in '", value,
                             "'; give one limit per device");
  }
  return out;
}

std::map<std::string, int> parse_device_count(std::string_view value) {
  std::map<std::string, int> out;
  for (std::string_view entry : split(value, ',')) {
    entry = trim(entry);
    if (entry.empty()) continue;
    auto eq = entry.find('=');
    if (eq == std::string_view::npos) eq = entry.find(':');
    if (eq == std::string_view::npos)
      raise<InvalidArgument>("device_count: entry '", entry, "' is not KIND=N; expected e.g. CPU=2,GPU=1");
    std::string kind = upper(trim(entry.substr(0, eq)));
    if (kind != "CPU" && kind != "GPU")
      raise<InvalidArgument>("device_count: unknown device kind '", trim(entry.substr(0, eq)),
                             "'; the kinds are CPU and GPU, e.g. CPU=2,GPU=1");
    int n = parse_int("device_count", entry.substr(eq + 1), "a count such as CPU=2");
    if (n < 0)
      raise<InvalidArgument>("device_count: ", kind, "=", n, " is negative; use a count >= 0");
    if (kind == "CPU" && n == 0)
      raise<InvalidArgument>("device_count: CPU=0 leaves the process without a CPU device; use CPU=1 or more");
    if (!out.emplace(kind, n).second)
      raise<InvalidArgument>("device_count: ", kind, " is given twice in '", value, "'");
  }
  return out;
}

std::map<int, bool> parse_memory_growth(std::string_view value) {
  std::map<int, bool> out;
  for (std::string_view entry : split(value, ',')) {
    entry = trim(entry);
    if (entry.empty()) continue;
    auto eq = entry.find('=');
    if (eq == std::string_view::npos)
      raise<InvalidArgument>("memory_growth: entry '", entry,
                             "' is not GPU_ID=true|false; expected e.g. 0=true,1=true");
    int id = parse_int("memory_growth", entry.substr(0, eq), "a visible GPU id such as 0=true");
    if (id < 0) raise<InvalidArgument>("memory_growth: GPU id ", id, " is negative; use a visible GPU id");
    if (!out.emplace(id, parse_bool_option("memory_growth", entry.substr(eq + 1))).second)
      raise<InvalidArgument>("memory_growth: GPU ", id, " is given twice in '", value, "'");
  }
  return out;
}

bool is_process_option(std::string_view name) { return find_row(name) != nullptr; }

void set_process_option(ProcessOptions& opts, std::string_view name, std::string_view value) {
  const Row* row = find_row(name);
  if (!row) {
    std::string names;
    for (const Row& r : kRows) {
      names += str(names.empty() ? "" : &r == &kRows[std::size(kRows) - 1] ? " and " : ", ", r.info.name);
      if (!r.info.alias.empty()) names += str(" (or ", r.info.alias, ")");
    }
    raise<InvalidArgument>("unknown process option '", name, "'; the options are ", names);
  }
  row->set(opts, lower(trim(name)), trim(value));
}

std::optional<std::string> process_option_flag(const OptionMention& m) {
  constexpr std::string_view kPrefix = "ProcessOptions::";
  if (!m.field.starts_with(kPrefix)) return std::nullopt;
  std::string_view name = m.field.substr(kPrefix.size());
  if (name == "memory_limit_mb") name = "memory_limit";
  if (!find_row(name)) return std::nullopt;
  std::string out = str("--", name);
  if (!m.entry.empty())  // a device's entry, spelt without the slash: gpu:1=4096
    out += str(" ", m.entry.substr(m.entry.front() == '/' ? 1 : 0), "=",
               m.value.empty() ? std::string("<MiB>") : std::string(m.value));
  else if (!m.value.empty() && m.value != "true")
    out += str(m.value == "false" ? "=" : " ", m.value);
  return out;
}

const std::vector<ProcessOptionInfo>& process_option_table() {
  static const std::vector<ProcessOptionInfo> infos = [] {
    std::vector<ProcessOptionInfo> out;
    for (const Row& r : kRows) out.push_back(r.info);
    return out;
  }();
  return infos;
}

ProcessOptions ProcessOptions::parse_ini(std::string_view text, std::string_view source) {
  return from_ini_entries(read_ini(text, source).entries, source);
}

ProcessOptions ProcessOptions::from_ini_entries(const std::vector<IniEntry>& entries, std::string_view source) {
  ProcessOptions opts;
  std::map<std::string, int> seen;  // canonical option -> line, to reject an option given twice
  auto canonical = [](const std::string& key) { return std::string(find_row(key)->info.name); };
  for (const IniEntry& e : entries) {
    std::string section = lower(e.section);
    bool ours = e.section.empty() || section == "gpu" || section == "cpu" || section == "devices" ||
                section == "session" || section == "process";
    // configparser gives [DEFAULT]'s keys to every section, ours included; keys that are not
    // process options belong to the other sections' programs.
    if (e.section == "DEFAULT") ours = is_process_option(e.key);
    if (!ours) continue;
    try {
      set_process_option(opts, e.key, ini_option_value(e));
    } catch (const InvalidArgument& err) {
      raise_ini_value_error(source, e, err.what());
    }
    auto [it, fresh] = seen.emplace(canonical(e.key), e.line);
    if (!fresh)
      raise<InvalidArgument>(source, ":", e.line, ": option ", canonical(e.key), " is already set on line ",
                             it->second, "; keep one of the two");
  }
  return opts;
}

ProcessOptions ProcessOptions::from_ini(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    raise<NotFound>("cannot open the options file '", path, "'; check the path");
  std::stringstream buffer;
  buffer << in.rdbuf();
  return parse_ini(buffer.str(), path);
}

ProcessOptions ProcessOptions::merged_with(const ProcessOptions& o) const {
  ProcessOptions m = *this;
  for (const Row& r : kRows) r.merge(m, o);
  return m;
}

ProcessOptions apply_force_gpu_allow_growth(ProcessOptions opts, const char* value, bool warn) {
  if (value == nullptr) return opts;
  std::string v = lower(trim(value));
  if (v != "true" && v != "false")
    raise<InvalidArgument>("TOWERFLOW_FORCE_GPU_ALLOW_GROWTH='", value,
                           "' is not valid; set it to true or false, or unset it");
  bool forced = v == "true";
  std::string original = opts.allow_growth ? format_bool(*opts.allow_growth) : "unset (false)";
  if (!opts.memory_growth.empty()) original += str(", memory_growth ", format_memory_growth(opts.memory_growth));
  if (warn)
    log_warning(str("overriding allow_growth with ", format_bool(forced),
                  " because TOWERFLOW_FORCE_GPU_ALLOW_GROWTH is set; the options said ", original));
  opts.allow_growth = forced;
  opts.memory_growth.clear();
  return opts;
}

ProcessOptions apply_environment(ProcessOptions opts, bool warn) {
  return apply_force_gpu_allow_growth(std::move(opts), std::getenv("TOWERFLOW_FORCE_GPU_ALLOW_GROWTH"), warn);
}

std::vector<std::string> option_differences(const ProcessOptions& a, const ProcessOptions& b) {
  std::vector<std::string> out;
  for (const Row& r : kRows) {
    const std::string x = r.effective(a), y = r.effective(b);
    if (x != y) out.push_back(str(r.info.name, ": ", x, " vs ", y));
  }
  return out;
}

std::string to_string(const ProcessOptions& o) {
  std::string out;
  for (const Row& r : kRows)
    if (const std::string v = r.shown(o); !v.empty()) out += str(out.empty() ? "" : " ", r.info.name, "=", v);
  return out.empty() ? "defaults" : out;
}

}  // namespace towerflow
