#pragma once
// The GPU kernels: one GPU twin for each CPU kernel of core/cpu, with the same arguments except
// that a GpuContext replaces the CpuContext and every pointer is device memory.
//
// Layout (the CPU path's, honoured on the GPU without conversion of activations): activations are
// NHWC, weights OIHW, all buffers dense, float32. cuDNN runs the convolutions on NHWC tensors
// with NHWC (O,H,W,I) filters, so conv2d_* transpose the small weight tensor OIHW <-> OHWI on the
// GPU at the boundary: see Note [Filter layout for cuDNN] in conv.cc.
//
// Contract (every function):
// - The context's GPU is made current; the work is queued on the context's stream and the call
//   returns without waiting (see GpuContext). Outputs are overwritten unless the name says
//   otherwise; inputs and outputs must not overlap except where a function says so.
// - Shapes are validated on the host with the CPU kernels' rules; a bad shape or value throws
//   InvalidArgument naming the field. Failures of CUDA, cuDNN and cuBLAS raise CudaError.
// - Results match the CPU twin to rounding (the parity suite, tests/core/cuda, states each
//   tolerance); where the GPU cannot match a CPU choice exactly the function says so.
// - In a build without CUDA each function raises DeviceError with kNoCudaBuildMessage.

#include <cstdint>

#include "core/cuda/context.h"
#include "core/shapes.h"

