#include "core/cpu/elementwise.h"

#include <algorithm>
#include <numbers>

#include <Eigen/Core>
#include <unsupported/Eigen/SpecialFunctions>

#include "core/cpu/kernel_table.h"
#include "core/cpu/simd_impl.h"

namespace towerflow::cpu::TW_ISA {
namespace {

constexpr std::int64_t kMinElementsPerThread = 16 * 1024;

// Plain loops: each instruction set's build vectorises them with its own widest vectors (a
// branch-free select for relu's gradient, which a baseline build of Eigen's select did not).
template <typename Fn>
void each(const CpuContext& ctx, std::int64_t n, Fn&& fn) {
  ctx.parallel_for(n, kMinElementsPerThread, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) fn(i);
  });
}

}  // namespace

void add(const CpuContext& ctx, std::int64_t n, const float* a, const float* b, float* y) {
  each(ctx, n, [=](std::int64_t i) { y[i] = a[i] + b[i]; });
}
void mul(const CpuContext& ctx, std::int64_t n, const float* a, const float* b, float* y) {
  each(ctx, n, [=](std::int64_t i) { y[i] = a[i] * b[i]; });
}
void scale(const CpuContext& ctx, std::int64_t n, float alpha, const float* x, float* y) {
  each(ctx, n, [=](std::int64_t i) { y[i] = alpha * x[i]; });
}
void axpy(const CpuContext& ctx, std::int64_t n, float alpha, const float* x, float* y) {
  each(ctx, n, [=](std::int64_t i) { y[i] += alpha * x[i]; });
}
void relu_forward(const CpuContext& ctx, std::int64_t n, const float* x, float* y) {
  each(ctx, n, [=](std::int64_t i) { y[i] = x[i] < 0.0f ? 0.0f : x[i]; });  // NaN stays NaN, as in PyTorch
}
void relu_backward(const CpuContext& ctx, std::int64_t n, const float* y, const float* dy, float* dx) {
  // dy is loaded whatever y is, so that the select compiles to a blend: written as
  // `y > 0 ? dy : 0`, the load is conditional and the compiler keeps a branch, which mispredicts
  // on about half of a ReLU's outputs (8x the forward's time on tfcnn's pool1).
  each(ctx, n, [=](std::int64_t i) {
    const float g = dy[i];
    dx[i] = y[i] > 0.0f ? g : 0.0f;
  });
}
// GELU through Eigen's arrays, whose erf and exp are vectorised for each instruction set
// (a plain loop over std::erf is a scalar call per element).
constexpr float kInvSqrt2 = 1.0f / std::numbers::sqrt2_v<float>;
void gelu_forward(const CpuContext& ctx, std::int64_t n, const float* x, float* y) {
  ctx.parallel_for(n, kMinElementsPerThread, [=](std::int64_t b, std::int64_t e) {
    const Eigen::Map<const Eigen::ArrayXf> xs(x + b, e - b);
    Eigen::Map<Eigen::ArrayXf> ys(y + b, e - b);
    ys = 0.5f * xs * (1.0f + (xs * kInvSqrt2).erf());
  });
}
void gelu_backward(const CpuContext& ctx, std::int64_t n, const float* x, const float* dy, float* dx) {
  constexpr float kInvSqrt2Pi = std::numbers::inv_sqrtpi_v<float> * kInvSqrt2;  // 1 / sqrt(2 pi)
  ctx.parallel_for(n, kMinElementsPerThread, [=](std::int64_t b, std::int64_t e) {
    const Eigen::Map<const Eigen::ArrayXf> xs(x + b, e - b), gs(dy + b, e - b);
    Eigen::Map<Eigen::ArrayXf> out(dx + b, e - b);
    const auto cdf = 0.5f * (1.0f + (xs * kInvSqrt2).erf());
    const auto pdf = kInvSqrt2Pi * (-0.5f * xs.square()).exp();
    out = gs * (cdf + xs * pdf);
  });
}
void bias_add(const CpuContext& ctx, std::int64_t rows, int c, const float* x, const float* bias, float* y) {
  ctx.parallel_for(rows, std::max<std::int64_t>(1, kMinElementsPerThread / std::max(1, c)),
                   [=](std::int64_t r0, std::int64_t r1) {
                     for (std::int64_t r = r0; r < r1; ++r)
                       for (int j = 0; j < c; ++j) y[r * c + j] = x[r * c + j] + bias[j];
                   });
}

void sum_rows(const CpuContext& ctx, std::int64_t rows, int c, const float* x, float* out) {
  // Strips of 16 columns (a cache line of each row), each summed over the rows in order, in
  // double: the threads split the strips, so the result does not depend on their number.
  constexpr int kStrip = 16;
  const std::int64_t strips = (c + kStrip - 1) / kStrip;
  const std::int64_t min_strips = std::max<std::int64_t>(1, kMinElementsPerThread / std::max<std::int64_t>(1, rows * kStrip));
  ctx.parallel_for(strips, min_strips, [=](std::int64_t s0, std::int64_t s1) {
    for (std::int64_t strip = s0; strip < s1; ++strip) {
      const int j0 = static_cast<int>(strip * kStrip), width = std::min(kStrip, c - j0);
      double acc[kStrip] = {};
      if (width == kStrip) {
        for (std::int64_t r = 0; r < rows; ++r)
          for (int j = 0; j < kStrip; ++j) acc[j] += x[r * c + j0 + j];
      } else {
        for (std::int64_t r = 0; r < rows; ++r)
          for (int j = 0; j < width; ++j) acc[j] += x[r * c + j0 + j];
      }
      for (int j = 0; j < width; ++j) out[j0 + j] = static_cast<float>(acc[j]);
    }
  });
}

