#pragma once
// Backend: the private interface every device kind implements (ggml's pattern). Tensor ops
// (core/tensor/ops.h) check shapes, allocate outputs from the device's allocator and call one
// of these raw functions over device pointers; a backend never sees a Tensor.
//
// Implementations: the CPU backend (core/tensor/cpu_backend.cc, over core/cpu kernels and Eigen)
// and the CUDA backend (core/cuda/, which defines make_gpu_backend below; a build without CUDA
// defines it as a stub that throws DeviceError with gpu::kNoCudaBuildMessage).
//
// Contract (every method):
// - Layouts: activations NHWC (channels-last), conv weights OIHW, linear weights [out, in],
//   everything dense and float32 unless a parameter says otherwise. `rows` means n*h*w of an
//   NHWC tensor (or n of a [n, c] matrix) and `c` its last dimension.
// - Pointers are memory of this backend's device from allocator() (host pointers only where a
//   parameter is named host_*). Outputs are overwritten (never read) unless the name says
//   accumulate; inputs and outputs do not overlap unless a method says it may.
// - Ordering: calls on one backend run in call order as seen by the device (the CPU runs them
//   before returning; a GPU queues them on its stream). copy_to_host() and synchronize() return
//   when every earlier call has finished. One backend is driven by one thread at a time (the
//   tower's); distinct backends run concurrently.
// - Shapes are validated by the caller (ops.cc); a backend may still throw InvalidArgument for
//   data errors only it can see (a label out of range) and DeviceError / CudaError for failures.
// - supports(op) says whether the backend has a kernel for an op; ops.cc asks before calling and
//   falls back to the CPU under soft placement (see Note [Soft placement of ops] in ops.cc).
//   Calling a method whose op is not supported throws DeviceError.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "core/device.h"
#include "core/error.h"
#include "core/queue_event.h"
#include "core/shapes.h"
#include "core/tensor/device_ops.h"
#include "core/tensor/optimizer_update.h"
#include "core/tensor/precision.h"

namespace towerflow {

class Allocator;

// OpKind (which op kinds a backend has kernels for) is public: core/tensor/device_ops.h.

class Backend {
 public:
  virtual ~Backend() = default;

  virtual const Device& device() const = 0;
  virtual Allocator& allocator() const = 0;  // where tensors of this device get their memory
  virtual std::string name() const = 0;      // "CPU (2 threads, Eigen)", "CUDA (cuDNN 9)"
  virtual bool supports(OpKind op) const = 0;
  // What it computes with, for the start-up block: the CPU's kernel instruction set and
  // libraries, a GPU's. The default is name().
  virtual std::string describe_kernels() const { return name(); }

  // ---- memory ----------------------------------------------------------------------------
  virtual void copy_from_host(void* dst, const void* host_src, std::size_t bytes) = 0;
  // Returns when the bytes are in host_dst.
  virtual void copy_to_host(void* host_dst, const void* src, std::size_t bytes) = 0;
  // Within this device. dst and src may not overlap.
  virtual void copy(void* dst, const void* src, std::size_t bytes) = 0;
  // From another device's memory (src_backend's) into this device's. Returns when dst may be
  // used by later calls on this backend and src may be reused by later calls on src_backend.
  virtual void copy_from_device(void* dst, Backend& src_backend, const void* src,
                                std::size_t bytes) = 0;
  // Waits for every earlier call (a no-op on the CPU).
  virtual void synchronize() = 0;
  // A point after every earlier call, for ordering other queues after it without waiting on the
  // host (core/queue_event.h): a GPU records a CUDA event on its stream. The CPU's calls are
  // complete when they return, so the default records nothing and returns null ("nothing
  // pending"). Called from the thread that drives the backend.
  virtual std::shared_ptr<const QueueEvent> record_event() { return nullptr; }
  // The same, for timing (QueueEvent::milliseconds_since): the trace's device spans use it. Null
  // where the backend has no queue to time (the CPU: its spans' host times are its times).
  virtual std::shared_ptr<const QueueEvent> record_timing_event() { return nullptr; }

