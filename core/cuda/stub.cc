// The CUDA library of a build without CUDA: the same declarations, each a clear error. Two
// answer rather than throw: cuda_availability() (there is no CUDA) and query_cuda_gpus() (no
// GPUs, and why).

#include "core/cuda/copy.h"
#include "core/cuda/ops.h"
#include "core/cuda/optimizer_kernels.h"
#include "core/cuda/status.h"
#include "core/memory/sub_allocators.h"
#include "core/platform/cuda_query.h"
#include "core/tensor/backend_impl.h"

namespace towerflow::gpu {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  raise<DeviceError>(what, ": ", kNoCudaBuildMessage);
}
}  // namespace

bool built_with_cuda() { return false; }

CudaAvailability cuda_availability() {
  CudaAvailability a;
  a.reason = std::string(kNoCudaBuildMessage);
  return a;
}

std::string describe(const CudaAvailability& a) {
  return a.built ? std::string("CUDA built in") : std::string(kNoCudaBuildMessage);
}

// ---- contexts, buffers, events -----------------------------------------------------------------

struct GpuContext::Impl {};

GpuContext::GpuContext(GpuContextOptions opts) {
  raise<DeviceError>("cannot use ", opts.device, ": ", kNoCudaBuildMessage);
}
GpuContext::~GpuContext() = default;
const Device& GpuContext::device() const { no_cuda("GpuContext::device"); }
int GpuContext::ordinal() const { no_cuda("GpuContext::ordinal"); }
Allocator& GpuContext::allocator() const { no_cuda("GpuContext::allocator"); }
bool GpuContext::allow_tf32() const { no_cuda("GpuContext::allow_tf32"); }
void GpuContext::make_current() const { no_cuda("GpuContext::make_current"); }
void GpuContext::synchronize() const { no_cuda("GpuContext::synchronize"); }
void* GpuContext::raw_stream() const { no_cuda("GpuContext::raw_stream"); }

const GpuContext& context_for(const Device& device) {
  raise<DeviceError>("cannot use ", device, ": ", kNoCudaBuildMessage);
}

DeviceBuffer::DeviceBuffer(const GpuContext&, std::size_t) { no_cuda("DeviceBuffer"); }
DeviceBuffer::~DeviceBuffer() = default;
DeviceBuffer::DeviceBuffer(DeviceBuffer&&) noexcept {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&&) noexcept { return *this; }

GpuEvent::GpuEvent(const GpuContext& ctx, bool) : ctx_(&ctx) { no_cuda("GpuEvent"); }
GpuEvent::~GpuEvent() = default;
void GpuEvent::record() { no_cuda("GpuEvent::record"); }
void GpuEvent::make_wait(const GpuContext&) const { no_cuda("GpuEvent::make_wait"); }
void GpuEvent::synchronize() const { no_cuda("GpuEvent::synchronize"); }
bool GpuEvent::done() const { no_cuda("GpuEvent::done"); }
float GpuEvent::elapsed_ms_since(const GpuEvent&) const { no_cuda("GpuEvent::elapsed_ms_since"); }

// ---- copies --------------------------------------------------------------------------------------

void copy_to_device(const GpuContext&, void*, const void*, std::size_t) { no_cuda("copy_to_device"); }
void copy_to_host(const GpuContext&, void*, const void*, std::size_t) { no_cuda("copy_to_host"); }
void copy_device_to_device(const GpuContext&, void*, const void*, std::size_t) {
  no_cuda("copy_device_to_device");
}
void copy_between_devices(const GpuContext&, void*, const GpuContext&, const void*, std::size_t) {
  no_cuda("copy_between_devices");
}
void copy_to_device_async(const GpuContext&, void*, const void*, std::size_t) {
  no_cuda("copy_to_device_async");
}
void copy_to_host_async(const GpuContext&, void*, const void*, std::size_t) {
  no_cuda("copy_to_host_async");
}
void memset_device(const GpuContext&, void*, int, std::size_t) { no_cuda("memset_device"); }
bool can_access_peer(int, int) { no_cuda("can_access_peer"); }

PinnedBuffer::PinnedBuffer(std::size_t) { no_cuda("PinnedBuffer"); }
PinnedBuffer::~PinnedBuffer() = default;
PinnedBuffer::PinnedBuffer(PinnedBuffer&&) noexcept {}
PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&&) noexcept { return *this; }

// ---- kernels -------------------------------------------------------------------------------------

