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
  for (const ProcessOptionInfo& o : process_option_table())
    add(app, opts, std::string(o.name), std::string(o.help), std::string(o.value_form), o.value_form.empty());
}

}  // namespace towerflow
