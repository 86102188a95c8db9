#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/log.h"
#include "data/image_codec.h"
#include "data/image_folder.h"
#include "data/open.h"
#include "tests/data/helpers.h"

namespace fs = std::filesystem;
using namespace towerflow;
using namespace towerflow::data;
using testing::TempDir;
using testing::require_throws_mentioning;
using testing::write_file;

namespace {

Image pattern(int h, int w, int c, int seed) {
  Image img{.h = h, .w = w, .c = c, .pixels = std::vector<std::uint8_t>(static_cast<std::size_t>(h) * w * c)};
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int k = 0; k < c; ++k)
        img.pixels[(static_cast<std::size_t>(y) * w + x) * c + k] = static_cast<std::uint8_t>(seed * 31 + y * 5 + x * 3 + k * 60);
  return img;
}

// A smooth image, which JPEG reproduces closely.
Image smooth(int h, int w, int seed) {
  Image img{.h = h, .w = w, .c = 3, .pixels = std::vector<std::uint8_t>(static_cast<std::size_t>(h) * w * 3)};
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int k = 0; k < 3; ++k)
        img.pixels[(static_cast<std::size_t>(y) * w + x) * 3 + k] =
            static_cast<std::uint8_t>(60 + 20 * seed + 3 * y + 2 * x + 10 * k);
  return img;
}

int max_abs_diff(const std::vector<std::uint8_t>& a, const std::vector<std::uint8_t>& b) {
  REQUIRE(a.size() == b.size());
  int m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(int(a[i]) - int(b[i])));
  return m;
}

}  // namespace

TEST_CASE("PNG decoding is exact, converts grey and drops alpha", "[data][codec]") {
  const Image rgb = pattern(5, 7, 3, 1);
  const Image back = decode_image(encode_png(rgb), "rgb.png");
  CHECK(back.h == 5);
  CHECK(back.w == 7);
  CHECK(back.c == 3);
  CHECK(back.pixels == rgb.pixels);

  const Image grey = pattern(4, 4, 1, 2);
  const Image grey_rgb = decode_image(encode_png(grey), "grey.png");
  REQUIRE(grey_rgb.c == 3);
  for (int p = 0; p < 16; ++p)
    for (int k = 0; k < 3; ++k) CHECK(grey_rgb.pixels[3 * p + k] == grey.pixels[p]);

  Image rgba = pattern(3, 3, 4, 3);
  for (int p = 0; p < 9; ++p) rgba.pixels[4 * p + 3] = static_cast<std::uint8_t>(p * 20);  // varying alpha
  const Image no_alpha = decode_image(encode_png(rgba), "rgba.png");
  for (int p = 0; p < 9; ++p)
    for (int k = 0; k < 3; ++k) CHECK(no_alpha.pixels[3 * p + k] == rgba.pixels[4 * p + k]);
}

TEST_CASE("JPEG decoding reproduces a smooth image closely and reads headers", "[data][codec]") {
  const Image img = smooth(16, 24, 0);
  const auto bytes = encode_jpeg(img, 95);
  CHECK(sniff_format(bytes) == ImageFormat::Jpeg);
  const Image back = decode_image(bytes, "smooth.jpg");
  REQUIRE(back.h == 16);
  REQUIRE(back.w == 24);
  CHECK(max_abs_diff(back.pixels, img.pixels) <= 6);
  const Image header = decode_header(bytes, "smooth.jpg");
  CHECK(header.h == 16);
  CHECK(header.w == 24);
  CHECK(header.pixels.empty());
}

