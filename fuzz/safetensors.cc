// safetensors files (checkpoints, --init_from, PyTorch's state_dicts): the header's JSON, the
// offsets, dtypes and shapes. An accepted file's every tensor lies inside the data.
#include "fuzz/fuzz_util.h"
#include "io/safetensors.h"

namespace tw = towerflow;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  tw::fuzz::expect_user_errors_only([&] {
    auto file = tw::io::SafetensorsFile::parse(std::string(tw::fuzz::text_of(data, size)), "fuzz.safetensors");
    for (const auto& e : file.entries()) {
      auto bytes = file.data(e);
      TW_CHECK(bytes.size() == static_cast<std::size_t>(tw::io::numel_of(e.shape)) * tw::io::dtype_size(e.dtype),
               "tensor ", e.name, " has ", bytes.size(), " bytes for shape ", tw::io::shape_string(e.shape));
      TW_CHECK(file.find(e.name) != nullptr, "tensor ", e.name, " is listed but not found");
    }
  });
  return 0;
}
