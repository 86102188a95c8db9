#pragma once
// ProcessOptions: the process-wide device and memory options, TensorFlow's ConfigProto/GPUOptions
// as one struct, settable from code, an INI file and command-line flags.
//
//   auto opts = ProcessOptions{.visible_device_list = "1,0", .allow_growth = true};
//   auto file = ProcessOptions::from_ini("train.ini");
//   auto both = file.merged_with(flags);          // flags win over the file
//
// Every field is optional: an unset field takes its default when devices are resolved (see
// core/platform/logical.h for the semantics and validation). Parsing functions here check syntax
// only (a malformed number, an unknown key) and throw InvalidArgument naming the option, the value
// and the expected form; whether values fit the machine is checked when devices are resolved.

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "core/platform/ini.h"

namespace CLI {
class App;
}

namespace towerflow {

// Virtual devices: one physical device split into several logical ones, each with a hard memory
// limit in MiB (TensorFlow's GPUOptions.Experimental.virtual_devices, and the same for the host).
struct VirtualDevices {
  // Entry i applies to the i-th GPU in use (the i-th id of visible_device_list, or visible GPU i
  // when the list is unset), as TensorFlow's virtual_devices list does. Each entry lists the
  // memory limits of that GPU's logical devices; an empty entry means one logical device with
  // the GPU's default limit. When set, there must be exactly one entry per GPU in use.
  std::optional<std::vector<std::vector<double>>> gpu_memory_limits_mb{};
  // One logical CPU device per entry, each with this memory limit.
  std::optional<std::vector<double>> cpu_memory_limits_mb{};

  bool operator==(const VirtualDevices&) const = default;
};

struct ProcessOptions {
  // Which of the GPUs this process sees (after CUDA_VISIBLE_DEVICES) become logical GPUs, in
  // this order: "1,0" makes visible GPU 1 the logical /gpu:0. Unset or empty: all, in order.
  std::optional<std::string> visible_device_list{};
  // The share of each GPU's total memory its allocator may use, in (0, 1]. Unset: the memory
  // free at the device's first allocation less a system reserve (TensorFlow's heuristic: 225 MiB
  // to 1.5 GiB by free memory and compute capability); with growth, the total memory less that
  // reserve (logical.h). Cannot be combined with GPU virtual devices.
  std::optional<double> per_process_gpu_memory_fraction{};
  // GPU allocators grow in doubling regions up to their limit (true) or reserve the whole limit
  // at first use (false, the default as in TensorFlow). CPU allocators always grow: host memory
  // is never reserved up front. TOWERFLOW_FORCE_GPU_ALLOW_GROWTH=true|false overrides it.
  std::optional<bool> allow_growth{};
  // Growth per GPU, keyed by visible GPU id (TensorFlow 2's set_memory_growth). Every GPU in use
  // must end up with the same growth (these entries, else allow_growth).
  std::map<int, bool> memory_growth{};
  VirtualDevices virtual_devices{};
  // Hard memory limits per logical device, in MiB (e.g. /gpu:1 = 4096, /cpu:0 = 2048); they win
  // over the fraction and the virtual-device limit of that device.
  std::map<Device, double> memory_limit_mb{};
  // TensorFlow's device_count map: "CPU" -> number of logical CPU devices (default 1), "GPU" ->
  // the most GPUs to use (default all). Keys are upper case.
  std::map<std::string, int> device_count{};
  // A device that does not exist falls back to one that does (and says so), instead of an error.
  std::optional<bool> allow_soft_placement{};
  // Log the device mapping at initialisation and where each op of a tower runs.
  std::optional<bool> log_device_placement{};
  // Intra-op threads of each logical CPU device. Unset or 0: the host's hardware threads split
  // evenly over the logical CPU devices (at least one each).
  std::optional<int> intra_op_threads{};