TEST_CASE("Corrupt, truncated and foreign files are DataErrors naming the file", "[data][codec]") {
  auto jpeg = encode_jpeg(smooth(32, 32, 1), 90);
  auto png = encode_png(pattern(32, 32, 3, 1));
  SECTION("truncated JPEG (libjpeg would fill it with grey)") {
    jpeg.resize(jpeg.size() / 2);
    require_throws_mentioning<DataError>([&] { decode_image(jpeg, "half.jpg"); }, {"half.jpg", "JPEG"});
  }
  SECTION("truncated PNG") {
    png.resize(png.size() / 2);
    require_throws_mentioning<DataError>([&] { decode_image(png, "half.png"); }, {"half.png", "PNG"});
  }
  SECTION("PNG with a corrupted data chunk") {
    png[png.size() - 20] ^= 0xFF;
    require_throws_mentioning<DataError>([&] { decode_image(png, "flipped.png"); }, {"flipped.png"});
  }
  SECTION("not an image") {
    const std::vector<std::uint8_t> text = {'h', 'e', 'l', 'l', 'o'};
    require_throws_mentioning<DataError>([&] { decode_image(text, "notes.jpg"); },
                                         {"notes.jpg", "neither JPEG nor PNG"});
  }
}

namespace {

// PNG's chunk CRC (ISO 3309 / zlib's crc32), to keep a patched IHDR valid.
std::uint32_t png_crc(const std::uint8_t* p, std::size_t n) {
  std::uint32_t c = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return c ^ 0xFFFFFFFFu;
}

void put_be16(std::uint8_t* p, std::uint32_t v) { p[0] = std::uint8_t(v >> 8), p[1] = std::uint8_t(v); }
void put_be32(std::uint8_t* p, std::uint32_t v) { put_be16(p, v >> 16), put_be16(p + 2, v); }

}  // namespace

// Found by fuzz/image_folder: a 429-byte PNG claiming 30000 x 30000 pixels made the reader
// allocate 2.7 GB (Note [Decompression bombs] in data/image_codec.cc).
TEST_CASE("Images that claim more pixels than kMaxImagePixels are refused before decoding", "[data][codec]") {
  auto png = encode_png(pattern(4, 4, 3, 1));
  put_be32(&png[16], 30000);  // IHDR: width, height, then its CRC over type and data
  put_be32(&png[20], 30000);
  put_be32(&png[29], png_crc(&png[12], 17));
  for (bool header_only : {false, true})
    require_throws_mentioning<DataError>(
        [&] { header_only ? decode_header(png, "bomb.png") : decode_image(png, "bomb.png"); },
        {"bomb.png", "30000x30000", "decompression bomb"});

  auto jpeg = encode_jpeg(smooth(8, 8, 1), 90);
  const std::uint8_t sof0[] = {0xFF, 0xC0};  // baseline start of frame, before any entropy-coded data
  auto sof = std::search(jpeg.begin(), jpeg.end(), std::begin(sof0), std::end(sof0));
  REQUIRE(sof != jpeg.end());
  put_be16(&*(sof + 5), 60000);  // SOF0: marker, length, precision, then height and width
  put_be16(&*(sof + 7), 60000);
  for (bool header_only : {false, true})
    require_throws_mentioning<DataError>(
        [&] { header_only ? decode_header(jpeg, "bomb.jpg") : decode_image(jpeg, "bomb.jpg"); },
        {"bomb.jpg", "60000x60000", "decompression bomb"});

  // The limit itself: as many pixels as PIL accepts before DecompressionBombError.
  CHECK(kMaxImagePixels == 178956970);
}