  // y = x rounded to bfloat16, as float32 (core/tensor/precision.h); in place allowed. The
  // default says the backend has no such kernel.
  virtual void round_to_bf16(std::int64_t n, const float* x, float* y) {
    (void)n, (void)x, (void)y;
    raise<DeviceError>("bf16 precision: no bf16 rounding kernel on ", device(), " (", name(),
                       "); train this device in fp32 (TrainerOptions::precision = Precision::Fp32)");
  }

  // y = x rounded to IEEE half precision, as float32 (precision.h); in place allowed.
  virtual void round_to_fp16(std::int64_t n, const float* x, float* y) {
    (void)n, (void)x, (void)y;
    raise<DeviceError>("fp16 precision: no fp16 rounding kernel on ", device(), " (", name(),
                       "); train this device in fp32 or bf16 (TrainerOptions::precision)");
  }

  // What bf16 or fp16 precision (p) runs on here, for the start-up block: "emulated (...)" by
  // default.
  virtual std::string describe_products(Precision p) const {
    return "emulated: operands rounded to " + to_string(p) +
           " for the fp32 kernels, slower than fp32";
  }

  // ---- 16-bit products (kBf16Products, kFp16Products) ------------------------------------------
  // The convolutions below and gemm (alpha 1, beta 0) reading their float32 operands as bfloat16
  // or IEEE half (p: rounded to nearest even inside the call) and accumulating in float32: the
  // CPU's oneDNN kernels in bf16 (core/cpu/bf16.h), the GPU's cuDNN and cuBLAS on tensor cores
  // (core/cuda/ops.h, which says where their results carry one more rounding). Under bf16 or fp16
  // precision ops.cc calls these where supports(kBf16Products / kFp16Products); elsewhere it
  // rounds the operands itself (round_to_bf16 / round_to_fp16) for the float32 kernels. The base
  // class has none.
  virtual void conv2d_forward_half(Precision p, const Conv2dShape& s, const float* x,
                                   const float* w, const float* bias_or_null, float* y) {
    no_half_products(p, "conv2d_forward_half");
  }
  virtual void conv2d_backward_input_half(Precision p, const Conv2dShape& s, const float* dy,
                                          const float* w, float* dx) {
    no_half_products(p, "conv2d_backward_input_half");
  }
  virtual void conv2d_backward_weight_half(Precision p, const Conv2dShape& s, const float* x,
                                           const float* dy, float* dw) {
    no_half_products(p, "conv2d_backward_weight_half");
  }
  virtual void gemm_half(Precision p, bool trans_a, bool trans_b, int m, int n, int k,
                         const float* a, int lda, const float* b, int ldb, float* c, int ldc) {
    no_half_products(p, "gemm_half");
  }

