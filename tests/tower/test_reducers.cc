// Each reduction strategy alone (tower/reducer.h), driven the way the trainer drives it, over the
// local shared-memory communicator of three CPU devices. The reference is the sum of the towers'
// gradients formed here in tower order (0 + 1 + 2), the order every strategy promises.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "core/collectives/communicator.h"
#include "core/collectives/process_group.h"
#include "core/error.h"
#include "core/nn/module.h"
#include "core/tensor/autograd.h"
#include "core/tensor/ops.h"
#include "tower/reducer.h"
#include "tower/workers.h"
#include "tests/tower/four_cpu_devices.h"

using namespace towerflow;
using namespace towerflow::tower;

namespace {

const std::vector<std::int64_t> kSizes = {5, 300, 7, 40};  // parameters 0..3

// Four parameter vectors; the loss is sum_p sum(c_p * w_p), so the gradient of w_p is c_p.
class Params : public nn::Module {
 public:
  explicit Params(const Device& d) : Module(d) {
    for (std::size_t p = 0; p < kSizes.size(); ++p)
      register_parameter("w" + std::to_string(p), Tensor::full({kSizes[p]}, 1.0f, d).set_requires_grad(true));
    flatten();
  }
  Tensor forward(const Tensor& x) override { return x; }
};

// Tower i's gradient of element j: distinct per tower, not exactly summable in any order.
float grad_value(int tower, std::size_t j) { return 0.1f * static_cast<float>(tower + 1) + 1e-3f * static_cast<float>(j % 97); }

struct Towers {
  std::vector<Device> devices = testing::cpus(3);
  std::vector<std::shared_ptr<nn::Module>> replicas;
  DeviceWorkers workers{devices};
  std::size_t numel = 0;

  Towers() {
    for (const Device& d : devices) replicas.push_back(std::make_shared<Params>(d));
    numel = static_cast<std::size_t>(replicas[0]->flat_parameters().numel());
  }
  ReducerSetup setup() {
    return {.devices = devices, .replicas = &replicas, .workers = &workers, .processes = &collectives::world(),
            .numel = numel};
  }
  std::unique_ptr<GradientReducer> make(const Reduction& r) {
    ReductionChoice choice = choose_reduction(r, devices, collectives::world());
    return make_reducer(std::move(choice), setup());
  }

  // Tower i's backward: loss = sum_p sum(c_p * w_p), the c_p giving grad_value(i, .).
  void backward_of(int i, GradientReducer& reducer) {
    nn::Module& m = *replicas[static_cast<std::size_t>(i)];
    m.zero_grad();
    std::vector<float> c(numel);
    for (std::size_t j = 0; j < numel; ++j) c[j] = grad_value(i, j);
    Tensor loss;
    std::size_t off = 0;
    for (auto& [name, w] : m.named_parameters()) {
      const auto n = static_cast<std::size_t>(w.numel());
      Tensor cp = Tensor::from_host(std::span<const float>(c).subspan(off, n), {w.numel()}, m.device());
      Tensor term = sum(mul(cp, w));
      loss = loss.defined() ? add(loss, term) : term;
      off += n;
    }
    backward(loss, reducer.backward_hooks(i));
  }

  // One step as the trainer runs it; `fail` (>= 0) throws OutOfMemory on that tower after its
  // backward hooks were taken.
  void step(GradientReducer& reducer, int fail = -1) {
    workers.run(
        [&](int i) {
          reducer.before_forward(i);
          if (i == fail) {
            (void)reducer.backward_hooks(i);
            raise<OutOfMemory>("tower ", i, " out of memory (test)");
          }
          backward_of(i, reducer);
          reducer.after_backward(i);
        },
        [&](int i, std::exception_ptr) { reducer.abort(str("tower ", i, " failed")); });
    reducer.finish();
  }

  std::vector<float> expected() const {
    std::vector<float> e(numel);
    for (std::size_t j = 0; j < numel; ++j) e[j] = (grad_value(0, j) + grad_value(1, j)) + grad_value(2, j);
    return e;
  }
};

std::vector<float> host(std::span<const float> s) { return {s.begin(), s.end()}; }

const std::vector<Reduction> kStrategies = {ParameterDevice{}, ParameterDevice{Device::cpu(2)}, AllReduce{},
                                            AllReduce{.bucket_bytes = 64}, AllReduce{.bucket_bytes = 1 << 20}};

}  // namespace

