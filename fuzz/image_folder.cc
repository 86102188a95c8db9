// JPEG and PNG files through the image-folder reader (--data_dir with class folders): the file
// is the one image of class "a"; the first byte picks the output size (0: the image's own,
// otherwise a resize to N x N) and whether decoded pixels are cached.
#include <vector>

#include "data/image_folder.h"
#include "fuzz/fuzz_util.h"

namespace tw = towerflow;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const auto root = tw::fuzz::scratch_dir() / "images";
  const bool png = size > 2 && data[1] == 0x89;
  std::filesystem::remove_all(root);
  tw::fuzz::write_file(root / "a" / (png ? "x.png" : "x.jpg"), data + 1, size - 1);
  tw::fuzz::expect_user_errors_only([&] {
    const int side = data[0] % 8 == 0 ? 0 : data[0] % 8 * 4;
    tw::data::ImageFolder folder(root, {.height = side, .width = side, .cache = (data[0] & 0x80) != 0, .threads = 1});
    std::vector<std::uint8_t> pixels(folder.shape().bytes());
    for (std::int64_t i = 0; i < folder.size(); ++i) (void)folder.read(i, pixels);
  });
  return 0;
}
