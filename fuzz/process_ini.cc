// INI files of process options (--config of towerflow_devices, ProcessOptions::from_ini): the
// configparser-compatible reader (core/platform/ini.h) and the options read from it.
#include "core/platform/ini.h"
#include "core/platform/options.h"
#include "fuzz/fuzz_util.h"

namespace tw = towerflow;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text = tw::fuzz::text_of(data, size);
  tw::fuzz::expect_user_errors_only([&] {
    tw::IniFile ini = tw::read_ini(text, "fuzz.ini");
    int previous = 0;
    for (const tw::IniEntry& e : ini.entries) {
      TW_CHECK(e.line > previous && e.last_line >= e.line, "entry lines out of order at line ", e.line);
      TW_CHECK(!e.key.empty(), "an entry with an empty key at line ", e.line);
      previous = e.last_line;
      (void)tw::ini_option_value(e);
    }
  });
  tw::fuzz::expect_user_errors_only([&] {
    tw::ProcessOptions opts = tw::ProcessOptions::parse_ini(text, "fuzz.ini");
    (void)tw::to_string(opts);
    TW_CHECK(tw::option_differences(opts, opts).empty(), "options differ from themselves");
  });
  return 0;
}