  // ---- bf16 activations (kBf16Activations) ---------------------------------------------------
  // Note [bf16 activations] in ops.cc: batch norm + ReLU, or max pool + ReLU, storing its output
  // as bf16 for the convolution after it, which reads it as it is. A backend that
  // supports(kBf16Activations) has all five; the base class has none (DeviceError).
  // batch_norm_forward_training with relu and no residual, y stored as bf16: each value the fp32
  // kernel's y rounded to nearest even; the statistics, saved and running, as there.
  virtual void batch_norm_relu_forward_training_bf16(std::int64_t rows, int c, const float* x,
                                                     const float* gamma, const float* beta,
                                                     float eps, float momentum,
                                                     float* running_mean, float* running_var,
                                                     bfloat16* y, float* save_mean,
                                                     float* save_invstd) {
    no_bf16_activations("batch_norm_relu_forward_training_bf16");
  }
  // max_pool_forward with relu, y stored as bf16: each value the float32 y rounded to nearest
  // even, argmax the same.
  virtual void max_pool_relu_forward_bf16(const Pool2dShape& s, const float* x, bfloat16* y,
                                          std::int32_t* argmax) {
    no_bf16_activations("max_pool_relu_forward_bf16");
  }
  // y[i] = x[i] as float32 (exact).
  virtual void widen_bf16(std::int64_t n, const bfloat16* x, float* y) {
    no_bf16_activations("widen_bf16");
  }
  // conv2d_forward_half and conv2d_backward_weight_half in bf16 with x stored as bf16: the
  // results of those calls on x widened.
  virtual void conv2d_forward_bf16_input(const Conv2dShape& s, const bfloat16* x, const float* w,
                                         const float* bias_or_null, float* y) {
    no_bf16_activations("conv2d_forward_bf16_input");
  }
  virtual void conv2d_backward_weight_bf16_input(const Conv2dShape& s, const bfloat16* x,
                                                 const float* dy, float* dw) {
    no_bf16_activations("conv2d_backward_weight_bf16_input");
  }
  // Note [bf16 convolution outputs] in ops.cc: conv2d_forward_half in bf16 with y stored as bf16,
  // each value the float32 y rounded to nearest even (denormals may become zeros), x as float32
  // or (x_bf16 not null, x null) bf16; and the batch norm that reads such a y. Its training
  // forward is batch_norm_forward_training's on x widened, with y float32, or with y_bf16 (after
  // the ReLU) stored as batch_norm_relu_forward_training_bf16 stores it; exactly one of y and
  // y_bf16 is not null. The residual, where there is one, is float32 (residual) or bf16
  // (residual_bf16, widened as x is: Note [bf16 block outputs] in ops.cc), at most one of them
  // not null. Its backward is batch_norm_backward's on x widened, the ReLU's mask from y as
  // float32 (y), as bf16 (y_bf16), or, both null, from x.
  virtual void conv2d_forward_bf16_output(const Conv2dShape& s, const float* x,
                                          const bfloat16* x_bf16, const float* w,
                                          const float* bias_or_null, bfloat16* y) {
    no_bf16_activations("conv2d_forward_bf16_output");
  }
  virtual void batch_norm_forward_training_bf16_input(std::int64_t rows, int c, const bfloat16* x,
                                                      const float* residual,
                                                      const bfloat16* residual_bf16, bool relu,
                                                      const float* gamma, const float* beta,
                                                      float eps, float momentum,
                                                      float* running_mean, float* running_var,
                                                      float* y, bfloat16* y_bf16,
                                                      float* save_mean, float* save_invstd) {
    no_bf16_activations("batch_norm_forward_training_bf16_input");
  }
  virtual void batch_norm_backward_bf16_input(std::int64_t rows, int c, const bfloat16* x,
                                              const float* y, const bfloat16* y_bf16, bool relu,
                                              const float* dy,
                                              const float* gamma, const float* beta,
                                              const float* save_mean, const float* save_invstd,
                                              float eps, float* dx, float* dgamma, float* dbeta,
                                              float* d_pre_relu) {
    no_bf16_activations("batch_norm_backward_bf16_input");
  }

