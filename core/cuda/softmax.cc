// Softmax and log-softmax over the last dimension of [rows, classes], through cuDNN: the matrix
// is an NCHW tensor (rows, classes, 1, 1) and instance mode normalises each row.

#include <cudnn.h>

#include <climits>

#include "core/cuda/context_impl.h"
#include "core/cuda/ops.h"

namespace towerflow::gpu {

namespace {

const float kOne = 1.0f;
const float kZero = 0.0f;

struct RowsDescriptor {
  cudnnTensorDescriptor_t desc = nullptr;
  RowsDescriptor(std::int64_t rows, int classes, const char* what) {
    if (rows < 1 || rows > INT_MAX)
      raise<InvalidArgument>(what, ": rows ", rows, " must be in [1, ", INT_MAX, "]");
    if (classes < 1) raise<InvalidArgument>(what, ": classes ", classes, " must be at least 1");
    TW_CUDNN_CHECK(cudnnCreateTensorDescriptor(&desc));
    TW_CUDNN_CHECK(cudnnSetTensor4dDescriptor(desc, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT,
                                              static_cast<int>(rows), classes, 1, 1));
  }
  ~RowsDescriptor() {
    if (desc) cudnnDestroyTensorDescriptor(desc);
  }
  RowsDescriptor(const RowsDescriptor&) = delete;
  RowsDescriptor& operator=(const RowsDescriptor&) = delete;
};

void forward(const GpuContext& ctx, cudnnSoftmaxAlgorithm_t algo, std::int64_t rows, int classes,
             const float* x, float* y, const char* what) {
  auto scope = ctx.impl().scope();
  RowsDescriptor d(rows, classes, what);
  TW_CUDNN_CHECK(cudnnSoftmaxForward(ctx.impl().cudnn, algo, CUDNN_SOFTMAX_MODE_INSTANCE, &kOne,
                                     d.desc, x, &kZero, d.desc, y));
}

void backward(const GpuContext& ctx, cudnnSoftmaxAlgorithm_t algo, std::int64_t rows,
              int classes, const float* y, const float* dy, float* dx, const char* what) {
  auto scope = ctx.impl().scope();
  RowsDescriptor d(rows, classes, what);
  TW_CUDNN_CHECK(cudnnSoftmaxBackward(ctx.impl().cudnn, algo, CUDNN_SOFTMAX_MODE_INSTANCE, &kOne,
                                      d.desc, y, d.desc, dy, &kZero, d.desc, dx));
}

}  // namespace

void softmax_forward(const GpuContext& ctx, std::int64_t rows, int classes, const float* x,
                     float* y) {
  forward(ctx, CUDNN_SOFTMAX_ACCURATE, rows, classes, x, y, "softmax_forward");
}
void softmax_backward(const GpuContext& ctx, std::int64_t rows, int classes, const float* y,
                      const float* dy, float* dx) {
  backward(ctx, CUDNN_SOFTMAX_ACCURATE, rows, classes, y, dy, dx, "softmax_backward");
}
void log_softmax_forward(const GpuContext& ctx, std::int64_t rows, int classes, const float* x,
                         float* y) {
  forward(ctx, CUDNN_SOFTMAX_LOG, rows, classes, x, y, "log_softmax_forward");
}
void log_softmax_backward(const GpuContext& ctx, std::int64_t rows, int classes, const float* y,
                          const float* dy, float* dx) {
  backward(ctx, CUDNN_SOFTMAX_LOG, rows, classes, y, dy, dx, "log_softmax_backward");
}

}  // namespace towerflow::gpu
