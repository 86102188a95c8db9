#pragma once
// Image decoding (JPEG with libjpeg-turbo, PNG with libpng) and resizing, for image folders.
//
// Contract: decode_image() returns 8-bit RGB, HWC, whatever the file's colour type (grey, palette,
// alpha and 16-bit PNGs are converted; CMYK JPEGs are rejected). It never aborts the process: a
// corrupt, truncated or unsupported file throws DataError naming `what` (usually the path) and
// the decoder's reason. Thread-safe.

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace towerflow::data {

struct Image {
  int h = 0, w = 0, c = 0;
  std::vector<std::uint8_t> pixels;  // h*w*c, HWC
};

enum class ImageFormat { Unknown, Jpeg, Png };
// Recognises the format from the file's first bytes (magic numbers), not from its extension.
ImageFormat sniff_format(std::span<const std::uint8_t> bytes);

// Images of more than this many pixels are refused with DataError before any pixel is allocated
// (PIL's decompression-bomb limit; see Note [Decompression bombs] in image_codec.cc).
inline constexpr std::uint64_t kMaxImagePixels = 178'956'970;

Image decode_image(std::span<const std::uint8_t> bytes, const std::string& what);
// Reads only the header: {h, w, 3}. Throws DataError like decode_image.
Image decode_header(std::span<const std::uint8_t> bytes, const std::string& what);

// Whether a file name has an image extension this codec reads: .jpg, .jpeg, .png (any case).
bool is_image_file(const std::filesystem::path& path);

// Bilinear resize with half-pixel centres (align_corners = false, no antialiasing), in PyTorch's
// float arithmetic, rounding half up: the pixels of torch.nn.functional.interpolate(x.float(),
// mode="bilinear", align_corners=False).add(0.5).floor(). A same-size resize is an exact copy.
Image resize_bilinear(const Image& src, int h, int w);

// For tests and tools: PNG encoding of an 8-bit HWC image with c = 1, 3 or 4.
std::vector<std::uint8_t> encode_png(const Image& image);
// JPEG encoding of an 8-bit HWC image with c = 1 or 3; quality in 1..100.
std::vector<std::uint8_t> encode_jpeg(const Image& image, int quality = 95);

}  // namespace towerflow::data
