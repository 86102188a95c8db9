// Batch normalisation through cuDNN's spatial mode.
//
// Note [Batch norm shapes within cuDNN's limits]
// NHWC activations are a dense [rows, c] matrix (rows = n*h*w), and spatial mode normalises each
// channel over N, H and W together, so any packed NHWC shape (n', c, h', w') with
// n' * h' * w' == rows gives exactly the NHWC statistics, with no layout conversion. The shape
// must respect cuDNN's batch limit: its legacy batch-norm kernels return CUDNN_STATUS_NOT_SUPPORTED
// for N > 65535 in inference and N > 131070 in training (PyTorch issues 2917 and 19911,
// onnxruntime 17406 at 70,000 rows; PyTorch keeps such inputs away from cuDNN). Describing every
// input as (rows, c, 1, 1) therefore failed on the first evaluation of ResNet-20 with 128 images
// of 32x32 (131072 rows). bn_tensor_shape() (batch_norm_shape.h, tested on the CPU) keeps
// (rows, c, 1, 1) up to 65535 rows and otherwise moves a factor of rows into H, leaving N within
// the limit. The fused relu / add+relu variants run cuDNN's batch norm and then one elementwise
// pass; their backward applies the relu mask first.
//
// Note [cuDNN's minimum epsilon]
// CUDNN_BN_MIN_EPSILON was 1e-5 before cuDNN 7.5 and is 0.0 in cuDNN 8 and 9 (cudnn_ops.h: "Minimum
// epsilon allowed to be used in the Batch Normalization formula"). The guard compares with the
// constant of the cuDNN we build against, so on cuDNN 9 it refuses only a negative (or NaN) eps,
// as the CPU kernel does, and a model with eps = 1e-6 runs on both.

#include <cudnn.h>

#include <cmath>

#include "core/cuda/batch_norm_shape.h"
#include "core/cuda/context_impl.h"
#include "core/cuda/kernels_impl.h"
#include "core/cuda/ops.h"

namespace towerflow::gpu {

namespace {

const float kOne = 1.0f;
const float kZero = 0.0f;

// The descriptors of one call; destroyed with it (creating them is a host-side struct fill).
struct BnDescriptors {
  cudnnTensorDescriptor_t x = nullptr;
  cudnnTensorDescriptor_t stats = nullptr;
  BnDescriptors(std::int64_t rows, int c) {
    // Note [Batch norm shapes within cuDNN's limits]
    const BnTensorShape shape = bn_tensor_shape(rows, c);
    TW_CUDNN_CHECK(cudnnCreateTensorDescriptor(&x));
    TW_CUDNN_CHECK(cudnnCreateTensorDescriptor(&stats));
    TW_CUDNN_CHECK(cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, shape.n,
                                              shape.c, shape.h, shape.w));
    TW_CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(stats, x, CUDNN_BATCHNORM_SPATIAL));
  }
  ~BnDescriptors() {
    if (stats) cudnnDestroyTensorDescriptor(stats);
    if (x) cudnnDestroyTensorDescriptor(x);
  }
  BnDescriptors(const BnDescriptors&) = delete;
  BnDescriptors& operator=(const BnDescriptors&) = delete;
};

void check_shape(std::int64_t rows, int c, const char* what) { bn_tensor_shape(rows, c, what); }

// Note [cuDNN's minimum epsilon]
void check_eps(float eps, const char* what) {
  if (!(eps >= static_cast<float>(CUDNN_BN_MIN_EPSILON)) || !std::isfinite(eps))
    raise<InvalidArgument>(what, ": eps ", eps, " is invalid; cuDNN ", CUDNN_MAJOR,
                           " needs a finite eps >= ", CUDNN_BN_MIN_EPSILON,
                           " (CUDNN_BN_MIN_EPSILON), as the CPU kernel does; PyTorch's default "
                           "is 1e-5");
}

}  // namespace

void batch_norm_forward_training_ex(const GpuContext& ctx, std::int64_t rows, int c,
                                    const float* x, const float* residual_or_null, bool relu,
                                    const float* gamma, const float* beta, float eps,
                                    float momentum, float* running_mean, float* running_var,
                                    float* y, float* save_mean, float* save_invstd) {
  const char* what = "batch_norm_forward_training";
  check_shape(rows, c, what);
  check_eps(eps, what);
  if ((running_mean == nullptr) != (running_var == nullptr))
    raise<InvalidArgument>(what, ": running_mean and running_var must both be given or both null");
  if (running_mean != nullptr && !(momentum >= 0.0f && momentum <= 1.0f))
    raise<InvalidArgument>(what, ": momentum ", momentum, " must be in [0, 1]");
  GpuContext::Impl& m = ctx.impl();
  auto scope = m.scope();
  BnDescriptors d(rows, c);
  // In place (y == x) is allowed by the CPU contract; cuDNN's is not documented, so go through a
  // scratch buffer in that case.
  DeviceBuffer scratch;
  float* out = y;
  if (y == x) {
    scratch = DeviceBuffer(ctx, static_cast<std::size_t>(rows) * c * sizeof(float));
    out = scratch.as<float>();
  }
  TW_CUDNN_CHECK(cudnnBatchNormalizationForwardTraining(
      m.cudnn, CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, d.x, x, d.x, out, d.stats, gamma, beta,
      running_mean ? static_cast<double>(momentum) : 0.0, running_mean, running_var,
      static_cast<double>(eps), save_mean, save_invstd));
  if (out != y)
    TW_CUDA_CHECK(cudaMemcpyAsync(y, out, static_cast<std::size_t>(rows) * c * sizeof(float),
                                  cudaMemcpyDeviceToDevice, m.stream));
  if (relu || residual_or_null != nullptr) {
    if (!relu)
      add(ctx, rows * c, y, residual_or_null, y);
    else
      detail::add_relu_inplace(ctx, rows * c, residual_or_null, y);
  }
}