  // ---- elementwise (kElementwise); in place (y == x, y == a) is allowed ---------------------
  virtual void fill(std::int64_t n, float value, float* y) = 0;
  virtual void add(std::int64_t n, const float* a, const float* b, float* y) = 0;
  virtual void mul(std::int64_t n, const float* a, const float* b, float* y) = 0;
  virtual void scale(std::int64_t n, float alpha, const float* x, float* y) = 0;  // y = alpha*x
  virtual void axpy(std::int64_t n, float alpha, const float* x, float* y) = 0;   // y += alpha*x
  virtual void relu_forward(std::int64_t n, const float* x, float* y) = 0;
  // dx = dy where y > 0 else 0 (y is relu's output). dx may equal dy.
  virtual void relu_backward(std::int64_t n, const float* y, const float* dy, float* dx) = 0;
  // GELU, exact (erf) form: y = x/2 * (1 + erf(x / sqrt 2)); dx = dy * (Phi(x) + x phi(x)) from
  // the forward's input x. dx may equal dy.
  virtual void gelu_forward(std::int64_t n, const float* x, float* y) = 0;
  virtual void gelu_backward(std::int64_t n, const float* x, const float* dy, float* dx) = 0;
  // y[r, j] = x[r, j] + bias[j] over [rows, c].
  virtual void bias_add(std::int64_t rows, int c, const float* x, const float* bias,
                        float* y) = 0;
  // out[j] = sum_r x[r, j]. Overwrites out[c].
  virtual void sum_rows(std::int64_t rows, int c, const float* x, float* out) = 0;
  // out[0] = sum of x (accumulated in double). Overwrites the one float at out.
  virtual void sum(std::int64_t n, const float* x, float* out) = 0;
  // NHWC [n, hw, c] <-> NCHW [n, c, hw] (hw = h*w): flatten in PyTorch's (C, H, W) order.
  virtual void nhwc_to_nchw(std::int64_t n, std::int64_t hw, int c, const float* x, float* y) = 0;
  virtual void nchw_to_nhwc(std::int64_t n, std::int64_t hw, int c, const float* x, float* y) = 0;

  // ---- convolution (kConv2d); core/shapes.h's shapes, core/cpu/conv.h's arithmetic ----------
  virtual void conv2d_forward(const Conv2dShape& s, const float* x, const float* w,
                              const float* bias_or_null, float* y) = 0;
  virtual void conv2d_backward_input(const Conv2dShape& s, const float* dy, const float* w,
                                     float* dx) = 0;
  virtual void conv2d_backward_weight(const Conv2dShape& s, const float* x, const float* dy,
                                      float* dw) = 0;
  // dx += conv2d_backward_input's dx, in one pass over dx (Note [Gradients summed in place] in
  // autograd.cc), where this backend has such a kernel for this call; false, dx untouched, where
  // it has not (the base class: never), and the caller computes dx apart and adds it.
  virtual bool conv2d_backward_input_add(const Conv2dShape& s, const float* dy, const float* w,
                                         float* dx) {
    (void)s, (void)dy, (void)w, (void)dx;
    return false;
  }
  // The same for conv2d_backward_input_half's dx.
  virtual bool conv2d_backward_input_half_add(Precision p, const Conv2dShape& s, const float* dy,
                                              const float* w, float* dx) {
    (void)p, (void)s, (void)dy, (void)w, (void)dx;
    return false;
  }
  virtual void conv2d_backward_bias(const Conv2dShape& s, const float* dy, float* db) = 0;

  // ---- pooling (kMaxPool, kAvgPool); core/shapes.h's shapes, core/cpu/pool.h's rules --------
  // With relu, core/cpu/pool.h's max_pool_relu_forward: y = relu(max pool of x) in one pass, and
  // argmax -1 where y is not > 0, so that max_pool_backward passes the ReLU's gradient too.
  virtual void max_pool_forward(const Pool2dShape& s, const float* x, float* y,
                                std::int32_t* argmax, bool relu) = 0;
  virtual void max_pool_backward(const Pool2dShape& s, const float* dy,
                                 const std::int32_t* argmax, float* dx) = 0;
  // max_pool_backward, and sums[c] = the sum of dx over every pixel for each channel c: the bias
  // gradient of a convolution whose output the pool read (core/cpu/pool.h's
  // max_pool_backward_channel_sums, in the pool's pass). The base class runs max_pool_backward and
  // conv2d_backward_bias.
  virtual void max_pool_backward_channel_sums(const Pool2dShape& s, const float* dy,
                                              const std::int32_t* argmax, float* dx, float* sums) {
    max_pool_backward(s, dy, argmax, dx);
    conv2d_backward_bias(Conv2dShape{.n = s.n, .h = s.h, .w = s.w, .c_in = 1, .c_out = s.c, .kh = 1, .kw = 1,
                                     .stride_h = 1, .stride_w = 1},
                         dx, sums);
  }
  // How many images of convolution s a convolution followed by a max pool (Conv2DMaxPoolRelu)
  // runs at a time, each chunk's convolution and then its pool, so that the pool reads the
  // convolution's output from cache (Note [Convolution and pool in chunks of the batch] in
  // cpu_backend.cc). The base class: the whole batch at once.
  virtual int conv_pool_chunk_images(const Conv2dShape& s) const { return s.n; }
  // The weight gradient dw of convolution cs, its products in precision p (conv2d_*_half's), and
  // where sums is not null its bias gradient, for a convolution whose output only max pool ps
  // read (argmax from max_pool_forward or max_pool_relu_forward), from the pool's output gradient
  // g, without storing the convolution's output gradient: its input needs no gradient, so nothing
  // else reads that one. False, having written nothing, where the backend has no such path for
  // the problem (the base class has none); the caller then runs max_pool_backward_channel_sums
  // and the weight gradient.
  virtual bool conv2d_backward_weight_through_max_pool(Precision, const Conv2dShape&, const float*,
                                                       const Pool2dShape&, const float*, const std::int32_t*,
                                                       float*, float*) {
    return false;
  }
  virtual void avg_pool_forward(const Pool2dShape& s, const float* x, float* y) = 0;
  virtual void avg_pool_backward(const Pool2dShape& s, const float* dy, float* dx) = 0;

