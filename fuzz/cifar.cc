// CIFAR-10/100 binary files (--data_dir): the first byte picks CIFAR-10 or CIFAR-100, the rest
// is the test split's file. An accepted file reads back item by item.
#include <vector>

#include "data/cifar.h"
#include "fuzz/fuzz_util.h"

namespace tw = towerflow;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const bool hundred = data[0] & 1;
  const auto dir = tw::fuzz::scratch_dir() / (hundred ? "cifar-100-binary" : "cifar-10-batches-bin");
  tw::fuzz::write_file(dir / (hundred ? "test.bin" : "test_batch.bin"), data + 1, size - 1);
  tw::fuzz::expect_user_errors_only([&] {
    std::vector<std::uint8_t> pixels(tw::data::CifarBinary::kPixelBytes);
    auto read_all = [&](const tw::data::CifarBinary& set) {
      for (std::int64_t i = 0; i < set.size(); ++i) {
        std::int32_t label = set.read(i, pixels);
        TW_CHECK(label >= 0 && label < set.num_classes(), "label ", label, " of item ", i);
      }
    };
    // The parent folder, as users pass it (the reader finds the format's subfolder).
    if (hundred)
      read_all(tw::data::Cifar100(tw::fuzz::scratch_dir(), tw::data::Split::Test));
    else
      read_all(tw::data::Cifar10(tw::fuzz::scratch_dir(), tw::data::Split::Test));
  });
  return 0;
}