TEST_CASE("Bilinear resize: identity, 2x2 averaging when halving, exact on linear ramps", "[data][codec]") {
  const Image img = pattern(6, 8, 3, 4);
  CHECK(resize_bilinear(img, 6, 8).pixels == img.pixels);

  // Halving: output (y, x) samples source (2y + 0.5, 2x + 0.5), the mean of a 2x2 block.
  const Image half = resize_bilinear(img, 3, 4);
  for (int y = 0; y < 3; ++y)
    for (int x = 0; x < 4; ++x)
      for (int k = 0; k < 3; ++k) {
        auto at = [&](int yy, int xx) { return int(img.pixels[(yy * 8 + xx) * 3 + k]); };
        const double mean = (at(2 * y, 2 * x) + at(2 * y, 2 * x + 1) + at(2 * y + 1, 2 * x) + at(2 * y + 1, 2 * x + 1)) / 4.0;
        CHECK(std::abs(half.pixels[(y * 4 + x) * 3 + k] - mean) <= 0.5);
      }

  // Doubling a horizontal ramp v = 8x: interior outputs lie on the ramp at source x = (o + 0.5)/2 - 0.5.
  Image ramp{.h = 1, .w = 8, .c = 1, .pixels = {}};
  for (int x = 0; x < 8; ++x) ramp.pixels.push_back(static_cast<std::uint8_t>(8 * x));
  const Image up = resize_bilinear(ramp, 1, 16);
  for (int o = 0; o < 16; ++o) {
    const double s = std::clamp((o + 0.5) / 2 - 0.5, 0.0, 7.0);
    CHECK(std::abs(up.pixels[o] - 8 * s) <= 0.5);
  }
}

namespace {

// root/<class>/... with the given file bytes.
void make_folder(const fs::path& root) {
  write_file(root / "zebra/b.png", encode_png(pattern(8, 8, 3, 1)));
  write_file(root / "zebra/a.PNG", encode_png(pattern(8, 8, 3, 2)));
  write_file(root / "ant/nested/deep.png", encode_png(pattern(8, 8, 3, 3)));
  write_file(root / "ant/x.jpg", encode_jpeg(smooth(8, 8, 4), 95));
  write_file(root / "ant/readme.txt", {'h', 'i'});
  write_file(root / "moth/m.jpeg", encode_jpeg(smooth(8, 8, 5), 95));
}

}  // namespace

TEST_CASE("Image folder: classes sorted by name, files sorted and found recursively, others ignored",
          "[data][folder]") {
  TempDir tmp;
  make_folder(tmp.path());
  ImageFolder folder(tmp.path());
  CHECK(folder.class_names() == std::vector<std::string>{"ant", "moth", "zebra"});
  REQUIRE(folder.size() == 5);
  CHECK(folder.shape() == ImageShape{8, 8, 3});
  CHECK(folder.path(0) == tmp / "ant/nested/deep.png");
  CHECK(folder.path(1) == tmp / "ant/x.jpg");
  CHECK(folder.path(2) == tmp / "moth/m.jpeg");
  CHECK(folder.path(3) == tmp / "zebra/a.PNG");
  CHECK(folder.path(4) == tmp / "zebra/b.png");
  const std::vector<std::int32_t> expected_labels = {0, 0, 1, 2, 2};
  std::vector<std::uint8_t> img(192);
  for (int i = 0; i < 5; ++i) CHECK(folder.read(i, img) == expected_labels[i]);
  folder.read(3, img);
  CHECK(img == pattern(8, 8, 3, 2).pixels);
  folder.read(1, img);
  CHECK(max_abs_diff(img, smooth(8, 8, 4).pixels) <= 6);

  ImageFolder cached(tmp.path(), {.cache = true});
  std::vector<std::uint8_t> again(192);
  for (int i = 0; i < 5; ++i) {
    folder.read(i, img);
    cached.read(i, again);
    CHECK(img == again);
  }
}