  // Reads an INI file as Python's configparser does (core/platform/ini.h: `key = value` or
  // `key: value`, keys in any case, `#` and `;` comment lines). Keys are the option names above
  // (flag syntax for values) plus TensorFlow-tutorial aliases: `rate`
  // (per_process_gpu_memory_fraction) and `intra_op_parallelism_threads`. Keys are read at the
  // top of the file and in the sections [gpu], [cpu], [devices], [session] and [process] (in any
  // case); [DEFAULT]'s keys that are option names are read too; other sections belong to other
  // programs and are skipped (but must still be INI that configparser reads). A line configparser
  // refuses, an unknown key, a bad value or an option given twice throws InvalidArgument naming
  // the file, the line and the fix; a missing file throws NotFound.
  static ProcessOptions from_ini(const std::string& path);
  static ProcessOptions parse_ini(std::string_view text, std::string_view source = "<ini>");
  // The same from entries read_ini returned (a program with its own sections reads the file
  // once and passes the entries that are not its own).
  static ProcessOptions from_ini_entries(const std::vector<IniEntry>& entries, std::string_view source);

  // This options object with every field set in `overrides` replaced by it (map entries merge
  // key by key, the override's entries winning). Used as file.merged_with(flags).
  ProcessOptions merged_with(const ProcessOptions& overrides) const;

  bool operator==(const ProcessOptions&) const = default;
};

// One process option as the flags, INI files and --help know it. The list is the one table every
// function here walks (options.cc): an option is added there and nowhere else.
struct ProcessOptionInfo {
  std::string_view name;          // the flag and INI key ("memory_limit")
  std::string_view alias;         // the TensorFlow tutorials' INI spelling ("rate"), or empty
  std::string_view value_form;    // the flag's value ("DEVICE=MiB,..."); empty for a switch
  std::string_view help;          // one line
  std::string_view default_text;  // what leaving it unset means, as --help shows it
};
const std::vector<ProcessOptionInfo>& process_option_table();

// Adds the option flags, writing into `opts` as they are parsed: --visible_device_list,
// --per_process_gpu_memory_fraction, --allow_growth[=true|false], --memory_growth 0=true,1=true,
// --virtual_devices "0:1024,2048;1:;cpu:512,512", --memory_limit gpu:0=4096,cpu:0=2048,
// --device_count CPU=2,GPU=1, --allow_soft_placement, --log_device_placement,
// --intra_op_threads N. Bad values raise CLI::ValidationError carrying the message.
// `opts` must outlive the parse.
void add_process_option_flags(CLI::App& app, ProcessOptions& opts);

// The flag of add_process_option_flags for a ProcessOptions field named in a library message
// (core/error.h's render_options): "ProcessOptions::memory_limit_mb[/gpu:1]" is
// "--memory_limit gpu:1=<MiB>", "ProcessOptions::allow_growth = true" is "--allow_growth",
// "ProcessOptions::device_count = CPU=2" is "--device_count CPU=2"; nullopt for another field.
std::optional<std::string> process_option_flag(const OptionMention& mention);

// Whether `name` (in any case) is a process option or one of its INI aliases.
bool is_process_option(std::string_view name);

// Sets one option from its flag/INI spelling (name without dashes, value as text). Throws
// InvalidArgument for an unknown name or a bad value. The INI reader and the flags use it.
void set_process_option(ProcessOptions& opts, std::string_view name, std::string_view value);

// Value parsers shared by the flags and the INI reader (exposed for tests and other tools).
bool parse_bool_option(std::string_view option, std::string_view value);
VirtualDevices parse_virtual_devices(std::string_view value);
std::map<Device, double> parse_memory_limits(std::string_view value);
std::map<std::string, int> parse_device_count(std::string_view value);
std::map<int, bool> parse_memory_growth(std::string_view value);

// Applies TOWERFLOW_FORCE_GPU_ALLOW_GROWTH (`value`, null when unset): "true" or "false"
// replaces allow_growth (and any memory_growth entries) and logs a warning naming the original
// setting (unless `warn` is false); anything else throws InvalidArgument.
ProcessOptions apply_force_gpu_allow_growth(ProcessOptions opts, const char* value, bool warn = true);
// The same, reading the environment.
ProcessOptions apply_environment(ProcessOptions opts, bool warn = true);

// The options whose effective values differ (unset counts as its default), each as
// "name: A vs B"; empty when the two configure devices identically.
std::vector<std::string> option_differences(const ProcessOptions& a, const ProcessOptions& b);

// A one-line summary of the set options ("visible_device_list=1,0 allow_growth=true"), or
// "defaults".
std::string to_string(const ProcessOptions& opts);

}  // namespace towerflow
