#pragma once
// Elementwise CPU kernels over dense float arrays, and the batched transpose between NHWC and
// NCHW, on ctx's threads (chunks of at least 16K elements). Outputs may alias inputs elementwise
// (y == a, dx == dy). Chosen per instruction set like the other kernels (isa.h).

#include <cstdint>

#include "core/cpu/context.h"

namespace towerflow::cpu {

void add(const CpuContext& ctx, std::int64_t n, const float* a, const float* b, float* y);      // y = a + b
void mul(const CpuContext& ctx, std::int64_t n, const float* a, const float* b, float* y);      // y = a * b
void scale(const CpuContext& ctx, std::int64_t n, float alpha, const float* x, float* y);      // y = alpha x
void axpy(const CpuContext& ctx, std::int64_t n, float alpha, const float* x, float* y);       // y += alpha x
void relu_forward(const CpuContext& ctx, std::int64_t n, const float* x, float* y);            // y = max(x, 0)
void relu_backward(const CpuContext& ctx, std::int64_t n, const float* y, const float* dy,
                   float* dx);                                                                   // dx = y > 0 ? dy : 0
// GELU, the exact (erf) form of torch.nn.GELU(): y = x * Phi(x) = x/2 * (1 + erf(x / sqrt 2)).
void gelu_forward(const CpuContext& ctx, std::int64_t n, const float* x, float* y);
// dx = dy * (Phi(x) + x * phi(x)), from the forward's input x; dx may equal dy.
void gelu_backward(const CpuContext& ctx, std::int64_t n, const float* x, const float* dy, float* dx);
// out[j] = the sum of x[r, j] over rows r < rows of c columns, accumulated in double in row
// order (the bias gradient): the same bits for any thread count.
void sum_rows(const CpuContext& ctx, std::int64_t rows, int c, const float* x, float* out);
// y[b] = x[b] transposed for b < n: x[b] is a rows x cols row-major matrix, y[b] cols x rows
// (NHWC <-> NCHW: rows = h * w and cols = c, or the reverse). y must not overlap x.
void transpose(const CpuContext& ctx, std::int64_t n, std::int64_t rows, std::int64_t cols, const float* x,
               float* y);
// y[r, :] = x[r, :] + bias for rows r of c channels.
void bias_add(const CpuContext& ctx, std::int64_t rows, int c, const float* x, const float* bias, float* y);

}  // namespace towerflow::cpu
