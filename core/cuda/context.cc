// GpuContext, DeviceBuffer and GpuEvent.
//
// Note [Stream-ordered frees]
// A DeviceBuffer returns its memory to the device's allocator as soon as it dies on the host,
// while kernels queued on the stream may still be using it. That is safe for the same reason it
// is in TensorFlow's GPU allocator: the next user of the memory is work queued later on the same
// stream (each logical device has one compute stream and its own allocator), which the GPU runs
// after the earlier work. Work on another stream that touches the memory must be ordered with a
// GpuEvent before the buffer is freed; copy_between_devices does that itself.

#include <cuda_runtime.h>

#include <utility>

#include "core/cuda/context_impl.h"
#include "core/cuda/module_loading.h"
#include "core/log.h"

namespace towerflow::gpu {

ConvPlan::~ConvPlan() {
  if (x_desc) cudnnDestroyTensorDescriptor(x_desc);
  if (y_desc) cudnnDestroyTensorDescriptor(y_desc);
  if (w_desc) cudnnDestroyFilterDescriptor(w_desc);
  if (conv_desc) cudnnDestroyConvolutionDescriptor(conv_desc);
}

namespace {

void check_ordinal(const GpuContextOptions& opts) {
  if (opts.allocator == nullptr)
    raise<InvalidArgument>("GpuContext for ", opts.device,
                           " needs a device allocator (GpuContextOptions::allocator is null); pass "
                           "device_allocator(", opts.device, ")");
  load_cuda_modules_eagerly();  // may be the first CUDA call: Note [Eager CUDA module loading]
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    const CudaAvailability a = cuda_availability();
    raise<DeviceError>("cannot use ", opts.device, " (CUDA ordinal ", opts.ordinal,
                       "): ", a.reason.empty() ? cudaGetErrorString(status) : a.reason);
  }
  if (opts.ordinal < 0 || opts.ordinal >= count)
    raise<InvalidArgument>("CUDA ordinal ", opts.ordinal, " for ", opts.device,
                           " does not exist: the driver shows ", count,
                           count == 1 ? std::string(" GPU (ordinal 0)")
                                      : str(" GPUs (ordinals 0..", count - 1, ")"),
                           "; check CUDA_VISIBLE_DEVICES");
}

}  // namespace

GpuContext::GpuContext(GpuContextOptions opts) : impl_(std::make_unique<Impl>()) {
  check_ordinal(opts);
  Impl& m = *impl_;
  m.opts = opts;
  auto scope = m.scope();
  try {
    // Non-blocking: the stream does not synchronise with the legacy default stream, so towers on
    // one GPU (virtual devices) never serialise behind each other through stream 0.
    TW_CUDA_CHECK(cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking));
    TW_CUDNN_CHECK(cudnnCreate(&m.cudnn));
    TW_CUDNN_CHECK(cudnnSetStream(m.cudnn, m.stream));
    TW_CUBLAS_CHECK(cublasCreate(&m.cublas));
    TW_CUBLAS_CHECK(cublasSetStream(m.cublas, m.stream));
    // FP32 stays FP32 unless asked: PyTorch's default for matmul, and what the parity tests assume.
    TW_CUBLAS_CHECK(cublasSetMathMode(
        m.cublas, opts.allow_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    // NVIDIA's recommended cuBLAS workspace: 32 MiB on Hopper and later, 4 MiB before.
    int major = 0;
    TW_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, opts.ordinal));
    const std::size_t cublas_bytes = static_cast<std::size_t>(major >= 9 ? 32 : 4) << 20;
    m.cublas_workspace = m.allocate(cublas_bytes);
    TW_CUBLAS_CHECK(cublasSetWorkspace(m.cublas, m.cublas_workspace, cublas_bytes));
    for (int i = 0; i < 2; ++i) {
      TW_CUDA_CHECK(cudaHostAlloc(&m.staging[i], Impl::kStagingBytes, cudaHostAllocPortable));
      TW_CUDA_CHECK(cudaEventCreateWithFlags(&m.staging_done[i], cudaEventDisableTiming));
    }
    m.input_errors = static_cast<int*>(m.allocate(4 * sizeof(int)));
    TW_CUDA_CHECK(cudaMemsetAsync(m.input_errors, 0, 4 * sizeof(int), m.stream));
  } catch (...) {
    // Release what was made before the failure; the destructor does not run for a throwing ctor.
    impl_->conv_plans.clear();
    if (m.input_errors) m.opts.allocator->deallocate(m.input_errors);
    if (m.cublas_workspace) m.opts.allocator->deallocate(m.cublas_workspace);
    for (int i = 0; i < 2; ++i) {
      if (m.staging_done[i]) cudaEventDestroy(m.staging_done[i]);
      if (m.staging[i]) cudaFreeHost(m.staging[i]);
    }
    if (m.cublas) cublasDestroy(m.cublas);
    if (m.cudnn) cudnnDestroy(m.cudnn);
    if (m.stream) cudaStreamDestroy(m.stream);
    throw;
  }
}

