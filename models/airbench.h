#pragma once
// airbench94 (Keller Jordan, "94% on CIFAR-10 in 3.29 seconds on a single GPU", arXiv
// 2404.00498): the network of the fastest published CIFAR-10 recipe, layer for layer.
//
//   0        conv 2x2, 3 -> 24, with bias, no padding; its weight is frozen (a buffer) and set
//            from data by whiten() (nn::patch_whitening: 12 eigen-filters and their negatives)
//   1        GELU
//   2, 3, 4  ConvGroup of widths 64, 256, 256: conv1 3x3 (pad 1, no bias) -> max-pool 2 ->
//            norm1 -> GELU -> conv2 3x3 -> norm2 -> GELU
//   5, 6     max-pool 3 (stride 3), flatten
//   7        linear 256 -> classes, no bias
//   8        logits times 1/9
// Batch norm: eps 1e-12, momentum 0.4 (PyTorch's convention), scale frozen at 1 (a buffer).
// Names are those of the PyTorch nn.Sequential ("0.bias", "2.conv1.weight", "2.norm1.bias", ...),
// so state_dicts load both ways. Initialisation (from the seed): convolutions and the linear layer
// U(+-1/sqrt(fan_in)) (PyTorch's default), then each convolution's first min(in, out) filters Dirac
// (nn::dirac_init); the whitening bias 0. Input [n, 32, 32, 3] (any size from 24 up works);
// output [n, classes].

#include <array>
#include <memory>

#include "core/nn/layers.h"

namespace towerflow::models {

struct Airbench94Options {
  int num_classes = 10;
  std::array<int, 3> widths = {64, 256, 256};
  float batch_norm_momentum = 0.4f;  // PyTorch's convention (airbench's "0.6" is 1 - this)
  float batch_norm_eps = 1e-12f;
  float logit_scale = 1.0f / 9.0f;
};

class Airbench94 : public nn::Module {
 public:
  Airbench94(const Device& device, Airbench94Options options, nn::InitRng& rng);
  Tensor forward(const Tensor& x) override;

  // Sets the whitening layer's weight from images (NHWC [n, h, w, 3], normalised as the network
  // sees them; airbench94 uses the first 5,000 training images) with eps 5e-4.
  void whiten(const Tensor& images, double eps = 5e-4);

 private:
  class ConvGroup;
  Airbench94Options options_;
  std::shared_ptr<nn::Conv2d> whiten_;
  std::array<std::shared_ptr<ConvGroup>, 3> groups_;
  std::shared_ptr<nn::Linear> head_;
};

// The Airbench94 inside `model` (the model itself), or nullptr.
Airbench94* as_airbench94(nn::Module& model);

}  // namespace towerflow::models
