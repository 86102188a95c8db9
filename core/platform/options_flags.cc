// The CLI11 side of ProcessOptions, kept out of options.h so that users of the options need not
// see CLI11.
#include <CLI/CLI.hpp>

#include <memory>

#include "core/error.h"
#include "core/platform/options.h"

namespace towerflow {
namespace {

// Every flag funnels into set_process_option, so flags and INI files accept the same values;
// its InvalidArgument becomes the ValidationError CLI11 programs already report.
void add(CLI::App& app, ProcessOptions& opts, const std::string& name, const std::string& help,
         const std::string& type = "", bool is_switch = false) {
  auto setter = [&opts, name](const std::string& value) {
    try {
      set_process_option(opts, name, value);
    } catch (const Error& e) {
      throw CLI::ValidationError("--" + name, e.what());
    }
  };
  if (is_switch) {
    // "--allow_growth" means true; "--allow_growth=false" is accepted too.
    // The flag's string target is only a carrier; each() receives the value as written.
    auto carrier = std::make_shared<std::string>();
    app.add_flag("--" + name + "{true}", *carrier, help)
        ->each([setter, carrier](const std::string& value) { setter(value); })
        ->group("Devices");
  } else {
    app.add_option_function<std::string>("--" + name, setter, help)->type_name(type)->group("Devices");
  }
}

}  // namespace

void add_process_option_flags(CLI::App& app, ProcessOptions& opts) {
  add(app, opts, "visible_device_list", "GPU ids this process uses, in logical order, e.g. \"1,0\"", "IDS");
  add(app, opts, "per_process_gpu_memory_fraction", "share of each GPU's memory to use, in (0, 1]", "FRACTION");
  add(app, opts, "allow_growth", "GPU pools grow on demand instead of reserving their limit", "", true);
  add(app, opts, "memory_growth", "growth per visible GPU id, e.g. 0=true,1=true", "ID=BOOL,...");
  add(app, opts, "virtual_devices",
      "split devices, limits in MiB: \"0:1024,2048;1:\" (N-th GPU in use), \"cpu:512,512\"", "SPEC");
  add(app, opts, "memory_limit", "hard limit per logical device in MiB, e.g. gpu:0=4096,cpu:0=2048", "DEVICE=MiB,...");
  add(app, opts, "device_count", "logical CPU devices and a GPU cap, e.g. CPU=2,GPU=1", "KIND=N,...");
  add(app, opts, "allow_soft_placement", "fall back to an existing device instead of failing", "", true);
  add(app, opts, "log_device_placement", "log the device mapping and where ops run", "", true);
  add(app, opts, "intra_op_threads", "threads per logical CPU device (0 = split the host's threads)", "N");
}

}  // namespace towerflow
