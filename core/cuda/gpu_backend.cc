// The GPU implementation of the tensor ops' Backend interface (core/tensor/backend_impl.h): a
// GpuContext plus one forwarding call per method. Every op has a GPU kernel but synchronised
// batch norm's phases (kBatchNormSync), which fall back to the CPU under soft placement.

#include <cudnn.h>

#include <map>
#include <mutex>

#include "core/cuda/context_impl.h"
#include "core/cuda/copy.h"
#include "core/cuda/ops.h"
#include "core/cuda/optimizer_kernels.h"
#include "core/tensor/backend_impl.h"

namespace towerflow {

namespace {

// The contexts of the GPU backends that exist, for gpu::context_for().
struct ContextTable {
  std::mutex mu;
  std::map<Device, const gpu::GpuContext*> contexts;
};
ContextTable& context_table() {
  static auto* t = new ContextTable;  // never destroyed: backends may outlive static destructors
  return *t;
}

// A CUDA event recorded on a context's stream, as the backend-neutral QueueEvent.
class CudaQueueEvent final : public QueueEvent {
 public:
  explicit CudaQueueEvent(const gpu::GpuContext& ctx, bool timing = false) : ctx_(ctx) {
    auto scope = ctx.impl().scope();
    TW_CUDA_CHECK(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming));
    const cudaError_t status = cudaEventRecord(event_, gpu::stream_of(ctx));
    if (status != cudaSuccess) {
      cudaEventDestroy(event_);
      TW_CUDA_CHECK(status);
    }
  }
  ~CudaQueueEvent() override { cudaEventDestroy(event_); }
  CudaQueueEvent(const CudaQueueEvent&) = delete;
  CudaQueueEvent& operator=(const CudaQueueEvent&) = delete;

  void synchronize() const override {
    auto scope = ctx_.impl().scope();
    TW_CUDA_CHECK(cudaEventSynchronize(event_));
  }
  void make_stream_wait(void* cuda_stream) const override {
    auto scope = ctx_.impl().scope();
    TW_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(cuda_stream), event_, 0));
  }
  double milliseconds_since(const QueueEvent& earlier) const override {
    const auto* e = dynamic_cast<const CudaQueueEvent*>(&earlier);
    if (e == nullptr) return -1;
    auto scope = ctx_.impl().scope();
    TW_CUDA_CHECK(cudaEventSynchronize(event_));
    float ms = 0;
    // cudaErrorInvalidResourceHandle: one of the two was recorded without timing.
    if (cudaEventElapsedTime(&ms, e->event_, event_) != cudaSuccess) {
      cudaGetLastError();
      return -1;
    }
    return ms;
  }

 private:
  const gpu::GpuContext& ctx_;
  cudaEvent_t event_ = nullptr;
};

