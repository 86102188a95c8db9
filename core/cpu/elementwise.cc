#include "core/cpu/elementwise.h"

#include <algorithm>

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
void bias_add(const CpuContext& ctx, std::int64_t rows, int c, const float* x, const float* bias, float* y) {
  ctx.parallel_for(rows, std::max<std::int64_t>(1, kMinElementsPerThread / std::max(1, c)),
                   [=](std::int64_t r0, std::int64_t r1) {
                     for (std::int64_t r = r0; r < r1; ++r)
                       for (int j = 0; j < c; ++j) y[r * c + j] = x[r * c + j] + bias[j];
                   });
}

}  // namespace towerflow::cpu::TW_ISA
