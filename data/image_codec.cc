#include "data/image_codec.h"

// jpeglib.h needs FILE and size_t declared first.
#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <jpeglib.h>
#include <png.h>

#include "core/error.h"
#include "core/strings.h"

namespace towerflow::data {

ImageFormat sniff_format(std::span<const std::uint8_t> b) {
  if (b.size() >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) return ImageFormat::Jpeg;
  static constexpr std::uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (b.size() >= 8 && std::memcmp(b.data(), kPng, 8) == 0) return ImageFormat::Png;
  return ImageFormat::Unknown;
}

namespace {

// Note [Decompression bombs]
// A 429-byte PNG can claim 30000 x 30000 pixels; decoding it would allocate 2.7 GB (per
// validation thread), and the folder's first image sets the shape every scratch buffer takes.
// fuzz/image_folder found it. Like PIL (whose DecompressionBombError starts at twice its
// MAX_IMAGE_PIXELS), the reader refuses images of more than kMaxImagePixels before allocating.
bool too_many_pixels(std::uint64_t h, std::uint64_t w) { return h * w > kMaxImagePixels; }

// Plain C, as the JPEG decoder's frame must hold no C++ object (see jpeg_decode).
void too_many_pixels_message(char* out, std::size_t size, std::uint64_t h, std::uint64_t w) {
  std::snprintf(out, size, "it is %llux%llu pixels, more than the %llu an image may have (a decompression bomb?); "
                "shrink it, or remove it", static_cast<unsigned long long>(h), static_cast<unsigned long long>(w),
                static_cast<unsigned long long>(kMaxImagePixels));
}

// libjpeg reports errors through a callback that must not return; the default one calls exit().
// Ours jumps back to the decode call. Warnings ("Premature end of JPEG file", "Corrupt JPEG
// data") are errors too: libjpeg would otherwise fill the missing part with grey and the loader
// would train on it.
struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void jpeg_on_error(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

void jpeg_on_message(j_common_ptr cinfo, int level) {
  if (level < 0) jpeg_on_error(cinfo);  // a warning: corrupt data
}

// Only plain C objects live in this frame, so a longjmp out of libjpeg skips no destructor.
// `out->pixels` is owned by the caller. Returns false with `message` set on failure.
bool jpeg_decode(const std::uint8_t* data, std::size_t size, bool header_only, Image* out, char* message) {
  jpeg_decompress_struct cinfo;
  JpegError err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_on_error;
  err.mgr.emit_message = jpeg_on_message;
  if (setjmp(err.jump)) {
    std::strncpy(message, err.message, JMSG_LENGTH_MAX);
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  if (too_many_pixels(cinfo.image_height, cinfo.image_width)) {  // Note [Decompression bombs]
    too_many_pixels_message(message, JMSG_LENGTH_MAX, cinfo.image_height, cinfo.image_width);
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  out->h = static_cast<int>(cinfo.image_height);
  out->w = static_cast<int>(cinfo.image_width);
  out->c = 3;
  if (!header_only) {
    cinfo.out_color_space = JCS_RGB;
    jpeg_start_decompress(&cinfo);
    out->pixels.resize(static_cast<std::size_t>(out->h) * out->w * 3);
    while (cinfo.output_scanline < cinfo.output_height) {
      JSAMPROW row = out->pixels.data() + static_cast<std::size_t>(cinfo.output_scanline) * out->w * 3;
      jpeg_read_scanlines(&cinfo, &row, 1);
    }
    jpeg_finish_decompress(&cinfo);
  }
  jpeg_destroy_decompress(&cinfo);
  return true;
}

Image decode_png(std::span<const std::uint8_t> bytes, const std::string& what, bool header_only) {
  // libpng's simplified API reports errors through its return value (no longjmp to manage).
  png_image png;
  std::memset(&png, 0, sizeof png);
  png.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&png, bytes.data(), bytes.size()))
    raise<DataError>("cannot decode PNG image '", what, "': ", png.message);
  if (too_many_pixels(png.height, png.width)) {  // Note [Decompression bombs]
    char message[256];
    too_many_pixels_message(message, sizeof message, png.height, png.width);
    png_image_free(&png);
    raise<DataError>("cannot decode PNG image '", what, "': ", message);
  }
  Image img{.h = static_cast<int>(png.height), .w = static_cast<int>(png.width), .c = 3, .pixels = {}};
  if (header_only) {
    png_image_free(&png);
    return img;
  }
  // Alpha is dropped rather than composited, as PIL's convert("RGB") does.
  const bool alpha = (png.format & PNG_FORMAT_FLAG_ALPHA) != 0;
  png.format = alpha ? PNG_FORMAT_RGBA : PNG_FORMAT_RGB;
  std::vector<std::uint8_t> buffer(PNG_IMAGE_SIZE(png));
  if (!png_image_finish_read(&png, nullptr, buffer.data(), 0, nullptr))
    raise<DataError>("cannot decode PNG image '", what, "': ", png.message);
  if (!alpha) {
    img.pixels = std::move(buffer);
  } else {
    img.pixels.resize(static_cast<std::size_t>(img.h) * img.w * 3);
    for (std::size_t p = 0, n = static_cast<std::size_t>(img.h) * img.w; p < n; ++p)
      std::memcpy(&img.pixels[3 * p], &buffer[4 * p], 3);
  }
  return img;
}

Image decode(std::span<const std::uint8_t> bytes, const std::string& what, bool header_only) {
  switch (sniff_format(bytes)) {
    case ImageFormat::Jpeg: {
      Image img;
      char message[JMSG_LENGTH_MAX] = {};
      if (!jpeg_decode(bytes.data(), bytes.size(), header_only, &img, message))
        raise<DataError>("cannot decode JPEG image '", what, "': ", message);
      if (img.h <= 0 || img.w <= 0) raise<DataError>("JPEG image '", what, "' has no pixels");
      return img;
    }
    case ImageFormat::Png:
      return decode_png(bytes, what, header_only);
    case ImageFormat::Unknown:
      break;
  }
  raise<DataError>("cannot decode image '", what, "': it is neither JPEG nor PNG (", bytes.size(),
                   " bytes, unrecognised signature); remove it or convert it");
}

}  // namespace

Image decode_image(std::span<const std::uint8_t> bytes, const std::string& what) {
  return decode(bytes, what, false);
}

Image decode_header(std::span<const std::uint8_t> bytes, const std::string& what) {
  return decode(bytes, what, true);
}

bool is_image_file(const std::filesystem::path& p) {
  const std::string ext = lower(p.extension().string());
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

Image resize_bilinear(const Image& src, int h, int w) {
  TW_CHECK(h > 0 && w > 0 && src.h > 0 && src.w > 0, "resize from ", src.h, "x", src.w, " to ", h, "x", w);
  Image dst{.h = h, .w = w, .c = src.c, .pixels = {}};
  if (h == src.h && w == src.w) {
    dst.pixels = src.pixels;
    return dst;
  }
  dst.pixels.resize(static_cast<std::size_t>(h) * w * src.c);
  // PyTorch's arithmetic (upsample_bilinear2d on float input, align_corners=False), in float:
  // source s = (in / out) * (o + 0.5) - 0.5, at least 0; i1 = i0 + 1 but for the last; weights
  // 1 - l and l; then h0 * (w0 * a + w1 * b) + h1 * (w0 * c + w1 * d), rounded half up. So
  // torch.nn.functional.interpolate(x.float(), ...).add(0.5).floor() gives the same pixels.
  struct Tap {
    int i0, i1;
    float l0, l1;
  };
  auto taps = [](int out, int in) {
    std::vector<Tap> v(out);
    const float scale = static_cast<float>(in) / static_cast<float>(out);
    for (int o = 0; o < out; ++o) {
      float s = scale * (static_cast<float>(o) + 0.5f) - 0.5f;
      if (s < 0) s = 0;
      const int i0 = static_cast<int>(s);
      const float l1 = s - static_cast<float>(i0);
      v[o] = {i0, i0 < in - 1 ? i0 + 1 : i0, 1.0f - l1, l1};
    }
    return v;
  };
  const auto ty = taps(h, src.h), tx = taps(w, src.w);
  const int c = src.c;
  for (int y = 0; y < h; ++y) {
    const std::uint8_t* r0 = &src.pixels[static_cast<std::size_t>(ty[y].i0) * src.w * c];
    const std::uint8_t* r1 = &src.pixels[static_cast<std::size_t>(ty[y].i1) * src.w * c];
    for (int x = 0; x < w; ++x) {
      const Tap& t = tx[x];
      for (int k = 0; k < c; ++k) {
        const float top = t.l0 * static_cast<float>(r0[t.i0 * c + k]) + t.l1 * static_cast<float>(r0[t.i1 * c + k]);
        const float bot = t.l0 * static_cast<float>(r1[t.i0 * c + k]) + t.l1 * static_cast<float>(r1[t.i1 * c + k]);
        const float v = ty[y].l0 * top + ty[y].l1 * bot;
        dst.pixels[(static_cast<std::size_t>(y) * w + x) * c + k] =
            static_cast<std::uint8_t>(std::clamp(std::floor(v + 0.5f), 0.0f, 255.0f));
      }
    }
  }
  return dst;
}

std::vector<std::uint8_t> encode_png(const Image& image) {
  TW_CHECK(image.c == 1 || image.c == 3 || image.c == 4, "PNG encoding of ", image.c, " channels");
  png_image png;
  std::memset(&png, 0, sizeof png);
  png.version = PNG_IMAGE_VERSION;
  png.width = static_cast<png_uint_32>(image.w);
  png.height = static_cast<png_uint_32>(image.h);
  png.format = image.c == 1 ? PNG_FORMAT_GRAY : image.c == 3 ? PNG_FORMAT_RGB : PNG_FORMAT_RGBA;
  png_alloc_size_t size = 0;
  if (!png_image_write_to_memory(&png, nullptr, &size, 0, image.pixels.data(), 0, nullptr))
    raise<DataError>("PNG encoding failed: ", png.message);
  std::vector<std::uint8_t> out(size);
  if (!png_image_write_to_memory(&png, out.data(), &size, 0, image.pixels.data(), 0, nullptr))
    raise<DataError>("PNG encoding failed: ", png.message);
  out.resize(size);
  return out;
}

namespace {
bool jpeg_encode(const Image& image, int quality, unsigned char** buffer, unsigned long* size, char* message) {
  jpeg_compress_struct cinfo;
  JpegError err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_on_error;
  if (setjmp(err.jump)) {
    std::strncpy(message, err.message, JMSG_LENGTH_MAX);
    jpeg_destroy_compress(&cinfo);
    return false;
  }
  jpeg_create_compress(&cinfo);
  jpeg_mem_dest(&cinfo, buffer, size);
  cinfo.image_width = static_cast<JDIMENSION>(image.w);
  cinfo.image_height = static_cast<JDIMENSION>(image.h);
  cinfo.input_components = image.c;
  cinfo.in_color_space = image.c == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<std::uint8_t*>(image.pixels.data()) +
                   static_cast<std::size_t>(cinfo.next_scanline) * image.w * image.c;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  return true;
}
}  // namespace

std::vector<std::uint8_t> encode_jpeg(const Image& image, int quality) {
  TW_CHECK(image.c == 1 || image.c == 3, "JPEG encoding of ", image.c, " channels");
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  char message[JMSG_LENGTH_MAX] = {};
  const bool ok = jpeg_encode(image, quality, &buffer, &size, message);
  std::vector<std::uint8_t> out;
  if (ok) out.assign(buffer, buffer + size);
  std::free(buffer);
  if (!ok) raise<DataError>("JPEG encoding failed: ", message);
  return out;
}

}  // namespace towerflow::data
