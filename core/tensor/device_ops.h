#pragma once
// What code outside core/ asks of a device besides the differentiable ops (ops.h): in-place
// updates that record no autograd history, the fused optimizer updates, the device's queue (wait
// for it, mark a point on it) and what its kernels are. The backend interface behind them
// (core/tensor/backend_impl.h) is private to core/.
//
// Contract (every function):
// - Runs on `device`'s backend (the device of the tensors or spans given), the one ops.h's ops
//   use: queued after every earlier call on that device in call order, as seen by the device (a
//   CPU runs it before returning, a GPU queues it on its stream), and driven by one thread at a
//   time, like the ops.
// - Spans and tensor memory are that device's memory (host memory only for a CPU device).
// - A device the registry does not know throws NotFound; a GPU device in a build without CUDA
//   throws DeviceError with gpu::kNoCudaBuildMessage; an op the device has no kernel for throws
//   DeviceError naming it (there is no soft placement here: these act on memory in place).

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "core/device.h"
#include "core/queue_event.h"
#include "core/tensor/optimizer_update.h"
#include "core/tensor/precision.h"
#include "core/tensor/tensor.h"

namespace towerflow {

// The op kinds a device's backend may or may not have a kernel for (has_kernel below).
enum class OpKind {
  kConv2d,          // convolutions, including the bias variants
  kMaxPool,         // max pooling
  kAvgPool,         // average pooling
  kBatchNorm,       // batch norm, including the fused relu / add_relu variants
  kBatchNormSync,   // batch norm cut at its per-channel reductions (synchronised across devices)
  kGemm,            // matrix products
  kElementwise,     // fill, add, mul, scale, axpy, relu, bias_add, sums, layout transposes
  kDropout,         // dropout
  kSoftmaxXent,     // softmax cross-entropy
  kTopK,            // top-k accuracy
  kOptimizerUpdate, // sgd_update_, adam_update_ (fused updates over a flat parameter buffer)
  kBf16Products,    // convolutions and matrix products that read bf16 operands themselves
  kFp16Products,    // the same in fp16
  kBf16Activations, // bf16 storage between batch norm and convolution (Note [bf16 activations])
};
std::string_view to_string(OpKind op);

// ---- what a device runs ------------------------------------------------------------------------
bool has_kernel(const Device& device, OpKind op);
// Its backend, for messages and the start-up block: "CPU (2 threads, Eigen)", "CUDA (cuDNN 9)".
std::string backend_name(const Device& device);
// What it computes with, for a start-up block: a CPU's kernel instruction set and libraries
// ("avx512 (the best this CPU supports)"), a GPU's ("CUDA (cuDNN 9)").
std::string describe_kernels(const Device& device);
// What bf16 or fp16 precision (p) runs on there: "oneDNN avx512_core_bf16 kernels", or
// "emulated: operands rounded to bf16 for the fp32 kernels, slower than fp32".
std::string describe_products(const Device& device, Precision p);

// ---- in place (no autograd history; the tensors' device) --------------------------------------
// y = alpha * y. y float32 and contiguous.
void scale_(const Tensor& y, float alpha);
// y = y + alpha * x. Same shape, dtype float32, device; contiguous. InvalidArgument otherwise.
void axpy_(const Tensor& y, float alpha, const Tensor& x);

// ---- fused optimizer updates (kOptimizerUpdate) -----------------------------------------------
// One pass over n = params.size() floats of parameters, gradients and state, all in `device`'s
// memory, with the formulas and validation of optimizer_update.h. momentum is empty only when
// update.momentum == 0; Adam's state starts at zero. Every span has n floats (InvalidArgument
// otherwise).
void sgd_update_(const Device& device, std::span<float> params, std::span<const float> grads,
                 std::span<float> momentum, const SgdUpdate& update);
void adam_update_(const Device& device, std::span<float> params, std::span<const float> grads,
                  std::span<float> exp_avg, std::span<float> exp_avg_sq, const AdamUpdate& update);

// ---- the device's queue ------------------------------------------------------------------------
// Returns when every earlier call on the device has finished (at once on a CPU).
void synchronize(const Device& device);
// A point after every earlier call on the device, for ordering another queue after it without
// waiting on the host (core/queue_event.h); null when nothing is pending (a CPU's calls are
// complete when they return).
std::shared_ptr<const QueueEvent> record_event(const Device& device);
// The same, for timing (QueueEvent::milliseconds_since); null where the device has no queue to
// time (a CPU: its host times are its times).
std::shared_ptr<const QueueEvent> record_timing_event(const Device& device);

}  // namespace towerflow