class GpuBackend final : public Backend {
 public:
  GpuBackend(const Device& device, int ordinal, Allocator& allocator)
      : ctx_(gpu::GpuContextOptions{.device = device, .ordinal = ordinal,
                                    .allocator = &allocator}) {
    cudaDeviceProp prop{};
    {
      auto scope = ctx_.impl().scope();
      TW_CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal));
    }
    bf16_products_ = gpu::half_products_supported(ctx_, gpu::Half::Bf16);
    fp16_products_ = gpu::half_products_supported(ctx_, gpu::Half::Fp16);
    const std::size_t v = cudnnGetVersion();
    name_ = str("CUDA (", prop.name, ", ordinal ", ordinal, ", cuDNN ", v / 10000, ".",
                v / 100 % 100, ")");
    std::lock_guard lock(context_table().mu);
    context_table().contexts[device] = &ctx_;
  }
  ~GpuBackend() override {
    std::lock_guard lock(context_table().mu);
    auto& contexts = context_table().contexts;
    if (auto it = contexts.find(ctx_.device()); it != contexts.end() && it->second == &ctx_)
      contexts.erase(it);
  }

  const gpu::GpuContext& context() const { return ctx_; }

  const Device& device() const override { return ctx_.device(); }
  Allocator& allocator() const override { return ctx_.allocator(); }
  std::string name() const override { return name_; }
  // Synchronised batch norm's phase kernels and the bf16 activations' kernels are not written
  // for the GPU yet (the base class throws); without the former ops.cc soft-places those layers
  // on /cpu:0 or names the option, without the latter activations stay fp32. 16-bit
  // products run on tensor cores where the GPU has them for the type (half_products_supported).
  bool supports(OpKind op) const override {
    if (op == OpKind::kBf16Products) return bf16_products_;
    if (op == OpKind::kBf16Activations) return false;  // activations stay fp32 on GPUs
    if (op == OpKind::kFp16Products) return fp16_products_;
    return op != OpKind::kBatchNormSync;
  }

  // ---- memory ------------------------------------------------------------------------------
  void copy_from_host(void* dst, const void* host_src, std::size_t bytes) override {
    gpu::copy_to_device(ctx_, dst, host_src, bytes);
  }
  void copy_to_host(void* host_dst, const void* src, std::size_t bytes) override {
    gpu::copy_to_host(ctx_, host_dst, src, bytes);
    ctx_.synchronize();  // also reports input errors found by kernels (bad labels)
  }
  void copy(void* dst, const void* src, std::size_t bytes) override {
    gpu::copy_device_to_device(ctx_, dst, src, bytes);
  }
  void copy_from_device(void* dst, Backend& src_backend, const void* src,
                        std::size_t bytes) override {
    if (src_backend.device().is_cpu()) return gpu::copy_to_device(ctx_, dst, src, bytes);
    auto* other = dynamic_cast<GpuBackend*>(&src_backend);
    if (other == nullptr)
      raise<DeviceError>("copy to ", device(), " from ", src_backend.device(), " (",
                         src_backend.name(), "): the source is not a CUDA backend");
    gpu::copy_between_devices(ctx_, dst, other->ctx_, src, bytes);
  }
  void synchronize() override { ctx_.synchronize(); }
  std::shared_ptr<const QueueEvent> record_event() override {
    return std::make_shared<CudaQueueEvent>(ctx_);
  }
  std::shared_ptr<const QueueEvent> record_timing_event() override {
    return std::make_shared<CudaQueueEvent>(ctx_, /*timing=*/true);
  }

  // ---- fused optimizer updates --------------------------------------------------------------
  void sgd_update(std::int64_t n, float* params, const float* grads, float* momentum_buf,
                  const SgdUpdate& update) override {
    gpu::sgd_update(ctx_, n, params, grads, momentum_buf, update);
  }
  void adam_update(std::int64_t n, float* params, const float* grads, float* exp_avg,
                   float* exp_avg_sq, const AdamUpdate& update) override {
    gpu::adam_update(ctx_, n, params, grads, exp_avg, exp_avg_sq, update);
  }

  // ---- elementwise -------------------------------------------------------------------------
  void fill(std::int64_t n, float value, float* y) override { gpu::fill(ctx_, n, value, y); }
  // The emulated path of bf16 and fp16 precision (a GPU without tensor cores for the type).
  void round_to_bf16(std::int64_t n, const float* x, float* y) override {
    gpu::round_to_bf16(ctx_, n, x, y);
  }
  void round_to_fp16(std::int64_t n, const float* x, float* y) override {
    gpu::round_to_fp16(ctx_, n, x, y);
  }
  std::string describe_products(Precision p) const override {
    const std::string t = to_string(p);
    if (p == Precision::Bf16 ? bf16_products_ : fp16_products_)
      return "cuDNN and cuBLAS " + t + " kernels on tensor cores: operands converted to " + t +
             " on the GPU, convolution outputs and weight gradients rounded to " + t;
    return "emulated: this GPU has no " + t + " tensor cores; operands rounded to " + t +
           " on the GPU for the fp32 cuDNN and cuBLAS kernels, slower than fp32";
  }

  // ---- 16-bit products on tensor cores (kBf16Products, kFp16Products) -------------------------
  void conv2d_forward_half(Precision p, const Conv2dShape& s, const float* x, const float* w,
                           const float* bias_or_null, float* y) override {
    gpu::conv2d_forward_half(ctx_, half(p), s, x, w, y);
    if (bias_or_null != nullptr)
      gpu::bias_add(ctx_, static_cast<std::int64_t>(s.n) * s.out_h() * s.out_w(), s.c_out, y,
                    bias_or_null, y);
  }
  void conv2d_backward_input_half(Precision p, const Conv2dShape& s, const float* dy,
                                  const float* w, float* dx) override {
    gpu::conv2d_backward_input_half(ctx_, half(p), s, dy, w, dx);
  }
  void conv2d_backward_weight_half(Precision p, const Conv2dShape& s, const float* x,
                                   const float* dy, float* dw) override {
    gpu::conv2d_backward_weight_half(ctx_, half(p), s, x, dy, dw);
  }
  void gemm_half(Precision p, bool trans_a, bool trans_b, int m, int n, int k, const float* a,
                 int lda, const float* b, int ldb, float* c, int ldc) override {
    gpu::gemm_half(ctx_, half(p), trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc);
  }
  void add(std::int64_t n, const float* a, const float* b, float* y) override {
    gpu::add(ctx_, n, a, b, y);
  }
  void mul(std::int64_t n, const float* a, const float* b, float* y) override {
    gpu::mul(ctx_, n, a, b, y);
  }
  void scale(std::int64_t n, float alpha, const float* x, float* y) override {
    gpu::scale(ctx_, n, alpha, x, y);
  }
  void axpy(std::int64_t n, float alpha, const float* x, float* y) override {
    gpu::axpy(ctx_, n, alpha, x, y);
  }
  void relu_forward(std::int64_t n, const float* x, float* y) override {
    gpu::relu_forward(ctx_, n, x, y);
  }
  void relu_backward(std::int64_t n, const float* y, const float* dy, float* dx) override {
    gpu::relu_backward(ctx_, n, y, dy, dx);
  }
  void gelu_forward(std::int64_t n, const float* x, float* y) override {
    gpu::gelu_forward(ctx_, n, x, y);
  }
  void gelu_backward(std::int64_t n, const float* x, const float* dy, float* dx) override {
    gpu::gelu_backward(ctx_, n, x, dy, dx);
  }
  void bias_add(std::int64_t rows, int c, const float* x, const float* bias, float* y) override {
    gpu::bias_add(ctx_, rows, c, x, bias, y);
  }
  void sum_rows(std::int64_t rows, int c, const float* x, float* out) override {
    gpu::sum_rows(ctx_, rows, c, x, out);
  }
  void sum(std::int64_t n, const float* x, float* out) override { gpu::sum(ctx_, n, x, out); }
  void nhwc_to_nchw(std::int64_t n, std::int64_t hw, int c, const float* x, float* y) override {
    gpu::transpose_batched(ctx_, n, hw, c, x, y);
  }
  void nchw_to_nhwc(std::int64_t n, std::int64_t hw, int c, const float* x, float* y) override {
    gpu::transpose_batched(ctx_, n, c, hw, x, y);
  }

  // ---- convolution -------------------------------------------------------------------------
  void conv2d_forward(const Conv2dShape& s, const float* x, const float* w,
                      const float* bias_or_null, float* y) override {
    gpu::conv2d_forward_bias(ctx_, s, x, w, bias_or_null, y);
  }
  void conv2d_backward_input(const Conv2dShape& s, const float* dy, const float* w,
                             float* dx) override {
    gpu::conv2d_backward_input(ctx_, s, dy, w, dx);
  }
  void conv2d_backward_weight(const Conv2dShape& s, const float* x, const float* dy,
                              float* dw) override {
    gpu::conv2d_backward_weight(ctx_, s, x, dy, dw);
  }
  void conv2d_backward_bias(const Conv2dShape& s, const float* dy, float* db) override {
    gpu::conv2d_backward_bias(ctx_, s, dy, db);
  }

  // ---- pooling -----------------------------------------------------------------------------
  void max_pool_forward(const Pool2dShape& s, const float* x, float* y, std::int32_t* argmax,
                        bool relu) override {
    if (relu)
      gpu::max_pool_relu_forward(ctx_, s, x, y, argmax);
    else
      gpu::max_pool_forward(ctx_, s, x, y, argmax);
  }
  void max_pool_backward(const Pool2dShape& s, const float* dy, const std::int32_t* argmax,
                         float* dx) override {
    gpu::max_pool_backward(ctx_, s, dy, argmax, dx);
  }
  void avg_pool_forward(const Pool2dShape& s, const float* x, float* y) override {
    gpu::avg_pool_forward(ctx_, s, x, y);
  }
  void avg_pool_backward(const Pool2dShape& s, const float* dy, float* dx) override {
    gpu::avg_pool_backward(ctx_, s, dy, dx);
  }

  // ---- batch norm --------------------------------------------------------------------------
  void batch_norm_forward_training(std::int64_t rows, int c, const float* x,
                                   const float* residual_or_null, bool relu, const float* gamma,
                                   const float* beta, float eps, float momentum,
                                   float* running_mean, float* running_var, float* y,
                                   float* save_mean, float* save_invstd) override {
    gpu::batch_norm_forward_training_ex(ctx_, rows, c, x, residual_or_null, relu, gamma, beta,
                                        eps, momentum, running_mean, running_var, y, save_mean,
                                        save_invstd);
  }
  void batch_norm_forward_inference(std::int64_t rows, int c, const float* x, const float* gamma,
                                    const float* beta, const float* running_mean,
                                    const float* running_var, float eps, float* y) override {
    gpu::batch_norm_forward_inference(ctx_, rows, c, x, gamma, beta, running_mean, running_var,
                                      eps, y);
  }
  void batch_norm_backward(std::int64_t rows, int c, const float* x, const float* y, bool relu,
                           const float* dy, const float* gamma, const float* /*beta*/,
                           const float* save_mean, const float* save_invstd, float eps, float* dx,
                           float* dgamma, float* dbeta, float* d_pre_relu) override {
    // The mask is read from y: cuDNN's backward takes the ReLU's output.
    if (relu)
      gpu::batch_norm_relu_backward(ctx_, rows, c, x, y, dy, gamma, save_mean, save_invstd, eps,
                                    dx, dgamma, dbeta, d_pre_relu);
    else
      gpu::batch_norm_backward(ctx_, rows, c, x, dy, gamma, save_mean, save_invstd, eps, dx,
                               dgamma, dbeta);
  }

  // ---- gemm, dropout, loss, accuracy ---------------------------------------------------------
  void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
            const float* b, int ldb, float beta, float* c, int ldc) override {
    gpu::gemm(ctx_, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  void dropout_forward(std::int64_t n, float p, std::uint64_t seed, std::uint64_t offset,
                       const float* x, float* y, std::uint8_t* mask) override {
    gpu::dropout_forward(ctx_, n, p, seed, offset, x, y, mask);
  }
  void dropout_backward(std::int64_t n, float p, const std::uint8_t* mask, const float* dy,
                        float* dx) override {
    gpu::dropout_backward(ctx_, n, p, mask, dy, dx);
  }
  void softmax_cross_entropy_forward(std::int64_t rows, int classes, const float* logits,
                                     const std::int32_t* labels, float scale, float smoothing,
                                     float* loss_out, float* probs) override {
    gpu::softmax_cross_entropy_forward(ctx_, rows, classes, logits, labels, scale, smoothing,
                                       loss_out, probs);
  }
  void softmax_cross_entropy_backward(std::int64_t rows, int classes, const float* probs,
                                      const std::int32_t* labels, float scale, float smoothing,
                                      const float* dloss, float* dlogits) override {
    gpu::softmax_cross_entropy_backward(ctx_, rows, classes, probs, labels, scale, smoothing,
                                        dloss, dlogits);
  }
  void top_k_correct(std::int64_t rows, int classes, const float* logits,
                     const std::int32_t* labels, int k, std::int32_t* correct_out) override {
    gpu::top_k_correct(ctx_, rows, classes, logits, labels, k, correct_out);
  }

 private:
  gpu::Half half(Precision p) const {
    if (p == Precision::Fp32)
      raise<InvalidArgument>("16-bit products on ", device(), " asked for in fp32");
    return p == Precision::Bf16 ? gpu::Half::Bf16 : gpu::Half::Fp16;
  }

  gpu::GpuContext ctx_;
  std::string name_;
  bool bf16_products_ = false, fp16_products_ = false;
};

}  // namespace

}  // namespace towerflow

namespace towerflow {

// The registry maps the logical device to its physical GPU (after CUDA_VISIBLE_DEVICES and
// virtual-device splitting); each logical device gets its own context and stream.
std::unique_ptr<Backend> make_gpu_backend(const Device& device, int cuda_ordinal,
                                          Allocator& allocator) {
  return std::make_unique<GpuBackend>(device, cuda_ordinal, allocator);
}

}  // namespace towerflow

namespace towerflow::gpu {

const GpuContext& context_for(const Device& device) {
  std::lock_guard lock(context_table().mu);
  const auto& contexts = context_table().contexts;
  if (auto it = contexts.find(device); it != contexts.end()) return *it->second;
  raise<NotFound>("no GPU backend exists for ", device,
                  " yet; it is made on first use of the device (backend_for(", device, "))");
}

}  // namespace towerflow::gpu