  // ---- batch norm (kBatchNorm); the arguments of core/cpu/batch_norm.h --------------------
  // Training also updates the running statistics when running_mean is not null:
  //   running = (1 - momentum) * running + momentum * batch_stat, with the unbiased variance
  // (PyTorch's rule). residual (nullable) and relu select the fused variants:
  //   y = relu?(bn(x) + residual?).
  virtual void batch_norm_forward_training(std::int64_t rows, int c, const float* x,
                                           const float* residual_or_null, bool relu,
                                           const float* gamma, const float* beta, float eps,
                                           float momentum, float* running_mean,
                                           float* running_var, float* y, float* save_mean,
                                           float* save_invstd) = 0;
  virtual void batch_norm_forward_inference(std::int64_t rows, int c, const float* x,
                                            const float* gamma, const float* beta,
                                            const float* running_mean, const float* running_var,
                                            float eps, float* y) = 0;
  // Without relu: batch_norm_backward. With relu: y is the fused forward's output and the
  // gradient goes through the relu mask (y > 0) first; d_pre_relu (nullable) receives that
  // masked gradient (the residual's gradient). Without a residual (d_pre_relu null) a backend
  // may instead recompute the mask from x, the saved statistics, gamma and beta, bit for bit the
  // forward's (the CPU does: Note [The ReLU mask from x] in core/cpu/batch_norm.cc); one that
  // supports(kBf16Activations) must, and then gets a null y after a bf16 forward. dx (without
  // d_pre_relu) or d_pre_relu may be dy itself only where batch_norm_backward_in_place(). eps is
  // the eps the training forward was given (save_invstd = 1/sqrt(var + eps)); see Note
  // [Batch-norm backward eps] in core/cuda/batch_norm.cc.
  virtual bool batch_norm_backward_in_place() const { return false; }
  virtual void batch_norm_backward(std::int64_t rows, int c, const float* x, const float* y,
                                   bool relu, const float* dy, const float* gamma,
                                   const float* beta, const float* save_mean,
                                   const float* save_invstd, float eps, float* dx, float* dgamma,
                                   float* dbeta, float* d_pre_relu) = 0;

