#pragma once
// Private to core/cuda: kernels that other kernels' host code composes (not part of ops.h).

#include <cstdint>

#include "core/cuda/context.h"

namespace towerflow::gpu::detail {

// y = relu(y + residual) in place (residual may be null: y = relu(y)).
void add_relu_inplace(const GpuContext& ctx, std::int64_t n, const float* residual, float* y);
// out = dy where y > 0, else 0. out may equal dy.
void relu_mask(const GpuContext& ctx, std::int64_t n, const float* y, const float* dy, float* out);
// Records a bad class label in the context's input-error report (see GpuContext::synchronize).
int* input_error_report(const GpuContext& ctx);

}  // namespace towerflow::gpu::detail

namespace towerflow::gpu::detail {

// out[0] = multiplier * sum of x, accumulated in double in a fixed order (deterministic).
void sum_scaled(const GpuContext& ctx, std::int64_t n, const float* x, float multiplier,
                float* out);

}  // namespace towerflow::gpu::detail
