// Batch normalisation through cuDNN's spatial mode.
//
// Note [Batch norm as an [rows, c] tensor]
// NHWC activations are a dense [rows, c] matrix (rows = n*h*w). Described to cuDNN as an NCHW
// tensor of shape (rows, c, 1, 1), spatial mode normalises each channel over all rows — exactly
// the NHWC statistics, with no layout conversion. The fused relu / add+relu variants run cuDNN's
// batch norm and then one elementwise pass; their backward applies the relu mask first.

#include <cudnn.h>

#include <climits>

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
    TW_CUDNN_CHECK(cudnnCreateTensorDescriptor(&x));
    TW_CUDNN_CHECK(cudnnCreateTensorDescriptor(&stats));
    TW_CUDNN_CHECK(cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT,
                                              static_cast<int>(rows), c, 1, 1));
    TW_CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(stats, x, CUDNN_BATCHNORM_SPATIAL));
  }
  ~BnDescriptors() {
    if (stats) cudnnDestroyTensorDescriptor(stats);
    if (x) cudnnDestroyTensorDescriptor(x);
  }
  BnDescriptors(const BnDescriptors&) = delete;
  BnDescriptors& operator=(const BnDescriptors&) = delete;
};

void check_shape(std::int64_t rows, int c, const char* what) {
  if (rows < 1) raise<InvalidArgument>(what, ": rows ", rows, " must be at least 1");
  if (rows > INT_MAX)
    raise<InvalidArgument>(what, ": rows ", rows, " exceed cuDNN's limit of ", INT_MAX,
                           "; split the batch");
  if (c < 1) raise<InvalidArgument>(what, ": channels ", c, " must be at least 1");
}

void check_eps(float eps, const char* what) {
  if (!(eps >= static_cast<float>(CUDNN_BN_MIN_EPSILON)))
    raise<InvalidArgument>(what, ": eps ", eps, " is below cuDNN's minimum ",
                           CUDNN_BN_MIN_EPSILON, "; use eps >= 1e-5 (PyTorch's default) on GPUs");
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

void batch_norm_backward(const GpuContext& ctx, std::int64_t rows, int c, const float* x,
                         const float* dy, const float* gamma, const float* save_mean,
                         const float* save_invstd, float* dx, float* dgamma, float* dbeta) {
  const char* what = "batch_norm_backward";
  check_shape(rows, c, what);
  if (dx == dy)
    raise<InvalidArgument>(what, ": dx must not alias dy on the GPU (cuDNN reads dy while "
                                 "writing dx); give dx its own buffer");
  GpuContext::Impl& m = ctx.impl();
  auto scope = m.scope();
  BnDescriptors d(rows, c);
  // With the saved mean and inverse std given, cuDNN does not use epsilon for the result; it only
  // has to be a valid value, and the CPU twin's signature carries none.
  TW_CUDNN_CHECK(cudnnBatchNormalizationBackward(
      m.cudnn, CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, &kOne, &kZero, d.x, x, d.x, dy, d.x, dx,
      d.stats, gamma, dgamma, dbeta, CUDNN_BN_MIN_EPSILON, save_mean, save_invstd));
}

void batch_norm_relu_backward(const GpuContext& ctx, std::int64_t rows, int c, const float* x,
                              const float* y, const float* dy, const float* gamma,
                              const float* save_mean, const float* save_invstd, float* dx,
                              float* dgamma, float* dbeta, float* d_pre_relu) {
  check_shape(rows, c, "batch_norm_relu_backward");
  DeviceBuffer scratch;
  float* masked = d_pre_relu;
  if (masked == nullptr) {
    scratch = DeviceBuffer(ctx, static_cast<std::size_t>(rows) * c * sizeof(float));
    masked = scratch.as<float>();
  }
  detail::relu_mask(ctx, rows * c, y, dy, masked);
  batch_norm_backward(ctx, rows, c, x, masked, gamma, save_mean, save_invstd, dx, dgamma, dbeta);
}

}  // namespace towerflow::gpu