  // ---- synchronised batch norm (kBatchNormSync) ------------------------------------------------
  // The training forward and backward cut at their per-channel reductions, so that the caller
  // can combine those over several devices' slices in between (ops.cc, Note [Synchronised batch
  // norm]). The host_* arrays are host memory of c doubles (tiny: a GPU stages them through the
  // host); the other per-channel arrays are [c] floats of this device. The base class has no
  // kernels: supports(kBatchNormSync) is false and these throw DeviceError, unless overridden.
  //
  // host_mean = the mean of x over the rows, host_m2 = the sum over the rows of (x - mean)^2.
  virtual void batch_norm_moments(std::int64_t rows, int c, const float* x, double* host_mean,
                                  double* host_m2) {
    no_sync_batch_norm("batch_norm_moments");
  }
  // y = relu?((x - mean) * gamma * invstd + beta + residual?).
  virtual void batch_norm_forward_apply(std::int64_t rows, int c, const float* x,
                                        const float* residual_or_null, bool relu,
                                        const float* gamma, const float* beta, const float* mean,
                                        const float* invstd, float* y) {
    no_sync_batch_norm("batch_norm_forward_apply");
  }
  // g = relu ? dy * (y > 0) : dy. host_sum_g = sum over rows of g, host_sum_gxc = the sum of
  // g * (x - mean); d_pre_relu (nullable, with relu) receives g and may equal dy.
  virtual void batch_norm_backward_reduce(std::int64_t rows, int c, const float* x,
                                          const float* y, bool relu, const float* dy,
                                          const float* mean, double* host_sum_g,
                                          double* host_sum_gxc, float* d_pre_relu) {
    no_sync_batch_norm("batch_norm_backward_reduce");
  }
  // dx = gamma * invstd * ((g - mean_g) - (x - mean) * invstd * mean_gxhat), g as above, with
  // mean_g and mean_gxhat the means of g and g * xhat over every device's rows. dx may equal dy.
  virtual void batch_norm_backward_apply(std::int64_t rows, int c, const float* x,
                                         const float* y, bool relu, const float* dy,
                                         const float* gamma, const float* mean,
                                         const float* invstd, const float* mean_g,
                                         const float* mean_gxhat, float* dx) {
    no_sync_batch_norm("batch_norm_backward_apply");
  }

  // ---- fused optimizer updates (kOptimizerUpdate) ---------------------------------------------
  // One pass over n floats of parameters, gradients and state (this device's memory), with the
  // formulas and validation of core/tensor/optimizer_update.h; queued like any other call, so an
  // update on the device's own queue is ordered after the backward that wrote the gradients and
  // before the next forward. momentum_buf may be null only when momentum == 0; Adam's state is
  // zero-initialised by the caller. Every backend of this tree has them (the CPU's and the GPU's);
  // the base class's throw DeviceError, for a backend without them (supports() false).
  virtual void sgd_update(std::int64_t n, float* params, const float* grads, float* momentum_buf,
                          const SgdUpdate& update) {
    no_optimizer_kernel("sgd_update");
  }
  virtual void adam_update(std::int64_t n, float* params, const float* grads, float* exp_avg,
                           float* exp_avg_sq, const AdamUpdate& update) {
    no_optimizer_kernel("adam_update");
  }

  // ---- matrix product (kGemm); the arguments of core/cpu/gemm.h (row-major) ----------------
  virtual void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                    int lda, const float* b, int ldb, float beta, float* c, int ldc) = 0;

  // ---- dropout (kDropout) --------------------------------------------------------------------
  // Inverted dropout: element i is kept (y = x / (1 - p), mask = 1) iff
  // dropout_keeps(seed, offset + i, p), else y = 0, mask = 0. p in [0, 1).
  virtual void dropout_forward(std::int64_t n, float p, std::uint64_t seed, std::uint64_t offset,
                               const float* x, float* y, std::uint8_t* mask) = 0;
  // dx = dy * mask / (1 - p). dx may equal dy.
  virtual void dropout_backward(std::int64_t n, float p, const std::uint8_t* mask,
                                const float* dy, float* dx) = 0;

