#include "data/views.h"

#include <cstdlib>

#include "core/error.h"

namespace towerflow::data {

std::vector<TestView> test_views(int level) {
  switch (level) {
    case 0:
      return {TestView{}};
    case 1:
      return {{.weight = 0.5}, {.flip = true, .weight = 0.5}};
    case 2:
      return {{.weight = 0.25},
              {.flip = true, .weight = 0.25},
              {.dy = -1, .dx = -1, .weight = 0.125},
              {.flip = true, .dy = -1, .dx = -1, .weight = 0.125},
              {.dy = 1, .dx = 1, .weight = 0.125},
              {.flip = true, .dy = 1, .dx = 1, .weight = 0.125}};
    default:
      raise<InvalidArgument>("test-time augmentation level ", level,
                             " is not one of 0 (none), 1 (mirror) and 2 (mirror and one-pixel shifts)");
  }
}

bool plain_views(const std::vector<TestView>& views) {
  return views.empty() || (views.size() == 1 && !views[0].flip && views[0].dy == 0 &&
                           views[0].dx == 0 && views[0].weight == 1);
}

void apply_view(const TestView& view, ImageShape shape, std::int64_t n, const float* src, float* dst) {
  if (std::abs(view.dy) >= shape.h || std::abs(view.dx) >= shape.w)
    raise<InvalidArgument>("test view shift (", view.dy, ", ", view.dx, ") on ", shape.h, "x",
                           shape.w, " images: reflect padding needs each shift below the side");
  const auto reflect = [](int i, int side) { return i < 0 ? -i : (i >= side ? 2 * (side - 1) - i : i); };
  const std::size_t image = shape.bytes();
  for (std::int64_t k = 0; k < n; ++k) {
    const float* in = src + static_cast<std::size_t>(k) * image;
    float* out = dst + static_cast<std::size_t>(k) * image;
    for (int y = 0; y < shape.h; ++y) {
      const int sy = reflect(y + view.dy, shape.h);
      for (int x = 0; x < shape.w; ++x) {
        const int sx = reflect((view.flip ? shape.w - 1 - x : x) + view.dx, shape.w);
        const float* p = in + (static_cast<std::size_t>(sy) * shape.w + sx) * shape.c;
        float* q = out + (static_cast<std::size_t>(y) * shape.w + x) * shape.c;
        for (int c = 0; c < shape.c; ++c) q[c] = p[c];
      }
    }
  }
}

}  // namespace towerflow::data
