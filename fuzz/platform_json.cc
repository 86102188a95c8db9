// Described platforms (--platform FILE.json: "4 GPUs of 16 GiB, these PCI bus ids").
#include "core/platform/platform.h"
#include "fuzz/fuzz_util.h"

namespace tw = towerflow;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  tw::fuzz::expect_user_errors_only([&] {
    auto platform = tw::parse_platform_json(tw::fuzz::text_of(data, size), "fuzz.json");
    (void)platform->name();
  });
  return 0;
}
