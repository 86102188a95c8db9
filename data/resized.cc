#include "data/resized.h"

#include <algorithm>

#include "core/error.h"
#include "data/image_codec.h"

namespace towerflow::data {

Resized::Resized(const Dataset& parent, int height, int width)
    : parent_(parent), shape_{height, width, parent.shape().c} {
  if (height < 1 || width < 1)
    raise<InvalidArgument>("image size ", height, "x", width, " for ", parent.describe(), " must be at least 1x1");
}

Resized::Resized(std::unique_ptr<const Dataset> parent, int height, int width)
    : owned_(std::move(parent)), parent_(*owned_), shape_{height, width, parent_.shape().c} {
  if (height < 1 || width < 1)
    raise<InvalidArgument>("image size ", height, "x", width, " for ", parent_.describe(), " must be at least 1x1");
}

std::int32_t Resized::read(std::int64_t i, std::span<std::uint8_t> out) const {
  const ImageShape from = parent_.shape();
  Image src{.h = from.h, .w = from.w, .c = from.c, .pixels = std::vector<std::uint8_t>(from.bytes())};
  const std::int32_t label = parent_.read(i, src.pixels);
  const Image dst = resize_bilinear(src, shape_.h, shape_.w);
  std::copy(dst.pixels.begin(), dst.pixels.end(), out.begin());
  return label;
}

std::string Resized::describe() const {
  return str(parent_.describe(), ", resized to ", shape_.h, "x", shape_.w);
}

}  // namespace towerflow::data