void batch_norm_forward_training(const GpuContext& ctx, std::int64_t rows, int c, const float* x,
                                 const float* gamma, const float* beta, float eps, float* y,
                                 float* save_mean, float* save_invstd) {
  batch_norm_forward_training_ex(ctx, rows, c, x, nullptr, false, gamma, beta, eps, 0.0f,
                                 nullptr, nullptr, y, save_mean, save_invstd);
}

void batch_norm_relu_forward_training(const GpuContext& ctx, std::int64_t rows, int c,
                                      const float* x, const float* gamma, const float* beta,
                                      float eps, float* y, float* save_mean, float* save_invstd) {
  batch_norm_forward_training_ex(ctx, rows, c, x, nullptr, true, gamma, beta, eps, 0.0f, nullptr,
                                 nullptr, y, save_mean, save_invstd);
}

void batch_norm_add_relu_forward_training(const GpuContext& ctx, std::int64_t rows, int c,
                                          const float* x, const float* residual,
                                          const float* gamma, const float* beta, float eps,
                                          float* y, float* save_mean, float* save_invstd) {
  if (residual == nullptr)
    raise<InvalidArgument>("batch_norm_add_relu_forward_training: residual is null");
  batch_norm_forward_training_ex(ctx, rows, c, x, residual, true, gamma, beta, eps, 0.0f, nullptr,
                                 nullptr, y, save_mean, save_invstd);
}

void batch_norm_forward_inference(const GpuContext& ctx, std::int64_t rows, int c, const float* x,
                                  const float* gamma, const float* beta,
                                  const float* running_mean, const float* running_var, float eps,
                                  float* y) {
  const char* what = "batch_norm_forward_inference";
  check_shape(rows, c, what);
  check_eps(eps, what);
  GpuContext::Impl& m = ctx.impl();
  auto scope = m.scope();
  BnDescriptors d(rows, c);
  DeviceBuffer scratch;
  float* out = y;
  if (y == x) {
    scratch = DeviceBuffer(ctx, static_cast<std::size_t>(rows) * c * sizeof(float));
    out = scratch.as<float>();
  }
  TW_CUDNN_CHECK(cudnnBatchNormalizationForwardInference(
      m.cudnn, CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, d.x, x, d.x, out, d.stats, gamma, beta,
      running_mean, running_var, static_cast<double>(eps)));
  if (out != y)
    TW_CUDA_CHECK(cudaMemcpyAsync(y, out, static_cast<std::size_t>(rows) * c * sizeof(float),
                                  cudaMemcpyDeviceToDevice, m.stream));
}

// Note [Batch-norm backward eps]
// cudnnBatchNormalizationBackward takes an epsilon that cudnn_ops.h documents as "Has to be >=
// CUDNN_BN_MIN_EPSILON. Should be the same in forward and backward functions." With savedMean
// and savedInvVariance given, the result comes from the saved 1/sqrt(var + eps); an engine that
// recomputed it from x with another eps (CUDNN_BN_MIN_EPSILON is 0.0) would divide by zero on a
// constant channel. So the backend's backward carries the forward's eps and passes it on, and
// the CPU kernels, which only read save_invstd, ignore it.
void batch_norm_backward(const GpuContext& ctx, std::int64_t rows, int c, const float* x,
                         const float* dy, const float* gamma, const float* save_mean,
                         const float* save_invstd, float eps, float* dx, float* dgamma,
                         float* dbeta) {
  const char* what = "batch_norm_backward";
  check_shape(rows, c, what);
  check_eps(eps, what);
  if (dx == dy)
    raise<InvalidArgument>(what, ": dx must not alias dy on the GPU (cuDNN reads dy while "
                                 "writing dx); give dx its own buffer");
  GpuContext::Impl& m = ctx.impl();
  auto scope = m.scope();
  BnDescriptors d(rows, c);
  // The forward's eps: Note [Batch-norm backward eps].
  TW_CUDNN_CHECK(cudnnBatchNormalizationBackward(
      m.cudnn, CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, &kOne, &kZero, d.x, x, d.x, dy, d.x, dx,
      d.stats, gamma, dgamma, dbeta, static_cast<double>(eps), save_mean, save_invstd));
}

void batch_norm_relu_backward(const GpuContext& ctx, std::int64_t rows, int c, const float* x,
                              const float* y, const float* dy, const float* gamma,
                              const float* save_mean, const float* save_invstd, float eps,
                              float* dx, float* dgamma, float* dbeta, float* d_pre_relu) {
  check_shape(rows, c, "batch_norm_relu_backward");
  check_eps(eps, "batch_norm_relu_backward");
  DeviceBuffer scratch;
  float* masked = d_pre_relu;
  if (masked == nullptr) {
    scratch = DeviceBuffer(ctx, static_cast<std::size_t>(rows) * c * sizeof(float));
    masked = scratch.as<float>();
  }
  detail::relu_mask(ctx, rows * c, y, dy, masked);
  batch_norm_backward(ctx, rows, c, x, masked, gamma, save_mean, save_invstd, eps, dx, dgamma,
                      dbeta);
}

}  // namespace towerflow::gpu