void conv2d_forward(const GpuContext&, const Conv2dShape&, const float*, const float*, float*) {
  no_cuda("conv2d_forward");
}
void conv2d_backward_input(const GpuContext&, const Conv2dShape&, const float*, const float*,
                           float*) {
  no_cuda("conv2d_backward_input");
}
void conv2d_backward_weight(const GpuContext&, const Conv2dShape&, const float*, const float*,
                            float*) {
  no_cuda("conv2d_backward_weight");
}
void conv2d_forward_bias(const GpuContext&, const Conv2dShape&, const float*, const float*,
                         const float*, float*) {
  no_cuda("conv2d_forward_bias");
}
void conv2d_backward_bias(const GpuContext&, const Conv2dShape&, const float*, float*) {
  no_cuda("conv2d_backward_bias");
}
const char* to_string(Half t) { return t == Half::Bf16 ? "bf16" : "fp16"; }
bool half_products_supported(const GpuContext&, Half) { no_cuda("half_products_supported"); }
void conv2d_forward_half(const GpuContext&, Half, const Conv2dShape&, const float*, const float*,
                         float*) {
  no_cuda("conv2d_forward_half");
}
void conv2d_backward_input_half(const GpuContext&, Half, const Conv2dShape&, const float*,
                                const float*, float*) {
  no_cuda("conv2d_backward_input_half");
}
void conv2d_backward_weight_half(const GpuContext&, Half, const Conv2dShape&, const float*,
                                 const float*, float*) {
  no_cuda("conv2d_backward_weight_half");
}
void gemm_half(const GpuContext&, Half, bool, bool, int, int, int, const float*, int,
               const float*, int, float*, int) {
  no_cuda("gemm_half");
}
void float_to_half(const GpuContext&, Half, std::int64_t, const float*, void*) {
  no_cuda("float_to_half");
}
void half_to_float(const GpuContext&, Half, std::int64_t, const void*, float*) {
  no_cuda("half_to_float");
}
void max_pool_forward(const GpuContext&, const Pool2dShape&, const float*, float*, std::int32_t*) {
  no_cuda("max_pool_forward");
}
void max_pool_backward(const GpuContext&, const Pool2dShape&, const float*, const std::int32_t*,
                       float*) {
  no_cuda("max_pool_backward");
}
void max_pool_relu_forward(const GpuContext&, const Pool2dShape&, const float*, float*,
                           std::int32_t*) {
  no_cuda("max_pool_relu_forward");
}
void avg_pool_forward(const GpuContext&, const Pool2dShape&, const float*, float*) {
  no_cuda("avg_pool_forward");
}
void avg_pool_backward(const GpuContext&, const Pool2dShape&, const float*, float*) {
  no_cuda("avg_pool_backward");
}
void batch_norm_forward_training_ex(const GpuContext&, std::int64_t, int, const float*,
                                    const float*, bool, const float*, const float*, float, float,
                                    float*, float*, float*, float*, float*) {
  no_cuda("batch_norm_forward_training");
}
void batch_norm_forward_training(const GpuContext&, std::int64_t, int, const float*, const float*,
                                 const float*, float, float*, float*, float*) {
  no_cuda("batch_norm_forward_training");
}
void batch_norm_forward_inference(const GpuContext&, std::int64_t, int, const float*,
                                  const float*, const float*, const float*, const float*, float,
                                  float*) {
  no_cuda("batch_norm_forward_inference");
}
void batch_norm_backward(const GpuContext&, std::int64_t, int, const float*, const float*,
                         const float*, const float*, const float*, float, float*, float*,
                         float*) {
  no_cuda("batch_norm_backward");
}
void batch_norm_relu_forward_training(const GpuContext&, std::int64_t, int, const float*,
                                      const float*, const float*, float, float*, float*, float*) {
  no_cuda("batch_norm_relu_forward_training");
}
void batch_norm_add_relu_forward_training(const GpuContext&, std::int64_t, int, const float*,
                                          const float*, const float*, const float*, float, float*,
                                          float*, float*) {
  no_cuda("batch_norm_add_relu_forward_training");
}
void batch_norm_relu_backward(const GpuContext&, std::int64_t, int, const float*, const float*,
                              const float*, const float*, const float*, const float*, float,
                              float*, float*, float*, float*) {
  no_cuda("batch_norm_relu_backward");
}
void gemm(const GpuContext&, bool, bool, int, int, int, float, const float*, int, const float*,
          int, float, float*, int) {
  no_cuda("gemm");
}
void softmax_forward(const GpuContext&, std::int64_t, int, const float*, float*) {
  no_cuda("softmax_forward");
}
void softmax_backward(const GpuContext&, std::int64_t, int, const float*, const float*, float*) {
  no_cuda("softmax_backward");
}
void log_softmax_forward(const GpuContext&, std::int64_t, int, const float*, float*) {
  no_cuda("log_softmax_forward");
}
void log_softmax_backward(const GpuContext&, std::int64_t, int, const float*, const float*,
                          float*) {
  no_cuda("log_softmax_backward");
}
void softmax_cross_entropy_forward(const GpuContext&, std::int64_t, int, const float*,
                                   const std::int32_t*, float, float, float*, float*) {
  no_cuda("softmax_cross_entropy_forward");
}
void softmax_cross_entropy_backward(const GpuContext&, std::int64_t, int, const float*,
                                    const std::int32_t*, float, float, const float*, float*) {
  no_cuda("softmax_cross_entropy_backward");
}
void top_k_correct(const GpuContext&, std::int64_t, int, const float*, const std::int32_t*, int,
                   std::int32_t*) {
  no_cuda("top_k_correct");
}
void fill(const GpuContext&, std::int64_t, float, float*) { no_cuda("fill"); }
void relu_forward(const GpuContext&, std::int64_t, const float*, float*) {
  no_cuda("relu_forward");
}
void relu_backward(const GpuContext&, std::int64_t, const float*, const float*, float*) {
  no_cuda("relu_backward");
}
void gelu_forward(const GpuContext&, std::int64_t, const float*, float*) {
  no_cuda("gelu_forward");
}
void gelu_backward(const GpuContext&, std::int64_t, const float*, const float*, float*) {
  no_cuda("gelu_backward");
}
void add(const GpuContext&, std::int64_t, const float*, const float*, float*) { no_cuda("add"); }
void mul(const GpuContext&, std::int64_t, const float*, const float*, float*) { no_cuda("mul"); }
void transpose_batched(const GpuContext&, std::int64_t, std::int64_t, std::int64_t, const float*,
                       float*) {
  no_cuda("transpose_batched");
}
void scale(const GpuContext&, std::int64_t, float, const float*, float*) { no_cuda("scale"); }
void axpy(const GpuContext&, std::int64_t, float, const float*, float*) { no_cuda("axpy"); }
void bias_add(const GpuContext&, std::int64_t, int, const float*, const float*, float*) {
  no_cuda("bias_add");
}
void sum_rows(const GpuContext&, std::int64_t, int, const float*, float*) { no_cuda("sum_rows"); }
void sum(const GpuContext&, std::int64_t, const float*, float*) { no_cuda("sum"); }
void sum_squares(const GpuContext&, std::int64_t, const float*, float*) {
  no_cuda("sum_squares");
}
void dropout_forward(const GpuContext&, std::int64_t, float, std::uint64_t, std::uint64_t,
                     const float*, float*, std::uint8_t*) {
  no_cuda("dropout_forward");
}
void dropout_backward(const GpuContext&, std::int64_t, float, const std::uint8_t*, const float*,
                      float*) {
  no_cuda("dropout_backward");
}