namespace {

// Eight rows of an 8x8 block in, its eight columns out, through three rounds of two-vector
// shuffles (unpack pairs, then pairs of pairs, then halves): 24 shuffles where a scalar
// transpose moves 64 elements one by one. kStream: y's rows with streaming stores (32-byte
// aligned).
template <bool kStream>
void transpose8x8(const float* x, std::int64_t ld_x, float* y, std::int64_t ld_y) {
  using detail::load8;
  using detail::store8;
  using detail::Vec8;
  Vec8 r[8], t[8], u[8];
  for (int i = 0; i < 8; ++i) r[i] = load8(x + i * ld_x);
  for (int i = 0; i < 8; i += 2) {
    t[i] = __builtin_shufflevector(r[i], r[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[i + 1] = __builtin_shufflevector(r[i], r[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int i = 0; i < 8; i += 4)
    for (int j = 0; j < 2; ++j) {
      u[i + 2 * j] = __builtin_shufflevector(t[i + j], t[i + j + 2], 0, 1, 8, 9, 4, 5, 12, 13);
      u[i + 2 * j + 1] = __builtin_shufflevector(t[i + j], t[i + j + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    }
  // u[0..3] hold columns {0, 4}, {1, 5}, {2, 6}, {3, 7} of rows 0-3; u[4..7] the same of rows 4-7.
  for (int j = 0; j < 4; ++j) {
    const Vec8 low = __builtin_shufflevector(u[j], u[j + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    const Vec8 high = __builtin_shufflevector(u[j], u[j + 4], 4, 5, 6, 7, 12, 13, 14, 15);
    if constexpr (kStream) {
      detail::store_streaming(y + j * ld_y, low);
      detail::store_streaming(y + (j + 4) * ld_y, high);
    } else {
      store8(y + j * ld_y, low);
      store8(y + (j + 4) * ld_y, high);
    }
  }
}

// Transposes of at least this many output bytes write with streaming stores (Note [Streaming
// stores] in simd_impl.h), 16 source rows at a time so that each output row gets a whole 64-byte
// line from two consecutive blocks. An 8x8 block's stores touch eight lines of y, and with plain
// stores each line is read from memory before it is written: tfcnn's Flatten (128 images of a
// 64 x 64 matrix, 2 MiB) took 141-170 us forward and 84-259 us backward that way, and 63-94 us
// forward and 85-108 us backward with streaming stores (a 2-core Zen 4 EPYC, `towerflow_bench_train
// --model tfcnn --trace` in fp32 and bf16, alternating runs). Smaller outputs stay in the caches for
// their reader.
constexpr std::int64_t kStreamingTransposeBytes = std::int64_t{1} << 20;

}  // namespace

void transpose(const CpuContext& ctx, std::int64_t n, std::int64_t rows, std::int64_t cols, const float* x,
               float* y) {
  const std::int64_t size = rows * cols;
  const bool stream = n * size * std::int64_t{sizeof(float)} >= kStreamingTransposeBytes && rows % 16 == 0 &&
                      cols % 8 == 0 && detail::streaming_aligned(y);
  ctx.parallel_for(n, std::max<std::int64_t>(1, kMinElementsPerThread / std::max<std::int64_t>(1, size)),
                   [=](std::int64_t b0, std::int64_t b1) {
    if (stream) {
      for (std::int64_t b = b0; b < b1; ++b) {
        const float* src = x + b * size;
        float* dst = y + b * size;
        for (std::int64_t i = 0; i < rows; i += 16)
          for (std::int64_t j = 0; j < cols; j += 8) {
            transpose8x8<true>(src + i * cols + j, cols, dst + j * rows + i, rows);
            transpose8x8<true>(src + (i + 8) * cols + j, cols, dst + j * rows + i + 8, rows);
          }
      }
      detail::stream_fence();
      return;
    }
    for (std::int64_t b = b0; b < b1; ++b) {
      const float* src = x + b * size;
      float* dst = y + b * size;
      const std::int64_t rows8 = rows / 8 * 8, cols8 = cols / 8 * 8;
      for (std::int64_t i = 0; i < rows8; i += 8)
        for (std::int64_t j = 0; j < cols8; j += 8)
          transpose8x8<false>(src + i * cols + j, cols, dst + j * rows + i, rows);
      // The edges: the last rows % 8 rows and cols % 8 columns, element by element.
      for (std::int64_t i = 0; i < rows; ++i)
        for (std::int64_t j = i < rows8 ? cols8 : 0; j < cols; ++j) dst[j * rows + i] = src[i * cols + j];
    }
  });
}

}  // namespace towerflow::cpu::TW_ISA
