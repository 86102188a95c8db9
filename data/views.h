#pragma once
// Test-time augmentation: the views of an image a model is evaluated on, and their weights.
// A view shifts the image by (dy, dx) pixels with reflect padding (PyTorch's F.pad mode
// "reflect": row -1 is row 1), then mirrors it left to right if flip:
//   view(y, x) = image(reflect(y + dy), reflect(x' + dx)),  x' = flip ? w - 1 - x : x.
// The logits of the views are summed with their weights (airbench94 averages logits, not
// probabilities).
//
//   level 0  the image itself
//   level 1  the image and its mirror, 1/2 each
//   level 2  airbench94's six: the image and its mirror 1/4 each; shifted one pixel down-right
//            (dy = dx = -1) and up-left (dy = dx = +1), each mirrored and not, 1/8 each
//
// Views work on normalised float images (HWC), after the evaluation transform.

#include <cstdint>
#include <vector>

#include "data/dataset.h"

namespace towerflow::data {

struct TestView {
  bool flip = false;
  int dy = 0, dx = 0;  // |dy| < h and |dx| < w
  double weight = 1;
};

// InvalidArgument for a level other than 0, 1, 2.
std::vector<TestView> test_views(int level);

// True when views is empty or only the unweighted identity: evaluation needs no views.
bool plain_views(const std::vector<TestView>& views);

// dst (n images of shape, HWC floats) = the view of src. dst must not alias src. InvalidArgument
// for a shift that reflect padding cannot give (|dy| >= h or |dx| >= w).
void apply_view(const TestView& view, ImageShape shape, std::int64_t n, const float* src, float* dst);

}  // namespace towerflow::data
