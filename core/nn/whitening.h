#pragma once
// Patch whitening (airbench94's first layer, after Page's "How to train your ResNet"): a
// convolution whose filters are the eigenvectors of the covariance of the images' k x k patches,
// each scaled by 1 / sqrt(eigenvalue + eps), so that its output channels are decorrelated and of
// unit variance over the data. Both signs of every filter are kept (+V and -V): a following GELU
// or ReLU then loses no direction.
//
//   Tensor w = nn::patch_whitening(images, {.kernel = 2, .eps = 5e-4});   // [24, 3, 2, 2]
//   whiten_conv.weight().copy_(w);
//
// Contract:
// - images: float32 NHWC [n, h, w, c] (normalised as the network sees them), any device.
// - Every k x k patch at stride 1 is a vector in PyTorch's (c, kh, kw) order; the covariance is
//   P^T P / patches (uncentred, as airbench94), accumulated in double on the host.
// - The result, float32 on /cpu:0: [2 * c*k*k, c, k, k] (OIHW), filters in order of
//   decreasing eigenvalue, then the same filters negated. An eigenvector's sign is fixed so that
//   its largest-magnitude component is positive (the first such, in patch order), so the result
//   does not depend on the eigensolver's arbitrary signs.
// - InvalidArgument for images that are not 4-D, a kernel < 1 or larger than the image, eps <= 0,
//   or fewer patches than the patch length (a singular covariance).

#include <vector>

#include "core/tensor/tensor.h"

namespace towerflow::nn {

struct WhiteningOptions {
  int kernel = 2;
  double eps = 5e-4;
};

struct Whitening {
  Tensor weight;                   // [2 * c*k*k, c, k, k]
  std::vector<double> eigenvalues;  // c*k*k, decreasing
};

Whitening patch_whitening(const Tensor& images, WhiteningOptions options = {});

}  // namespace towerflow::nn