namespace towerflow::gpu {

// ---- convolution (cuDNN; algorithm chosen once per shape and cached in the context) ----------

void conv2d_forward(const GpuContext& ctx, const Conv2dShape& s, const float* x, const float* w,
                    float* y);
void conv2d_backward_input(const GpuContext& ctx, const Conv2dShape& s, const float* dy,
                           const float* w, float* dx);
void conv2d_backward_weight(const GpuContext& ctx, const Conv2dShape& s, const float* x,
                            const float* dy, float* dw);
void conv2d_forward_bias(const GpuContext& ctx, const Conv2dShape& s, const float* x,
                         const float* w, const float* bias, float* y);
void conv2d_backward_bias(const GpuContext& ctx, const Conv2dShape& s, const float* dy, float* db);

// ---- 16-bit products on tensor cores (bf16 and fp16 precision) -----------------------------
// The convolutions above and gemm (alpha 1, beta 0) with their float32 operands converted on the
// GPU to bf16 or fp16 (round to nearest even), multiplied by cuDNN and cuBLAS on tensor cores and
// accumulated in float32. Inputs and outputs stay float32 buffers; cuBLAS writes the product in
// float32, while cuDNN's 16-bit convolutions write their output in the 16-bit type, which is then
// widened (so convolution outputs and weight gradients carry one 16-bit rounding that the CPU's
// bf16 kernels do not): Note [16-bit convolutions on tensor cores] in conv.cc. A shape for which
// cuDNN ranks no 16-bit algorithm runs the float32 kernel on operands rounded to the type instead.
// bf16 needs compute capability 8.0, fp16 7.0 (half_products_supported).

enum class Half { Bf16, Fp16 };
const char* to_string(Half t);
// Whether this context's GPU multiplies t on tensor cores through cuDNN and cuBLAS.
bool half_products_supported(const GpuContext& ctx, Half t);

void conv2d_forward_half(const GpuContext& ctx, Half t, const Conv2dShape& s, const float* x,
                         const float* w, float* y);
void conv2d_backward_input_half(const GpuContext& ctx, Half t, const Conv2dShape& s,
                                const float* dy, const float* w, float* dx);
void conv2d_backward_weight_half(const GpuContext& ctx, Half t, const Conv2dShape& s,
                                 const float* x, const float* dy, float* dw);
// c = op(a) op(b), row-major as gemm below; the product is written in float32.
void gemm_half(const GpuContext& ctx, Half t, bool trans_a, bool trans_b, int m, int n, int k,
               const float* a, int lda, const float* b, int ldb, float* c, int ldc);

// y[i] = x[i] converted to t (round to nearest even; NaN and infinities kept; fp16 overflows to
// infinity past 65504), stored as t's 2-byte values; and back (exact).
void float_to_half(const GpuContext& ctx, Half t, std::int64_t n, const float* x, void* y);
void half_to_float(const GpuContext& ctx, Half t, std::int64_t n, const void* x, float* y);

// ---- pooling (native kernels: Note [Native pooling kernels] in pool.cu) ---------------------
// Max pool returns PyTorch's argmax with the CPU's tie rule (first in row, column order) and
// propagates NaN; average pool counts padding (count_include_pad = true). Backward of max pool
// adds with atomics where windows overlap (the order of those few additions may vary).

void max_pool_forward(const GpuContext& ctx, const Pool2dShape& s, const float* x, float* y,
                      std::int32_t* argmax);
void max_pool_backward(const GpuContext& ctx, const Pool2dShape& s, const float* dy,
                       const std::int32_t* argmax, float* dx);
// max_pool2d followed by a ReLU in one pass, as core/cpu/pool.h's twin: argmax -1 where y is
// not > 0, which max_pool_backward skips.
void max_pool_relu_forward(const GpuContext& ctx, const Pool2dShape& s, const float* x, float* y,
                           std::int32_t* argmax);
void avg_pool_forward(const GpuContext& ctx, const Pool2dShape& s, const float* x, float* y);
void avg_pool_backward(const GpuContext& ctx, const Pool2dShape& s, const float* dy, float* dx);

// ---- batch normalisation (cuDNN, spatial mode) over `rows` rows of `c` channels -------------
// Same statistics contract as core/cpu/batch_norm.h, for any rows up to INT_MAX (inputs beyond
// cuDNN's batch limit of 65535 are described with the same statistics in another shape: Note
// [Batch norm shapes within cuDNN's limits] in batch_norm.cc). eps must be finite and
// >= CUDNN_BN_MIN_EPSILON, which is 0 in cuDNN 8 and 9 (Note [cuDNN's minimum epsilon]); a
// negative or NaN eps throws InvalidArgument naming it, as on the CPU.

// The general forward: y = relu?(bn(x) + residual?) with batch statistics. When running_mean is
// not null, running statistics are updated by cuDNN in the same pass,
// running = (1 - momentum) * running + momentum * batch_stat, with the unbiased variance
// (PyTorch's rule); running_var must then be non-null too.
void batch_norm_forward_training_ex(const GpuContext& ctx, std::int64_t rows, int c,
                                    const float* x, const float* residual_or_null, bool relu,
                                    const float* gamma, const float* beta, float eps,
                                    float momentum, float* running_mean, float* running_var,
                                    float* y, float* save_mean, float* save_invstd);

void batch_norm_forward_training(const GpuContext& ctx, std::int64_t rows, int c, const float* x,
                                 const float* gamma, const float* beta, float eps, float* y,
                                 float* save_mean, float* save_invstd);
void batch_norm_forward_inference(const GpuContext& ctx, std::int64_t rows, int c, const float* x,
                                  const float* gamma, const float* beta,
                                  const float* running_mean, const float* running_var, float eps,
                                  float* y);
// Overwrites dx, dgamma, dbeta. dx must not alias dy (cuDNN reads dy while writing dx). eps is
// the training forward's (cuDNN asks for the same value in both); an eps the forward would have
// refused throws InvalidArgument.
void batch_norm_backward(const GpuContext& ctx, std::int64_t rows, int c, const float* x,
                         const float* dy, const float* gamma, const float* save_mean,
                         const float* save_invstd, float eps, float* dx, float* dgamma,
                         float* dbeta);
void batch_norm_relu_forward_training(const GpuContext& ctx, std::int64_t rows, int c,
                                      const float* x, const float* gamma, const float* beta,
                                      float eps, float* y, float* save_mean, float* save_invstd);
void batch_norm_add_relu_forward_training(const GpuContext& ctx, std::int64_t rows, int c,
                                          const float* x, const float* residual,
                                          const float* gamma, const float* beta, float eps,
                                          float* y, float* save_mean, float* save_invstd);
// Backward of the two fused forwards: the gradient goes through the relu mask (y > 0) first;
// d_pre_relu (nullable) receives that masked gradient and may equal dy. dx must not alias dy.
void batch_norm_relu_backward(const GpuContext& ctx, std::int64_t rows, int c, const float* x,
                              const float* y, const float* dy, const float* gamma,
                              const float* save_mean, const float* save_invstd, float eps,
                              float* dx, float* dgamma, float* dbeta, float* d_pre_relu);

// ---- matrix product (cuBLAS), row-major, the arguments of cpu::gemm ---------------------------

void gemm(const GpuContext& ctx, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
          const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc);

// ---- softmax over the last dimension of [rows, classes] (cuDNN) ----------------------------

void softmax_forward(const GpuContext& ctx, std::int64_t rows, int classes, const float* x,
                     float* y);
// dx = y * (dy - sum(dy * y)) per row.
void softmax_backward(const GpuContext& ctx, std::int64_t rows, int classes, const float* y,
                      const float* dy, float* dx);
void log_softmax_forward(const GpuContext& ctx, std::int64_t rows, int classes, const float* x,
                         float* y);
// dx = dy - exp(y) * sum(dy) per row.
void log_softmax_backward(const GpuContext& ctx, std::int64_t rows, int classes, const float* y,
                          const float* dy, float* dx);

// ---- loss and accuracy -------------------------------------------------------------------
// With q = (1 - smoothing) * onehot(label) + smoothing / classes:
//   loss_out[0] = (1 / scale) * sum_r sum_j -q[r, j] * log_softmax(logits[r])[j]
//   probs[r, :] = softmax(logits[r])  (for backward)
// scale is the global batch B (Note [Why towers scale loss by B] in tower/). Rows are reduced in
// a fixed order (deterministic). A label outside [0, classes) makes the loss NaN, and the next
// ctx.synchronize() throws InvalidArgument naming the label and the class count.
void softmax_cross_entropy_forward(const GpuContext& ctx, std::int64_t rows, int classes,
                                   const float* logits, const std::int32_t* labels, float scale,
                                   float smoothing, float* loss_out, float* probs);
// dlogits = dloss[0] / scale * (probs - q); dloss points to one float in device memory.
void softmax_cross_entropy_backward(const GpuContext& ctx, std::int64_t rows, int classes,
                                    const float* probs, const std::int32_t* labels, float scale,
                                    float smoothing, const float* dloss, float* dlogits);
// correct_out[0] = rows whose label is among the k largest logits (a logit equal to the label's
// and earlier in the row ranks above it).
void top_k_correct(const GpuContext& ctx, std::int64_t rows, int classes, const float* logits,
                   const std::int32_t* labels, int k, std::int32_t* correct_out);

// ---- elementwise and reductions (small .cu kernels) -----------------------------------------
// In-place use (y == x, or y == a) is allowed for every elementwise function.

void fill(const GpuContext& ctx, std::int64_t n, float value, float* y);
// y = x rounded to bfloat16 (to nearest, ties to even; NaN and infinities kept), as float.
void round_to_bf16(const GpuContext& ctx, std::int64_t n, const float* x, float* y);
// y = x rounded to IEEE half precision (to nearest even; overflow to infinity), as float.
void round_to_fp16(const GpuContext& ctx, std::int64_t n, const float* x, float* y);
void relu_forward(const GpuContext& ctx, std::int64_t n, const float* x, float* y);
// dx = dy where y > 0, else 0 (y is relu's output). dx may equal dy.
void relu_backward(const GpuContext& ctx, std::int64_t n, const float* y, const float* dy,
                   float* dx);
// GELU, exact (erf) form, and its gradient from the forward's input x; dx may equal dy.
void gelu_forward(const GpuContext& ctx, std::int64_t n, const float* x, float* y);
void gelu_backward(const GpuContext& ctx, std::int64_t n, const float* x, const float* dy,
                   float* dx);
void add(const GpuContext& ctx, std::int64_t n, const float* a, const float* b, float* y);
void mul(const GpuContext& ctx, std::int64_t n, const float* a, const float* b, float* y);
// y = alpha * x
void scale(const GpuContext& ctx, std::int64_t n, float alpha, const float* x, float* y);
// y += alpha * x
void axpy(const GpuContext& ctx, std::int64_t n, float alpha, const float* x, float* y);
// y[r, j] = x[r, j] + bias[j] over [rows, c] (NHWC: the channel is the last dimension).
void bias_add(const GpuContext& ctx, std::int64_t rows, int c, const float* x, const float* bias,
              float* y);

// y[b, j, i] = x[b, i, j] for b < batch, x [batch, rows, cols]: NHWC <-> NCHW is
// (n, h*w, c) <-> (n, c, h*w); OIHW -> OHWI weights is (o, i, kh*kw). y must not alias x.
void transpose_batched(const GpuContext& ctx, std::int64_t batch, std::int64_t rows,
                       std::int64_t cols, const float* x, float* y);

// out[j] = sum over r of x[r, j]: the bias gradient. Overwrites out [c].
void sum_rows(const GpuContext& ctx, std::int64_t rows, int c, const float* x, float* out);
// out[0] = sum of x (accumulated in double). Overwrites the one float at out.
void sum(const GpuContext& ctx, std::int64_t n, const float* x, float* out);
// out[0] = sum of x^2 (accumulated in double), for gradient norms.
void sum_squares(const GpuContext& ctx, std::int64_t n, const float* x, float* out);

// Inverted dropout: element i is kept (y = x / (1 - p), mask = 1) iff
// towerflow::dropout_keeps(seed, offset + i, p) (core/tensor/backend_impl.h: a counter-based hash,
// so the GPU's mask equals the CPU's bit for bit), else y = 0, mask = 0. p outside [0, 1) throws
// InvalidArgument.
void dropout_forward(const GpuContext& ctx, std::int64_t n, float p, std::uint64_t seed,
                     std::uint64_t offset, const float* x, float* y, std::uint8_t* mask);
// dx = dy * mask / (1 - p). dx may equal dy.
void dropout_backward(const GpuContext& ctx, std::int64_t n, float p, const std::uint8_t* mask,
                      const float* dy, float* dx);

}  // namespace towerflow::gpu
