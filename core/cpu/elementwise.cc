#include "core/cpu/elementwise.h"

#include <algorithm>
#include <numbers>

#include <Eigen/Core>
#include <unsupported/Eigen/SpecialFunctions>

#include "core/cpu/kernel_table.h"

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

}  // namespace towerflow::cpu::TW_ISA
