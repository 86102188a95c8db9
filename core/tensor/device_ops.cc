// device_ops.h over the private backend table (backend_impl.h).
#include "core/tensor/device_ops.h"

#include "core/error.h"
#include "core/tensor/backend_impl.h"

namespace towerflow {

std::string_view to_string(OpKind op) {
  switch (op) {
    case OpKind::kConv2d: return "conv2d";
    case OpKind::kMaxPool: return "max_pool";
    case OpKind::kAvgPool: return "avg_pool";
    case OpKind::kBatchNorm: return "batch_norm";
    case OpKind::kBatchNormSync: return "batch_norm_sync";
    case OpKind::kGemm: return "gemm";
    case OpKind::kElementwise: return "elementwise";
    case OpKind::kDropout: return "dropout";
    case OpKind::kSoftmaxXent: return "softmax_cross_entropy";
    case OpKind::kTopK: return "top_k";
    case OpKind::kOptimizerUpdate: return "optimizer_update";
    case OpKind::kBf16Products: return "bf16_products";
    case OpKind::kFp16Products: return "fp16_products";
    case OpKind::kBf16Activations: return "bf16_activations";
  }
  return "?";
}

bool has_kernel(const Device& device, OpKind op) { return backend_for(device).supports(op); }

std::string backend_name(const Device& device) { return backend_for(device).name(); }

std::string describe_kernels(const Device& device) { return backend_for(device).describe_kernels(); }

std::string describe_products(const Device& device, Precision p) {
  return backend_for(device).describe_products(p);
}

namespace {

// A float32 contiguous tensor's elements, for an in-place op named `op`.
float* elements(const Tensor& t, std::string_view op, std::string_view name) {
  if (!t.defined()) raise<InvalidArgument>(op, ": ", name, " is undefined");
  if (!t.is_contiguous())
    raise<InvalidArgument>(op, ": ", name, " ", t.describe(), " is not contiguous; pass a contiguous tensor");
  return t.data<float>();  // InvalidArgument naming the dtype unless float32
}

void check_size(std::string_view op, std::string_view name, std::size_t got, std::size_t n) {
  if (got != n)
    raise<InvalidArgument>(op, ": ", name, " has ", got, " floats and the parameters ", n,
                           "; pass one float of ", name, " per parameter");
}

Backend& with_kernel(const Device& device, OpKind op, std::string_view what) {
  Backend& be = backend_for(device);
  if (!be.supports(op))
    raise<DeviceError>(what, ": no ", to_string(op), " kernel on ", device, " (", be.name(), ")");
  return be;
}

}  // namespace

void scale_(const Tensor& y, float alpha) {
  float* p = elements(y, "scale_", "y");
  with_kernel(y.device(), OpKind::kElementwise, "scale_").scale(y.numel(), alpha, p, p);
}

void axpy_(const Tensor& y, float alpha, const Tensor& x) {
  float* py = elements(y, "axpy_", "y");
  const float* px = elements(x, "axpy_", "x");
  if (x.device() != y.device() || x.shape() != y.shape())
    raise<InvalidArgument>("axpy_: y ", y.describe(), " and x ", x.describe(),
                           " must have the same shape and device");
  with_kernel(y.device(), OpKind::kElementwise, "axpy_").axpy(y.numel(), alpha, px, py);
}

void sgd_update_(const Device& device, std::span<float> params, std::span<const float> grads,
                 std::span<float> momentum, const SgdUpdate& update) {
  const std::size_t n = params.size();
  check_size("sgd_update_", "grads", grads.size(), n);
  if (update.momentum != 0 || !momentum.empty()) check_size("sgd_update_", "momentum", momentum.size(), n);
  with_kernel(device, OpKind::kOptimizerUpdate, "sgd_update_")
      .sgd_update(static_cast<std::int64_t>(n), params.data(), grads.data(),
                  momentum.empty() ? nullptr : momentum.data(), update);
}

void adam_update_(const Device& device, std::span<float> params, std::span<const float> grads,
                  std::span<float> exp_avg, std::span<float> exp_avg_sq, const AdamUpdate& update) {
  const std::size_t n = params.size();
  check_size("adam_update_", "grads", grads.size(), n);
  check_size("adam_update_", "exp_avg", exp_avg.size(), n);
  check_size("adam_update_", "exp_avg_sq", exp_avg_sq.size(), n);
  with_kernel(device, OpKind::kOptimizerUpdate, "adam_update_")
      .adam_update(static_cast<std::int64_t>(n), params.data(), grads.data(), exp_avg.data(),
                   exp_avg_sq.data(), update);
}

void synchronize(const Device& device) { backend_for(device).synchronize(); }

std::shared_ptr<const QueueEvent> record_event(const Device& device) {
  return backend_for(device).record_event();
}

std::shared_ptr<const QueueEvent> record_timing_event(const Device& device) {
  return backend_for(device).record_timing_event();
}

}  // namespace towerflow
