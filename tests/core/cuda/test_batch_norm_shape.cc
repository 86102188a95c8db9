// bn_tensor_shape: the shape cuDNN is given for a [rows, c] batch-norm input (Note [Batch norm
// shapes within cuDNN's limits] in core/cuda/batch_norm.cc). Host arithmetic, tested everywhere.

#include <catch2/catch.hpp>

#include <cstdint>

#include "core/cuda/batch_norm_shape.h"

namespace tw = towerflow;
namespace gpu = towerflow::gpu;

namespace {

void check_valid(std::int64_t rows, int c) {
  INFO("rows " << rows << ", c " << c);
  const gpu::BnTensorShape s = gpu::bn_tensor_shape(rows, c);
  CHECK(static_cast<std::int64_t>(s.n) * s.h * s.w == rows);  // same rows, same statistics
  CHECK(s.c == c);
  CHECK(s.w == 1);
  CHECK(s.n >= 1);
  CHECK(s.n <= gpu::kCudnnBnMaxBatch);  // within cuDNN's batch limit
}

}  // namespace

TEST_CASE("batch norm inputs within cuDNN's batch limit keep the (rows, c, 1, 1) shape",
          "[cuda-nogpu]") {
  for (std::int64_t rows : {std::int64_t{1}, std::int64_t{60}, std::int64_t{65535}}) {
    const gpu::BnTensorShape s = gpu::bn_tensor_shape(rows, 7);
    CHECK(s.n == rows);
    CHECK(s.c == 7);
    CHECK(s.h == 1);
    CHECK(s.w == 1);
  }
}

TEST_CASE("batch norm inputs beyond cuDNN's batch limit move a factor of rows into H",
          "[cuda-nogpu]") {
  // ResNet-20 evaluated on 128 images of 32x32: the first layer's 131072 rows.
  const gpu::BnTensorShape eval = gpu::bn_tensor_shape(128 * 32 * 32, 16);
  CHECK(eval.n == 32768);
  CHECK(eval.h == 4);
  const gpu::BnTensorShape seventy = gpu::bn_tensor_shape(70000, 16);
  CHECK(seventy.n == 35000);
  CHECK(seventy.h == 2);
  const gpu::BnTensorShape million = gpu::bn_tensor_shape(1000000, 16);
  CHECK(million.n == 62500);
  CHECK(million.h == 16);
  for (std::int64_t rows : {std::int64_t{65536}, std::int64_t{65537}, std::int64_t{131070},
                            std::int64_t{131071}, std::int64_t{1000003}, std::int64_t{2147483647},
                            std::int64_t{512} * 56 * 56})
    check_valid(rows, 64);
  // A prime above the limit has no factor to move: one image of `rows` pixels.
  const gpu::BnTensorShape prime = gpu::bn_tensor_shape(1000003, 3);
  CHECK(prime.n == 1);
  CHECK(prime.h == 1000003);
}

TEST_CASE("batch norm shapes cuDNN cannot describe are refused, naming the value",
          "[cuda-nogpu]") {
  using Catch::Matchers::Contains;
  CHECK_THROWS_AS(gpu::bn_tensor_shape(0, 4), tw::InvalidArgument);
  CHECK_THROWS_AS(gpu::bn_tensor_shape(10, 0), tw::InvalidArgument);
  CHECK_THROWS_WITH(gpu::bn_tensor_shape(std::int64_t{1} << 31, 4), Contains("2147483648"));
}
