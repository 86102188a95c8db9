#pragma once
// Helpers shared by the op benchmarks.

#include <cstddef>
#include <random>
#include <string>
#include <vector>

#include "core/cpu/conv.h"

namespace towerflow::bench {

// n standard-normal floats from a fixed seed: the same inputs on every run and machine.
inline std::vector<float> random_vector(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// Every convolution of ResNet-20 and tfcnn at batch b (NHWC, weights [c_out, c_in, kh, kw]).
struct ConvCase {
  std::string model, layer;
  towerflow::Conv2dShape s;
};

inline std::vector<ConvCase> conv_cases(int b) {
  using S = towerflow::Conv2dShape;
  return {
      {"resnet20", "conv1 3->16 32x32", S{.n = b, .h = 32, .w = 32, .c_in = 3, .c_out = 16, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1}},
      {"resnet20", "16->16 32x32", S{.n = b, .h = 32, .w = 32, .c_in = 16, .c_out = 16, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1}},
      {"resnet20", "16->32 s2 32x32", S{.n = b, .h = 32, .w = 32, .c_in = 16, .c_out = 32, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1}},
      {"resnet20", "32->32 16x16", S{.n = b, .h = 16, .w = 16, .c_in = 32, .c_out = 32, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1}},
      {"resnet20", "32->64 s2 16x16", S{.n = b, .h = 16, .w = 16, .c_in = 32, .c_out = 64, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1}},
      {"resnet20", "64->64 8x8", S{.n = b, .h = 8, .w = 8, .c_in = 64, .c_out = 64, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1}},
      {"resnet20", "proj 1x1 16->32 s2", S{.n = b, .h = 32, .w = 32, .c_in = 16, .c_out = 32, .kh = 1, .kw = 1, .stride_h = 2, .stride_w = 2}},
      {"resnet20", "proj 1x1 32->64 s2", S{.n = b, .h = 16, .w = 16, .c_in = 32, .c_out = 64, .kh = 1, .kw = 1, .stride_h = 2, .stride_w = 2}},
      {"tfcnn", "conv1 5x5 3->64 32x32", S{.n = b, .h = 32, .w = 32, .c_in = 3, .c_out = 64, .kh = 5, .kw = 5, .pad_h = 2, .pad_w = 2}},
      {"tfcnn", "conv2 5x5 64->64 16x16", S{.n = b, .h = 16, .w = 16, .c_in = 64, .c_out = 64, .kh = 5, .kw = 5, .pad_h = 2, .pad_w = 2}},
  };
}

}  // namespace towerflow::bench
