// The parameter-device strategy (reduction.h: ParameterDevice): each tower copies its gradients
// to the parameter device; the trainer's thread sums them there in tower order (the order the
// all-reduce sums in, so both strategies give the same bits), then across processes through host
// memory; the optimizer steps the master copy once, and every tower copies the master's values
// into its replica before its next forward.
#include <algorithm>

#include "core/collectives/process_group.h"
#include "core/tensor/device_ops.h"
#include "core/trace.h"
#include "tower/reducer.h"
#include "tower/workers.h"

namespace towerflow::tower {

namespace {

std::span<float> host_span(const Tensor& t) { return {t.data<float>(), static_cast<std::size_t>(t.numel())}; }

class ParameterDeviceReducer final : public GradientReducer {
 public:
  ParameterDeviceReducer(Device device, const ReducerSetup& setup) : setup_(setup), device_(device) {
    const auto n = static_cast<std::int64_t>(setup.numel);
    master_params_ = (*setup.replicas)[0]->flat_parameters().to(device_);
    master_grads_ = Tensor::zeros({n}, device_);
    for (std::size_t i = 0; i < setup.devices.size(); ++i) staging_.push_back(Tensor::zeros({n}, device_));
  }

  std::string describe() const override {
    std::string s = str("gradients summed on the parameter device ", device_);
    if (setup_.processes->size() > 1) s += str(", then across processes over ", setup_.processes->name());
    return s;
  }

  void before_forward(int i) override {  // the parameter device's values are the truth
    const trace::Span span("copy", "parameters from the parameter device");
    (*setup_.replicas)[static_cast<std::size_t>(i)]->flat_parameters().copy_(master_params_);
  }

  void after_backward(int i) override {
    const trace::Span span("reduction", "gradients to the parameter device");
    staging_[static_cast<std::size_t>(i)].copy_((*setup_.replicas)[static_cast<std::size_t>(i)]->flat_gradients());
  }

  void finish() override {
    const trace::Span span("reduction", "sum on the parameter device");
    master_grads_.copy_(staging_[0]);
    for (std::size_t i = 1; i < staging_.size(); ++i) axpy_(master_grads_, 1.0f, staging_[i]);
    synchronize(device_);
    if (setup_.processes->size() > 1) {  // then across processes, through host memory
      const trace::Span cross("reduction", "across processes");
      if (device_.is_cpu()) {
        setup_.processes->all_reduce_sum(host_span(master_grads_));
      } else {
        std::vector<float> host(setup_.numel);
        master_grads_.to_host(std::span<float>(host));
        setup_.processes->all_reduce_sum(std::span<float>(host));
        master_grads_.copy_from_host(std::span<const float>(host));
      }
    }
  }

  // Nothing waits between towers here: a failing tower stops only itself.
  void abort(const std::string&) override {}
  void reset() override {}

  // The gathers run in parallel: the slowest one, then the sum.
  double exposed_seconds(std::span<const double> towers, double finish) const override {
    return (towers.empty() ? 0.0 : *std::max_element(towers.begin(), towers.end())) + finish;
  }

  Tensor reduced_gradients() override { return master_grads_; }
  void scale_gradients(float factor) override {
    scale_(master_grads_, factor);
  }

  optim::ParameterSet parameters() override {
    optim::ParameterSet set;
    set.copies.push_back({.device = device_, .params = host_span(master_params_), .grads = host_span(master_grads_)});
    set.for_each_copy = [](const std::function<void(int)>& fn) { fn(0); };
    return set;
  }

  void sync() override {
    setup_.workers->run([&](int i) { (*setup_.replicas)[static_cast<std::size_t>(i)]->flat_parameters().copy_(master_params_); });
  }
  void take_replica0() override { master_params_.copy_((*setup_.replicas)[0]->flat_parameters()); }

 private:
  ReducerSetup setup_;
  Device device_;
  Tensor master_params_, master_grads_;
  std::vector<Tensor> staging_;  // each tower's gradients, on the parameter device
};

}  // namespace

std::unique_ptr<GradientReducer> make_parameter_device_reducer(Device device, const ReducerSetup& setup) {
  return std::make_unique<ParameterDeviceReducer>(device, setup);
}

}  // namespace towerflow::tower