TEST_CASE("every reducer leaves the towers' sum, in tower order, where the optimizer reads", "[tower][reducer]") {
  for (const Reduction& r : kStrategies) {
    INFO(to_string(r));
    Towers t;
    auto reducer = t.make(r);
    for (int step = 0; step < 2; ++step) {  // twice: the second step reuses the buffers and workers
      t.step(*reducer);
      const std::vector<float> expect = t.expected();
      CHECK(reducer->reduced_gradients().to_host() == expect);
      const optim::ParameterSet set = reducer->parameters();
      REQUIRE(set.copies.size() == (std::holds_alternative<ParameterDevice>(r) ? 1u : 3u));
      for (const auto& copy : set.copies) CHECK(host(copy.grads) == expect);
    }
    // scale_gradients reaches every copy the optimizer reads.
    reducer->scale_gradients(0.5f);
    std::vector<float> half = t.expected();
    for (float& x : half) x *= 0.5f;
    for (const auto& copy : reducer->parameters().copies) CHECK(host(copy.grads) == half);
  }
}

TEST_CASE("the bucketed reducer starts every bucket from autograd's final-gradient signal", "[tower][reducer][bucketed]") {
  Towers t;
  // 64-byte buckets of whole parameters from the last: {w3}, {w2}, {w1}, {w0}.
  auto reducer = t.make(AllReduce{.bucket_bytes = 64});
  CHECK_THAT(reducer->describe(), Catch::Contains("bucketed all_reduce (4 buckets of at most 64 bytes"));
  t.step(*reducer);
  CHECK(reducer->reduced_during_backward() == 3 * 4);
  // A tower whose backward named no parameter (no rows in the last micro-batch) still takes part.
  t.workers.run([&](int i) {
    if (i != 1) t.backward_of(i, *reducer);
    else t.replicas[1]->zero_grad();
    reducer->after_backward(i);
  });
  std::vector<float> expect(t.numel);
  for (std::size_t j = 0; j < t.numel; ++j) expect[j] = (grad_value(0, j) + 0.0f) + grad_value(2, j);
  CHECK(reducer->reduced_gradients().to_host() == expect);
}

TEST_CASE("a failing tower releases the others with CollectiveAborted, and reset makes the reducer whole",
          "[tower][reducer][failure]") {
  for (const Reduction& r : kStrategies) {
    INFO(to_string(r));
    Towers t;
    auto reducer = t.make(r);
    REQUIRE_THROWS_AS(t.step(*reducer, /*fail=*/1), OutOfMemory);
    reducer->reset();
    t.step(*reducer);
    CHECK(reducer->reduced_gradients().to_host() == t.expected());
  }
}

TEST_CASE("the parameter device's values reach every replica before forward and on sync", "[tower][reducer]") {
  Towers t;
  auto reducer = t.make(ParameterDevice{Device::cpu(1)});
  optim::ParameterSet set = reducer->parameters();
  REQUIRE(set.copies.size() == 1);
  CHECK(set.copies[0].device == Device::cpu(1));
  std::fill(set.copies[0].params.begin(), set.copies[0].params.end(), 2.5f);  // an optimizer's update
  reducer->sync();
  for (auto& m : t.replicas) CHECK(m->flat_parameters().to_host() == std::vector<float>(t.numel, 2.5f));
  std::fill(set.copies[0].params.begin(), set.copies[0].params.end(), -1.0f);
  t.workers.run([&](int i) { reducer->before_forward(i); });
  for (auto& m : t.replicas) CHECK(m->flat_parameters().to_host() == std::vector<float>(t.numel, -1.0f));
  // A checkpoint loaded into replica 0 becomes the master's values.
  std::vector<float> loaded(t.numel, 7.0f);
  t.replicas[0]->flat_parameters().copy_from_host(std::span<const float>(loaded));
  reducer->take_replica0();
  CHECK(host(set.copies[0].params) == loaded);
}

TEST_CASE("the exposed reduction time: the fastest tower for an all-reduce, the slowest gather for a parameter device",
          "[tower][reducer]") {
  Towers t;
  const std::vector<double> towers = {0.3, 0.1, 0.2};
  CHECK(t.make(AllReduce{})->exposed_seconds(towers, 0.0) == Approx(0.1));
  CHECK(t.make(ParameterDevice{})->exposed_seconds(towers, 0.05) == Approx(0.35));
}