TEST_CASE("Image folder: images of another size are resized or rejected by option", "[data][folder]") {
  TempDir tmp;
  make_folder(tmp.path());
  const Image big = pattern(16, 16, 3, 9);
  write_file(tmp / "moth/big.png", encode_png(big));

  ImageFolder resized(tmp.path(), {.height = 8, .width = 8});
  REQUIRE(resized.size() == 6);
  std::vector<std::uint8_t> img(192);
  resized.read(2, img);  // moth/big.png sorts before moth/m.jpeg
  CHECK(img == resize_bilinear(big, 8, 8).pixels);
  CHECK(resized.describe().find("8x8: images of another size resized bilinearly to 8x8") != std::string::npos);

  require_throws_mentioning<DataError>(
      [&] { ImageFolder(tmp.path(), {.height = 8, .width = 8, .wrong_size = SizePolicy::Reject}); },
      {(tmp / "moth/big.png").string(), "16x16", "expected 8x8"});

  std::string warning;
  auto previous = set_log_sink([&](LogLevel, std::string_view m) { warning = m; });
  ImageFolder skipped(tmp.path(), {.wrong_size = SizePolicy::Reject, .bad_files = BadFilePolicy::Skip});
  set_log_sink(previous);
  CHECK(warning.find("skipped 1 of 6") != std::string::npos);
  CHECK(skipped.size() == 5);
  REQUIRE(skipped.skipped().size() == 1);
  CHECK(skipped.skipped()[0].path == tmp / "moth/big.png");
  CHECK(skipped.describe().find("resized") == std::string::npos);

  // Upscaling to a requested size.
  ImageFolder up(tmp.path(), {.height = 12, .width = 10});
  CHECK(up.shape() == ImageShape{12, 10, 3});
  std::vector<std::uint8_t> up_img(up.shape().bytes());
  up.read(4, up_img);  // zebra/a.PNG
  CHECK(up_img == resize_bilinear(pattern(8, 8, 3, 2), 12, 10).pixels);
}

TEST_CASE("Image folder: undecodable files are fatal by default, or skipped with a count", "[data][folder]") {
  TempDir tmp;
  make_folder(tmp.path());
  auto truncated = encode_jpeg(smooth(8, 8, 6), 95);
  truncated.resize(truncated.size() / 2);
  write_file(tmp / "zebra/c_truncated.jpg", truncated);
  write_file(tmp / "ant/y_garbage.png", {1, 2, 3, 4, 5, 6, 7, 8, 9});

  require_throws_mentioning<DataError>([&] { ImageFolder(tmp.path()); },
                                       {(tmp / "ant/y_garbage.png").string(), "skip"});

  std::vector<std::string> warnings;
  auto previous = set_log_sink([&](LogLevel level, std::string_view m) {
    if (level == LogLevel::Warning) warnings.emplace_back(m);
  });
  ImageFolder folder(tmp.path(), {.bad_files = BadFilePolicy::Skip, .threads = 2});
  set_log_sink(previous);
  CHECK(folder.size() == 5);
  REQUIRE(folder.skipped().size() == 2);
  CHECK(folder.skipped()[0].path == tmp / "ant/y_garbage.png");
  CHECK(folder.skipped()[1].path == tmp / "zebra/c_truncated.jpg");
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find("skipped 2 of 7") != std::string::npos);
  CHECK(folder.describe().find("2 skipped") != std::string::npos);

  // Without validation the bad file surfaces when it is read, still naming the path.
  ImageFolder lazy(tmp.path(), {.validate = false});
  CHECK(lazy.size() == 7);
  std::vector<std::uint8_t> img(192);
  require_throws_mentioning<DataError>([&] { lazy.read(2, img); }, {(tmp / "ant/y_garbage.png").string()});
}

TEST_CASE("Image folder: bad layouts and options are reported", "[data][folder]") {
  TempDir tmp;
  require_throws_mentioning<NotFound>([&] { ImageFolder(tmp / "absent"); }, {"absent", "root/<class>/"});
  require_throws_mentioning<DataError>([&] { ImageFolder(tmp.path()); }, {"no class sub-folders"});
  fs::create_directories(tmp / "empty_class");
  write_file(tmp / "full/a.png", encode_png(pattern(4, 4, 3, 0)));
  require_throws_mentioning<DataError>([&] { ImageFolder(tmp.path()); }, {"empty_class", "no .jpg"});
  fs::remove(tmp / "empty_class");
  require_throws_mentioning<InvalidArgument>([&] { ImageFolder(tmp.path(), {.height = 8}); }, {"8x0"});
  require_throws_mentioning<InvalidArgument>([&] { ImageFolder(tmp.path(), {.validate = false, .cache = true}); },
                                             {"cache"});
}

