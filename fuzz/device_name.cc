// Device names as users write them (--devices, memory limits, placement): "/gpu:1",
// "/device:GPU:1", "/job:localhost/replica:0/task:0/device:GPU:1", "cuda:1", ...
// A name that parses prints in both forms, and both parse back to the same device.
#include "core/device.h"
#include "fuzz/fuzz_util.h"

namespace tw = towerflow;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  tw::fuzz::expect_user_errors_only([&] {
    tw::Device d = tw::Device::parse(tw::fuzz::text_of(data, size));
    TW_CHECK(tw::Device::parse(d.str()) == d, "short form ", d.str(), " does not parse back");
    TW_CHECK(tw::Device::parse(d.full_name()) == d, "full name ", d.full_name(), " does not parse back");
  });
  return 0;
}
