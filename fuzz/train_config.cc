// The trainer's --config file: [train] keys, training keys at the top, and device sections,
// read once as configparser reads them (examples/cifar10/train_options.cc parse_config).
#include "examples/cifar10/train_options.h"
#include "fuzz/fuzz_util.h"

namespace tw = towerflow;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  tw::fuzz::expect_user_errors_only([&] {
    tw::cifar10::Config c = tw::cifar10::parse_config(tw::fuzz::text_of(data, size), "fuzz.ini");
    (void)tw::cifar10::to_json(c.train);
  });
  return 0;
}
