// The public CPU kernels: each calls the kernel table of the instruction set isa.h chose.
#include "core/cpu/isa.h"
#include "core/cpu/kernel_table.h"

namespace towerflow::cpu {

void conv2d_forward(const CpuContext& ctx, const Conv2dShape& s, const float* x, const float* w, float* y) {
  kernels().conv2d_forward(ctx, s, x, w, y);
}

void conv2d_backward_input(const CpuContext& ctx, const Conv2dShape& s, const float* dy, const float* w, float* dx) {
  kernels().conv2d_backward_input(ctx, s, dy, w, dx);
}

void conv2d_backward_input_add(const CpuContext& ctx, const Conv2dShape& s, const float* dy, const float* w, float* dx) {
  kernels().conv2d_backward_input_add(ctx, s, dy, w, dx);
}

void conv2d_backward_weight(const CpuContext& ctx, const Conv2dShape& s, const float* x, const float* dy, float* dw) {
  kernels().conv2d_backward_weight(ctx, s, x, dy, dw);
}

bool conv2d_forward_winograd(const CpuContext& ctx, const Conv2dShape& s, const float* x, const float* w, const float* bias, float* y) {
  return kernels().conv2d_forward_winograd(ctx, s, x, w, bias, y);
}

bool conv2d_backward_input_winograd(const CpuContext& ctx, const Conv2dShape& s, const float* dy, const float* w, float* dx) {
  return kernels().conv2d_backward_input_winograd(ctx, s, dy, w, dx);
}

bool conv2d_backward_input_add_winograd(const CpuContext& ctx, const Conv2dShape& s, const float* dy, const float* w, float* dx) {
  return kernels().conv2d_backward_input_add_winograd(ctx, s, dy, w, dx);
}

bool conv2d_backward_weight_winograd(const CpuContext& ctx, const Conv2dShape& s, const float* x, const float* dy, float* dw) {
  return kernels().conv2d_backward_weight_winograd(ctx, s, x, dy, dw);
}

void conv2d_forward_bias(const CpuContext& ctx, const Conv2dShape& s, const float* x, const float* w, const float* bias, float* y) {
  kernels().conv2d_forward_bias(ctx, s, x, w, bias, y);
}

void conv2d_backward_bias(const CpuContext& ctx, const Conv2dShape& s, const float* dy, float* db) {
  kernels().conv2d_backward_bias(ctx, s, dy, db);
}

void max_pool_forward(const CpuContext& ctx, const Pool2dShape& s, const float* x, float* y, std::int32_t* argmax) {
  kernels().max_pool_forward(ctx, s, x, y, argmax);
}

void max_pool_backward(const CpuContext& ctx, const Pool2dShape& s, const float* dy, const std::int32_t* argmax, float* dx) {
  kernels().max_pool_backward(ctx, s, dy, argmax, dx);
}

void max_pool_backward_channel_sums(const CpuContext& ctx, const Pool2dShape& s, const float* dy,
                                    const std::int32_t* argmax, float* dx, float* sums) {
  kernels().max_pool_backward_channel_sums(ctx, s, dy, argmax, dx, sums);
}

void max_pool_backward_rows(const Pool2dShape& s, const float* dy, const std::int32_t* argmax,
                            std::int64_t r0, std::int64_t r1, float* dx_rows, float* row_sums) {
  kernels().max_pool_backward_rows(s, dy, argmax, r0, r1, dx_rows, row_sums);
}

void max_pool_relu_forward(const CpuContext& ctx, const Pool2dShape& s, const float* x, float* y, std::int32_t* argmax) {
  kernels().max_pool_relu_forward(ctx, s, x, y, argmax);
}

void max_pool_relu_forward_bf16(const CpuContext& ctx, const Pool2dShape& s, const float* x, std::uint16_t* y, std::int32_t* argmax) {
  kernels().max_pool_relu_forward_bf16(ctx, s, x, y, argmax);
}

void avg_pool_forward(const CpuContext& ctx, const Pool2dShape& s, const float* x, float* y) {
  kernels().avg_pool_forward(ctx, s, x, y);
}

void avg_pool_backward(const CpuContext& ctx, const Pool2dShape& s, const float* dy, float* dx) {
  kernels().avg_pool_backward(ctx, s, dy, dx);
}

void batch_norm_forward_training(const CpuContext& ctx, std::int64_t rows, int c, const float* x, const float* gamma, const float* beta, float eps, float* y, float* save_mean, float* save_invstd) {
  kernels().batch_norm_forward_training(ctx, rows, c, x, gamma, beta, eps, y, save_mean, save_invstd);
}

void batch_norm_forward_inference(const CpuContext& ctx, std::int64_t rows, int c, const float* x, const float* gamma, const float* beta, const float* running_mean, const float* running_var, float eps, float* y) {
  kernels().batch_norm_forward_inference(ctx, rows, c, x, gamma, beta, running_mean, running_var, eps, y);
}

void batch_norm_backward(const CpuContext& ctx, std::int64_t rows, int c, const float* x, const float* dy, const float* gamma, const float* save_mean, const float* save_invstd, float* dx, float* dgamma, float* dbeta) {
  kernels().batch_norm_backward(ctx, rows, c, x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta);
}

void batch_norm_relu_forward_training(const CpuContext& ctx, std::int64_t rows, int c, const float* x, const float* gamma, const float* beta, float eps, float* y, float* save_mean, float* save_invstd) {
  kernels().batch_norm_relu_forward_training(ctx, rows, c, x, gamma, beta, eps, y, save_mean, save_invstd);
}

void batch_norm_relu_forward_training_bf16(const CpuContext& ctx, std::int64_t rows, int c, const float* x, const float* gamma, const float* beta, float eps, std::uint16_t* y, float* save_mean, float* save_invstd) {
  kernels().batch_norm_relu_forward_training_bf16(ctx, rows, c, x, gamma, beta, eps, y, save_mean, save_invstd);
}

void batch_norm_add_relu_forward_training(const CpuContext& ctx, std::int64_t rows, int c, const float* x, const float* residual, const float* gamma, const float* beta, float eps, float* y, float* save_mean, float* save_invstd) {
  kernels().batch_norm_add_relu_forward_training(ctx, rows, c, x, residual, gamma, beta, eps, y, save_mean, save_invstd);
}

void batch_norm_relu_backward(const CpuContext& ctx, std::int64_t rows, int c, const float* x, const float* y, const float* dy, const float* gamma, const float* beta, const float* save_mean, const float* save_invstd, float* dx, float* dgamma, float* dbeta, float* d_pre_relu) {
  kernels().batch_norm_relu_backward(ctx, rows, c, x, y, dy, gamma, beta, save_mean, save_invstd, dx, dgamma, dbeta, d_pre_relu);
}

void batch_norm_forward_training_bf16_input(const CpuContext& ctx, std::int64_t rows, int c, const std::uint16_t* x, const float* gamma, const float* beta, float eps, float* y, float* save_mean, float* save_invstd) {
  kernels().batch_norm_forward_training_bf16_input(ctx, rows, c, x, gamma, beta, eps, y, save_mean, save_invstd);
}

void batch_norm_relu_forward_training_bf16_input(const CpuContext& ctx, std::int64_t rows, int c, const std::uint16_t* x, const float* gamma, const float* beta, float eps, float* y, float* save_mean, float* save_invstd) {
  kernels().batch_norm_relu_forward_training_bf16_input(ctx, rows, c, x, gamma, beta, eps, y, save_mean, save_invstd);
}

void batch_norm_relu_forward_training_bf16_io(const CpuContext& ctx, std::int64_t rows, int c, const std::uint16_t* x, const float* gamma, const float* beta, float eps, std::uint16_t* y, float* save_mean, float* save_invstd) {
  kernels().batch_norm_relu_forward_training_bf16_io(ctx, rows, c, x, gamma, beta, eps, y, save_mean, save_invstd);
}

void batch_norm_add_relu_forward_training_bf16_input(const CpuContext& ctx, std::int64_t rows, int c, const std::uint16_t* x, const float* residual, const std::uint16_t* residual_bf16, const float* gamma, const float* beta, float eps, float* y, std::uint16_t* y_bf16, float* save_mean, float* save_invstd) {
  kernels().batch_norm_add_relu_forward_training_bf16_input(ctx, rows, c, x, residual, residual_bf16, gamma, beta, eps, y, y_bf16, save_mean, save_invstd);
}

void batch_norm_backward_bf16_input(const CpuContext& ctx, std::int64_t rows, int c, const std::uint16_t* x, const float* dy, const float* gamma, const float* save_mean, const float* save_invstd, float* dx, float* dgamma, float* dbeta) {
  kernels().batch_norm_backward_bf16_input(ctx, rows, c, x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta);
}

void batch_norm_relu_backward_bf16_input(const CpuContext& ctx, std::int64_t rows, int c, const std::uint16_t* x, const float* y, const std::uint16_t* y_bf16, const float* dy, const float* gamma, const float* beta, const float* save_mean, const float* save_invstd, float* dx, float* dgamma, float* dbeta, float* d_pre_relu) {
  kernels().batch_norm_relu_backward_bf16_input(ctx, rows, c, x, y, y_bf16, dy, gamma, beta, save_mean, save_invstd, dx, dgamma, dbeta, d_pre_relu);
}

void batch_norm_moments(const CpuContext& ctx, std::int64_t rows, int c, const float* x, double* mean, double* m2) {
  kernels().batch_norm_moments(ctx, rows, c, x, mean, m2);
}

void batch_norm_forward_apply(const CpuContext& ctx, std::int64_t rows, int c, const float* x, const float* residual, bool relu, const float* gamma, const float* beta, const float* mean, const float* invstd, float* y) {
  kernels().batch_norm_forward_apply(ctx, rows, c, x, residual, relu, gamma, beta, mean, invstd, y);
}

void batch_norm_backward_reduce(const CpuContext& ctx, std::int64_t rows, int c, const float* x, const float* y, const float* dy, const float* mean, double* sum_g, double* sum_gxc, float* d_pre_relu) {
  kernels().batch_norm_backward_reduce(ctx, rows, c, x, y, dy, mean, sum_g, sum_gxc, d_pre_relu);
}

void batch_norm_backward_apply(const CpuContext& ctx, std::int64_t rows, int c, const float* x, const float* y, const float* dy, const float* gamma, const float* mean, const float* invstd, const float* mean_g, const float* mean_gxhat, float* dx) {
  kernels().batch_norm_backward_apply(ctx, rows, c, x, y, dy, gamma, mean, invstd, mean_g, mean_gxhat, dx);
}

void gemm(const CpuContext& ctx, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  kernels().gemm(ctx, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void add(const CpuContext& ctx, std::int64_t n, const float* a, const float* b, float* y) {
  kernels().add(ctx, n, a, b, y);
}

void mul(const CpuContext& ctx, std::int64_t n, const float* a, const float* b, float* y) {
  kernels().mul(ctx, n, a, b, y);
}

void scale(const CpuContext& ctx, std::int64_t n, float alpha, const float* x, float* y) {
  kernels().scale(ctx, n, alpha, x, y);
}

void axpy(const CpuContext& ctx, std::int64_t n, float alpha, const float* x, float* y) {
  kernels().axpy(ctx, n, alpha, x, y);
}

void relu_forward(const CpuContext& ctx, std::int64_t n, const float* x, float* y) {
  kernels().relu_forward(ctx, n, x, y);
}

void relu_backward(const CpuContext& ctx, std::int64_t n, const float* y, const float* dy, float* dx) {
  kernels().relu_backward(ctx, n, y, dy, dx);
}

void gelu_forward(const CpuContext& ctx, std::int64_t n, const float* x, float* y) {
  kernels().gelu_forward(ctx, n, x, y);
}

void gelu_backward(const CpuContext& ctx, std::int64_t n, const float* x, const float* dy, float* dx) {
  kernels().gelu_backward(ctx, n, x, dy, dx);
}

void bias_add(const CpuContext& ctx, std::int64_t rows, int c, const float* x, const float* bias, float* y) {
  kernels().bias_add(ctx, rows, c, x, bias, y);
}

void sum_rows(const CpuContext& ctx, std::int64_t rows, int c, const float* x, float* out) {
  kernels().sum_rows(ctx, rows, c, x, out);
}

void transpose(const CpuContext& ctx, std::int64_t n, std::int64_t rows, std::int64_t cols, const float* x,
               float* y) {
  kernels().transpose(ctx, n, rows, cols, x, y);
}

}  // namespace towerflow::cpu
