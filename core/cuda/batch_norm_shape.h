#pragma once
// The 4-D tensor that a batch-norm input of `rows` rows and `c` channels (a dense NHWC tensor seen
// as a [rows, c] matrix) is described to cuDNN as: Note [Batch norm shapes within cuDNN's limits]
// in batch_norm.cc. Pure host arithmetic with no CUDA header, so every build tests it.
//
// Contract: the result is a packed NHWC shape with n * h * w == rows, c == c, w == 1 and
// n <= kCudnnBnMaxBatch; n is the largest such batch that the search finds (rows itself when it
// fits, so small inputs keep the plain (rows, c, 1, 1) shape). rows < 1, c < 1 or rows > INT_MAX
// throw InvalidArgument naming the value.

#include <climits>
#include <cstdint>

#include "core/error.h"

namespace towerflow::gpu {

// cuDNN's legacy batch-norm kernels refuse a batch dimension N above 65535 in inference (and above
// about 131070 in training) with CUDNN_STATUS_NOT_SUPPORTED; the smaller bound serves both.
inline constexpr std::int64_t kCudnnBnMaxBatch = 65535;

struct BnTensorShape {
  int n = 0, c = 0, h = 0, w = 0;
};

inline BnTensorShape bn_tensor_shape(std::int64_t rows, int c, const char* what = "batch_norm") {
  if (rows < 1) raise<InvalidArgument>(what, ": rows ", rows, " must be at least 1");
  if (c < 1) raise<InvalidArgument>(what, ": channels ", c, " must be at least 1");
  if (rows > INT_MAX)
    raise<InvalidArgument>(what, ": rows ", rows, " exceed cuDNN's limit of ", INT_MAX,
                           " elements per dimension; split the batch");
  if (rows <= kCudnnBnMaxBatch) return {static_cast<int>(rows), c, 1, 1};
  // Spatial batch norm reduces over N, H and W together, so any n * h == rows gives the same
  // statistics. The smallest h >= rows / kCudnnBnMaxBatch that divides rows gives the largest
  // batch; the search is bounded (a row count with no divisor nearby, a large prime, becomes one
  // image of rows pixels, which cuDNN accepts as well).
  const std::int64_t first = (rows + kCudnnBnMaxBatch - 1) / kCudnnBnMaxBatch;
  for (std::int64_t h = first; h <= first + 4096 && h <= rows; ++h)
    if (rows % h == 0) return {static_cast<int>(rows / h), c, static_cast<int>(h), 1};
  return {1, c, static_cast<int>(rows), 1};
}

}  // namespace towerflow::gpu