  // ---- loss (kSoftmaxXent) -------------------------------------------------------------------
  // With q = (1 - smoothing) * onehot(label) + smoothing / classes:
  //   loss_out[0] = (1 / scale) * sum_r sum_j -q[r, j] * log_softmax(logits[r])[j]
  //   probs[r, :] = softmax(logits[r]) (saved for backward).
  // A label outside [0, classes) throws InvalidArgument naming it (the CPU at once; a GPU may
  // report it at synchronize()).
  virtual void softmax_cross_entropy_forward(std::int64_t rows, int classes, const float* logits,
                                             const std::int32_t* labels, float scale,
                                             float smoothing, float* loss_out, float* probs) = 0;
  // dlogits = dloss[0] / scale * (probs - q). dloss is a device pointer to one float.
  virtual void softmax_cross_entropy_backward(std::int64_t rows, int classes, const float* probs,
                                              const std::int32_t* labels, float scale,
                                              float smoothing, const float* dloss,
                                              float* dlogits) = 0;

  // ---- accuracy (kTopK) ----------------------------------------------------------------------
  // correct_out[0] = number of rows whose label is among the k largest logits (ties count
  // against the label: a logit equal to the label's and earlier in the row ranks above it). A row
  // with a logit that is NaN or infinite is never counted (TensorFlow's InTopK rule).
  virtual void top_k_correct(std::int64_t rows, int classes, const float* logits,
                             const std::int32_t* labels, int k, std::int32_t* correct_out) = 0;

 protected:
  // The error of a bf16-activation method called on a backend without them.
  [[noreturn]] void no_bf16_activations(std::string_view method) const {
    raise<DeviceError>(method, ": no kernels for tensors stored as bf16 on ", device(), " (",
                       name(), "); activations stay float32 here (supports(kBf16Activations) is "
                       "false), so a bfloat16 tensor on this device cannot be read");
  }
  // The error of a 16-bit product method called on a backend without it for that type.
  [[noreturn]] void no_half_products(Precision p, std::string_view method) const {
    raise<DeviceError>(method, ": no kernel that reads ", to_string(p), " operands on ", device(),
                       " (", name(), "); ", to_string(p),
                       " precision rounds the operands for the fp32 kernels here");
  }

 private:
  // The defaults of the kBatchNormSync methods (defined here, inline, so that Backend keeps no
  // out-of-line member: libraries that implement it need not link core/tensor).
  [[noreturn]] void no_sync_batch_norm(std::string_view method) const {
    raise<DeviceError>(method, ": synchronised batch norm (batch_norm = sync) has no kernel on ",
                       device(), " (", name(), "); use per-tower batch norm on this device, or "
                       "allow_soft_placement = true to run those layers on /cpu:0");
  }
  [[noreturn]] void no_optimizer_kernel(std::string_view method) const {
    raise<DeviceError>(method, ": no fused optimizer kernel on ", device(), " (", name(),
                       "); optimizers update parameters of this device kind on the host");
  }
};

// The keep decision of dropout for element `index`: a counter-based hash, so a mask is a pure
// function of (seed, index) on every backend and thread count.
inline bool dropout_keeps(std::uint64_t seed, std::uint64_t index, float p) {
  std::uint64_t z = seed + 0x9E3779B97F4A7C15ull * (index + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);  // [0, 1), 24 bits
  return u >= p;
}

// The backend of a GPU device, defined by core/cuda: `device` on the CUDA device `cuda_ordinal`
// (the registry's physical index for it). `allocator` is that device's allocator (the
// registry's) and outlives the backend. In a build without CUDA: throws DeviceError with
// gpu::kNoCudaBuildMessage.
std::unique_ptr<Backend> make_gpu_backend(const Device& device, int cuda_ordinal,
                                          Allocator& allocator);

// The backend of a logical device (created on first use, one per device, thread-safe; lives
// until the process ends). Throws NotFound for a device the registry does not know (placement
// decisions are made earlier, by the caller, through place()).
Backend& backend_for(const Device& device);

// Tests only: makes `device` use `backend` (for example a GPU-like backend over host memory
// that lacks some ops, to test soft placement without a GPU). nullptr removes the override.
void set_backend_for_testing(const Device& device, std::unique_ptr<Backend> backend);

// Tests only, with reset_devices_for_testing(): forgets every backend (and CPU thread context)
// so the next use builds them from the re-initialised registry. No tensor may be alive.
void reset_backends_for_testing();

}  // namespace towerflow
