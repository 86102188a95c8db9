// The all-reduce strategy (reduction.h: AllReduce without buckets): once a tower's backward has
// finished, one sum all-reduce of its replica's flat gradient buffer; the optimizer then steps
// every replica alike.
#include "core/collectives/communicator.h"
#include "core/collectives/context.h"
#include "core/tensor/device_ops.h"
#include "core/trace.h"
#include "tower/reducer.h"

namespace towerflow::tower {

namespace {

class AllReduceReducer final : public GradientReducer {
 public:
  AllReduceReducer(std::unique_ptr<collectives::Communicator> comm, const ReducerSetup& setup)
      : setup_(setup), comm_(std::move(comm)) {}

  std::string describe() const override { return "all_reduce over " + comm_->name(); }

  void after_backward(int i) override {
    const trace::Span span("reduction", "all-reduce");
    const Device& dev = setup_.devices[static_cast<std::size_t>(i)];
    if (!dev.is_cpu()) synchronize(dev);  // the gradients are written
    const Tensor g = (*setup_.replicas)[static_cast<std::size_t>(i)]->flat_gradients();
    const collectives::ContextScope gradients({.purpose = "gradients"});
    comm_->all_reduce_sum(i, {g.data<float>(), static_cast<std::size_t>(g.numel())});
  }

  void abort(const std::string& reason) override { comm_->abort(reason); }
  void reset() override { comm_->reset(); }

  Tensor reduced_gradients() override { return (*setup_.replicas)[0]->flat_gradients(); }
  void scale_gradients(float factor) override { scale_replica_gradients(setup_, factor); }
  optim::ParameterSet parameters() override { return replica_parameter_set(setup_); }
  std::string recent_collectives() const override { return comm_->recent_collectives(); }

 private:
  ReducerSetup setup_;
  std::unique_ptr<collectives::Communicator> comm_;
};

}  // namespace

std::unique_ptr<GradientReducer> make_all_reduce_reducer(std::unique_ptr<collectives::Communicator> comm,
                                                         const ReducerSetup& setup) {
  return std::make_unique<AllReduceReducer>(std::move(comm), setup);
}

}  // namespace towerflow::tower
