#pragma once
// Batch normalisation on the CPU over `rows` rows of `c` channels (NHWC: rows = n*h*w).
//
// Contract:
// - Training uses the batch statistics with the biased variance (divide by rows) for
//   normalisation, as PyTorch does; save_mean / save_invstd [c] receive the mean and
//   1/sqrt(var + eps), which backward needs. Updating running statistics (with the unbiased
//   variance, PyTorch's rule) is the caller's job: var_unbiased = (1/invstd^2 - eps) * rows/(rows-1).
// - Outputs are overwritten; inputs and outputs must not overlap, except that y may equal x
//   (in place) in the forward kernels and dx may equal dy in backward.
// - Statistics are summed in float over fixed blocks of 512 rows and in double across blocks, in
//   an order that does not depend on the thread count: results are bitwise identical for any
//   number of threads.
// - rows < 1 or c < 1 or eps < 0 throws towerflow::InvalidArgument naming the value.

#include <cstdint>

#include "core/cpu/context.h"

namespace towerflow::cpu {

void batch_norm_forward_training(const CpuContext& ctx, std::int64_t rows, int c, const float* x,
                                 const float* gamma, const float* beta, float eps, float* y,
                                 float* save_mean, float* save_invstd);

void batch_norm_forward_inference(const CpuContext& ctx, std::int64_t rows, int c, const float* x,
                                  const float* gamma, const float* beta,
                                  const float* running_mean, const float* running_var, float eps,
                                  float* y);

// Overwrites dx, dgamma, dbeta.
void batch_norm_backward(const CpuContext& ctx, std::int64_t rows, int c, const float* x,
                         const float* dy, const float* gamma, const float* save_mean,
                         const float* save_invstd, float* dx, float* dgamma, float* dbeta);

// ---- fused variants (one pass less over memory each) -----------------------------------------

// y = relu(batch_norm(x)), training statistics as batch_norm_forward_training.
void batch_norm_relu_forward_training(const CpuContext& ctx, std::int64_t rows, int c,
                                      const float* x, const float* gamma, const float* beta,
                                      float eps, float* y, float* save_mean, float* save_invstd);

// The same with y stored as bfloat16 bits (the top half of a float32's), each the fp32 kernel's
// y rounded to nearest, ties to even (bf16.h's round_to_bf16), for a convolution that reads its
// input as bf16 (Note [bf16 activations] in core/tensor/ops.cc). Statistics, save_mean and
// save_invstd are the fp32 kernel's, bit for bit.
void batch_norm_relu_forward_training_bf16(const CpuContext& ctx, std::int64_t rows, int c,
                                           const float* x, const float* gamma, const float* beta,
                                           float eps, std::uint16_t* y, float* save_mean,
                                           float* save_invstd);

// y = relu(batch_norm(x) + residual): the tail of a ResNet basic block. residual [rows, c].
void batch_norm_add_relu_forward_training(const CpuContext& ctx, std::int64_t rows, int c,
                                          const float* x, const float* residual,
                                          const float* gamma, const float* beta, float eps,
                                          float* y, float* save_mean, float* save_invstd);

// Backward of the two fused forwards above, dy the gradient of their output. The ReLU mask is
// y > 0 with y their output; or, with y null (relu(batch_norm(x)) only), the pre-ReLU value
// recomputed from x, save_mean, save_invstd, gamma and beta, which is the forward's own bit for
// bit and spares the two passes' reads of y (Note [The ReLU mask from x]). Gives dx, dgamma,
// dbeta as batch_norm_backward applied to the masked dy; d_pre_relu (nullable) receives the
// masked dy itself, which is the residual's gradient in the add variant. d_pre_relu may equal dy
// (not dx); dx may equal dy. beta may be null when y is not; both null throws InvalidArgument.
void batch_norm_relu_backward(const CpuContext& ctx, std::int64_t rows, int c, const float* x,
                              const float* y, const float* dy, const float* gamma,
                              const float* beta, const float* save_mean, const float* save_invstd,
                              float* dx, float* dgamma, float* dbeta, float* d_pre_relu);

// ---- bf16 inputs ------------------------------------------------------------------------------
// The kernels above with x stored as bfloat16 bits (the top half of a float32's): a
// convolution's output rounded for the batch norm that alone reads it (Note [bf16 convolution
// outputs] in core/tensor/ops.cc). Each value is widened exactly to the float it stands for, so
// every output is the float kernel's on x widened, bit for bit. In the backward, x is the
// forward's input as stored.

void batch_norm_forward_training_bf16_input(const CpuContext& ctx, std::int64_t rows, int c,
                                            const std::uint16_t* x, const float* gamma,
                                            const float* beta, float eps, float* y,
                                            float* save_mean, float* save_invstd);
void batch_norm_relu_forward_training_bf16_input(const CpuContext& ctx, std::int64_t rows, int c,
                                                 const std::uint16_t* x, const float* gamma,
                                                 const float* beta, float eps, float* y,
                                                 float* save_mean, float* save_invstd);
// y stored as bf16 too, as batch_norm_relu_forward_training_bf16 stores it.
void batch_norm_relu_forward_training_bf16_io(const CpuContext& ctx, std::int64_t rows, int c,
                                              const std::uint16_t* x, const float* gamma,
                                              const float* beta, float eps, std::uint16_t* y,
                                              float* save_mean, float* save_invstd);
// The residual floats or bf16 bits (widened as x is: a block's output stored for the
// convolutions and the batch norm that read it, Note [bf16 block outputs] in
// core/tensor/ops.cc), exactly one of residual and residual_bf16 given; y floats or bf16 bits
// (rounded as batch_norm_relu_forward_training_bf16 rounds them), exactly one of y and y_bf16.
void batch_norm_add_relu_forward_training_bf16_input(const CpuContext& ctx, std::int64_t rows,
                                                     int c, const std::uint16_t* x,
                                                     const float* residual,
                                                     const std::uint16_t* residual_bf16,
                                                     const float* gamma, const float* beta,
                                                     float eps, float* y, std::uint16_t* y_bf16,
                                                     float* save_mean, float* save_invstd);
void batch_norm_backward_bf16_input(const CpuContext& ctx, std::int64_t rows, int c,
                                    const std::uint16_t* x, const float* dy, const float* gamma,
                                    const float* save_mean, const float* save_invstd, float* dx,
                                    float* dgamma, float* dbeta);
// The mask from y as floats (y) or as bf16 bits (y_bf16, the add variant's bf16 output), at most
// one of them given; from x when neither is.
void batch_norm_relu_backward_bf16_input(const CpuContext& ctx, std::int64_t rows, int c,
                                         const std::uint16_t* x, const float* y,
                                         const std::uint16_t* y_bf16, const float* dy,
                                         const float* gamma, const float* beta,
                                         const float* save_mean, const float* save_invstd,
                                         float* dx, float* dgamma, float* dbeta,
                                         float* d_pre_relu);

// ---- phases, for synchronised batch norm -----------------------------------------------------
// The training forward and backward cut at their per-channel reductions, so that a caller can
// combine the reductions of several devices' slices in between (statistics over a global batch).
// Running them on one slice with that slice's own reductions gives the fused kernels' results
// (to rounding). The double arrays are [c]; the float per-channel arrays are [c].

// mean[ch] = the mean of x over the rows; m2[ch] = sum over rows of (x - mean)^2 (Chan's
// M2, which combines across slices without cancellation).
void batch_norm_moments(const CpuContext& ctx, std::int64_t rows, int c, const float* x,
                        double* mean, double* m2);

// y = (x - mean) * gamma * invstd + beta, then + residual (nullable), then relu when `relu`.
void batch_norm_forward_apply(const CpuContext& ctx, std::int64_t rows, int c, const float* x,
                              const float* residual, bool relu, const float* gamma,
                              const float* beta, const float* mean, const float* invstd,
                              float* y);

// With g = dy * (y > 0) when y is not null (the fused ReLU forwards' output), else g = dy:
// sum_g[ch] = sum over rows of g, sum_gxc[ch] = sum over rows of g * (x - mean). d_pre_relu
// (nullable, only with y) receives g; it may equal dy.
void batch_norm_backward_reduce(const CpuContext& ctx, std::int64_t rows, int c, const float* x,
                                const float* y, const float* dy, const float* mean, double* sum_g,
                                double* sum_gxc, float* d_pre_relu);

// dx = gamma * invstd * ((g - mean_g) - (x - mean) * invstd * mean_gxhat), g as above, where
// mean_g and mean_gxhat are the means over the (global) rows of g and g * xhat. dx may equal dy.
void batch_norm_backward_apply(const CpuContext& ctx, std::int64_t rows, int c, const float* x,
                               const float* y, const float* dy, const float* gamma,
                               const float* mean, const float* invstd, const float* mean_g,
                               const float* mean_gxhat, float* dx);

}  // namespace towerflow::cpu