TEST_CASE("open_dataset picks the split folder and parses dataset names", "[data][folder]") {
  TempDir tmp;
  make_folder(tmp / "train");
  write_file(tmp / "test/ant/t.png", encode_png(pattern(8, 8, 3, 7)));
  write_file(tmp / "test/zebra/t.png", encode_png(pattern(8, 8, 3, 8)));
  auto train = open_dataset(DatasetKind::Folder, tmp.path(), Split::Train);
  auto test = open_dataset(parse_dataset_kind("folder"), tmp.path(), Split::Test);
  CHECK(train->size() == 5);
  CHECK(test->size() == 2);
  CHECK(test->class_names() == std::vector<std::string>{"ant", "zebra"});
  CHECK(parse_dataset_kind("builtin") == DatasetKind::Builtin);
  CHECK(parse_dataset_kind("cifar100") == DatasetKind::Cifar100);
  require_throws_mentioning<InvalidArgument>([] { parse_dataset_kind("mnist"); },
                                             {"mnist", "cifar10, cifar100, folder, builtin"});
  fs::remove_all(tmp / "test");
  require_throws_mentioning<NotFound>([&] { open_dataset(DatasetKind::Folder, tmp.path(), Split::Test); },
                                      {"no test/ sub-folder"});
}

TEST_CASE("detect_dataset_kind recognises each layout", "[data][folder]") {
  TempDir tmp;
  CHECK(detect_dataset_kind("") == DatasetKind::Builtin);
  require_throws_mentioning<NotFound>([&] { detect_dataset_kind(tmp / "none"); }, {"none", "built-in"});
  require_throws_mentioning<DataError>([&] { detect_dataset_kind(tmp.path()); }, {"matches no dataset layout"});
  write_file(tmp / "c10/cifar-10-batches-bin/data_batch_1.bin", {0});
  CHECK(detect_dataset_kind(tmp / "c10") == DatasetKind::Cifar10);
  CHECK(detect_dataset_kind(tmp / "c10/cifar-10-batches-bin") == DatasetKind::Cifar10);
  write_file(tmp / "c100/test.bin", {0});
  CHECK(detect_dataset_kind(tmp / "c100") == DatasetKind::Cifar100);
  make_folder(tmp / "images/train");
  CHECK(detect_dataset_kind(tmp / "images") == DatasetKind::Folder);
}

TEST_CASE("Every truncation and many corruptions of a JPEG or PNG decode or throw DataError, never crash",
          "[data][codec]") {
  for (const auto& original : {encode_jpeg(smooth(32, 32, 2), 90), encode_png(pattern(32, 32, 3, 5))}) {
    const Image full = decode_image(original, "full");
    int decoded = 0, rejected = 0;
    auto attempt = [&](const std::vector<std::uint8_t>& bytes) -> const Image* {
      static thread_local Image img;
      try {
        img = decode_image(bytes, "fuzz");
        REQUIRE(img.pixels.size() == static_cast<std::size_t>(img.h) * img.w * 3);
        ++decoded;
        return &img;
      } catch (const DataError&) {
        ++rejected;
        return nullptr;
      }
    };
    // A truncated file is rejected, unless only trailing bytes after the pixel data are missing
    // (PNG's end chunk): then the pixels must be complete and exact.
    int accepted_truncations = 0;
    for (std::size_t len = 0; len < original.size(); ++len) {
      const Image* img =
          attempt(std::vector<std::uint8_t>(original.begin(), original.begin() + static_cast<std::ptrdiff_t>(len)));
      if (img != nullptr) {
        ++accepted_truncations;
        REQUIRE(img->pixels == full.pixels);
      }
    }
    CHECK(accepted_truncations <= 12);
    std::uint64_t state = 12345;
    for (int trial = 0; trial < 400; ++trial) {
      auto bytes = original;
      for (int k = 0; k < 3; ++k) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        bytes[(state >> 33) % bytes.size()] ^= static_cast<std::uint8_t>(1 + ((state >> 20) % 255));
      }
      attempt(bytes);
    }
    CHECK(decoded + rejected == static_cast<int>(original.size()) + 400);
  }
}