// ---- optimizers ----------------------------------------------------------------------------------

void sgd_update(const GpuContext&, std::int64_t, float*, const float*, float*, const SgdStep&) {
  no_cuda("sgd_update");
}
void adam_update(const GpuContext&, std::int64_t, float*, const float*, float*, float*,
                 const AdamStep&) {
  no_cuda("adam_update");
}

}  // namespace towerflow::gpu

namespace towerflow {

// A GPU device in a build without CUDA: the backend cannot exist.
std::unique_ptr<Backend> make_gpu_backend(const Device& device, int, Allocator&) {
  raise<DeviceError>("cannot use ", device, ": ", gpu::kNoCudaBuildMessage);
}

}  // namespace towerflow

// ---- device discovery (core/platform/cuda_query.h) and memory (core/memory/sub_allocators.h) --

namespace towerflow::detail {

std::vector<GpuDescription> query_cuda_gpus(std::string* why) {
  if (why) *why = "this build has no CUDA support (rebuild with -DTOWERFLOW_CUDA=ON to use GPUs)";
  return {};
}

GpuMemoryInfo query_cuda_memory(int ordinal) {
  raise<DeviceError>("cannot read the free memory of CUDA device ", ordinal, ": ",
                     gpu::kNoCudaBuildMessage);
}

}  // namespace towerflow::detail

namespace towerflow {

std::unique_ptr<SubAllocator> make_cuda_sub_allocator(int cuda_ordinal) {
  if (cuda_ordinal < 0)
    raise<InvalidArgument>("CUDA device ordinal ", cuda_ordinal, " is negative; use 0 or above");
  raise<DeviceError>("cannot allocate memory on CUDA device ", cuda_ordinal, ": ",
                     gpu::kNoCudaBuildMessage);
}

std::unique_ptr<SubAllocator> make_pinned_host_sub_allocator() {
  raise<DeviceError>("cannot allocate pinned host memory: ", gpu::kNoCudaBuildMessage);
}

}  // namespace towerflow