GpuContext::~GpuContext() {
  Impl& m = *impl_;
  try {
    auto scope = m.scope();
    cudaStreamSynchronize(m.stream);
  } catch (const std::exception& e) {
    log_warning(str("GpuContext for ", m.opts.device, ": ", e.what()));
  }
  m.conv_plans.clear();
  if (m.input_errors) m.opts.allocator->deallocate(m.input_errors);
  cublasDestroy(m.cublas);  // before its workspace goes back to the pool
  m.cublas = nullptr;
  if (m.cublas_workspace) m.opts.allocator->deallocate(m.cublas_workspace);
  for (int i = 0; i < 2; ++i) {
    cudaEventDestroy(m.staging_done[i]);
    cudaFreeHost(m.staging[i]);
  }
  cudnnDestroy(m.cudnn);
  cudaStreamDestroy(m.stream);
  cudaGetLastError();
}

const Device& GpuContext::device() const { return impl_->opts.device; }
int GpuContext::ordinal() const { return impl_->opts.ordinal; }
Allocator& GpuContext::allocator() const { return *impl_->opts.allocator; }
bool GpuContext::allow_tf32() const { return impl_->opts.allow_tf32; }
void* GpuContext::raw_stream() const { return impl_->stream; }

void GpuContext::make_current() const { TW_CUDA_CHECK(cudaSetDevice(impl_->opts.ordinal)); }

void GpuContext::synchronize() const {
  Impl& m = *impl_;
  auto scope = m.scope();
  int errors[4] = {0, 0, 0, 0};
  TW_CUDA_CHECK(cudaMemcpyAsync(errors, m.input_errors, sizeof errors, cudaMemcpyDeviceToHost,
                                m.stream));
  TW_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  if (errors[0] != 0) {
    TW_CUDA_CHECK(cudaMemsetAsync(m.input_errors, 0, sizeof errors, m.stream));
    raise<InvalidArgument>("softmax_cross_entropy on ", m.opts.device, ": ", errors[0],
                           " label(s) outside [0, ", errors[3], "); the first is ", errors[1],
                           " in row ", errors[2],
                           ". Labels must be class indices; check the dataset's class count "
                           "against the model's output size");
  }
}

// ---- DeviceBuffer ------------------------------------------------------------------------------

DeviceBuffer::DeviceBuffer(const GpuContext& ctx, std::size_t bytes)
    : allocator_(&ctx.allocator()), ptr_(allocator_->allocate(bytes)), bytes_(bytes) {}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) allocator_->deallocate(ptr_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : allocator_(std::exchange(other.allocator_, nullptr)),
      ptr_(std::exchange(other.ptr_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (ptr_ != nullptr) allocator_->deallocate(ptr_);
    allocator_ = std::exchange(other.allocator_, nullptr);
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

// ---- GpuEvent ----------------------------------------------------------------------------------

GpuEvent::GpuEvent(const GpuContext& ctx, bool timing) : ctx_(&ctx), timing_(timing) {
  auto scope = ctx.impl().scope();
  cudaEvent_t e = nullptr;
  TW_CUDA_CHECK(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
  event_ = e;
}

GpuEvent::~GpuEvent() {
  if (event_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
}

void GpuEvent::record() {
  auto scope = ctx_->impl().scope();
  TW_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event_), stream_of(*ctx_)));
  recorded_ = true;
}

void GpuEvent::make_wait(const GpuContext& other) const {
  auto scope = other.impl().scope();
  TW_CUDA_CHECK(cudaStreamWaitEvent(stream_of(other), static_cast<cudaEvent_t>(event_), 0));
}

void GpuEvent::synchronize() const {
  auto scope = ctx_->impl().scope();
  TW_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)));
}

bool GpuEvent::done() const {
  auto scope = ctx_->impl().scope();
  const cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(event_));
  if (status == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  TW_CUDA_CHECK(status);
  return true;
}

float GpuEvent::elapsed_ms_since(const GpuEvent& start) const {
  if (!timing_ || !start.timing_)
    raise<InvalidArgument>("GpuEvent::elapsed_ms_since needs two timing events on ",
                           ctx_->device(), "; construct them with GpuEvent(ctx, /*timing=*/true)");
  if (!recorded_ || !start.recorded_)
    raise<InvalidArgument>("GpuEvent::elapsed_ms_since on ", ctx_->device(),
                           ": both events must be recorded first");
  auto scope = ctx_->impl().scope();
  float ms = 0.0f;
  TW_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start.event_),
                                     static_cast<cudaEvent_t>(event_)));
  return ms;
}

}  // namespace towerflow::gpu
