#include <catch2/catch.hpp>

#include <cmath>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/platform/registry.h"
#include "core/memory/allocator.h"
#include "core/tensor/backend_impl.h"
#include "core/tensor/cpu_backend.h"
#include "core/tensor/optimizer_update.h"
#include "fixtures.h"
#include "optim/optim.h"

using namespace towerflow;
using namespace towerflow::optim;

namespace {

std::unique_ptr<Optimizer> make(const nlohmann::json& c, ParameterSet set) {
  const auto& o = c["options"];
  const std::string kind = c["kind"];
  if (kind == "sgd")
    return std::make_unique<Sgd>(std::move(set), SgdOptions{.lr = o.value("lr", 0.01),
                                                            .momentum = o.value("momentum", 0.0),
                                                            .dampening = o.value("dampening", 0.0),
                                                            .weight_decay = o.value("weight_decay", 0.0),
                                                            .nesterov = o.value("nesterov", false)});
  AdamOptions a{.lr = o.value("lr", 1e-3), .weight_decay = o.value("weight_decay", 0.0)};
  if (kind == "adamw" && !o.contains("weight_decay")) a.weight_decay = 1e-2;
  if (o.contains("betas")) {
    a.beta1 = o["betas"][0];
    a.beta2 = o["betas"][1];
  }
  if (o.contains("eps")) a.eps = o["eps"];
  if (kind == "adam") return std::make_unique<Adam>(std::move(set), a);
  return std::make_unique<AdamW>(std::move(set), a);
}

// Overwrites g in place: the optimizer holds a span of it.
void load(std::vector<float>& g, const nlohmann::json& values) {
  const auto v = values.get<std::vector<float>>();
  REQUIRE(v.size() == g.size());
  std::copy(v.begin(), v.end(), g.begin());
}

std::vector<ParameterSlot> slots_of(const nlohmann::json& c) {
  std::vector<ParameterSlot> slots;
  std::size_t off = 0;
  int i = 0;
  for (std::size_t n : c["sizes"].get<std::vector<std::size_t>>()) {
    slots.push_back({.name = "p" + std::to_string(i++), .offset = off, .size = n,
                     .shape = {static_cast<std::int64_t>(n)}});
    off += n;
  }
  return slots;
}

}  // namespace

TEST_CASE("optimizers match torch.optim step by step", "[optim]") {
  for (const auto& c : optim_reference()["optimizers"]) {
    const std::string name = c["name"];
    SECTION(name) {
      std::vector<float> p = c["init"].get<std::vector<float>>();
      std::vector<float> g(p.size());
      auto opt = make(c, ParameterSet::single(p, g, slots_of(c)));
      double max_err = 0;
      for (std::size_t s = 0; s < c["grads"].size(); ++s) {
        load(g, c["grads"][s]);
        opt->step();
        const auto expect = c["params_after_step"][s].get<std::vector<float>>();
        // Norm-wise relative error: each element's error against the largest parameter (an
        // update that cancels a parameter to near zero keeps the rounding of the operands).
        double scale = 0;
        for (float e : expect) scale = std::max(scale, std::abs(double(e)));
        for (std::size_t i = 0; i < p.size(); ++i)
          max_err = std::max(max_err, std::abs(double(p[i]) - expect[i]) / scale);
      }
      INFO(name << ": max norm-wise relative error " << max_err);
      CHECK(max_err < 5e-7);  // a few float ulps
      CHECK(opt->step_count() == static_cast<std::int64_t>(c["grads"].size()));
    }
  }
}

TEST_CASE("every copy gets the identical update, state saves and restores by name", "[optim]") {
  // Two CPU devices, each copy updated by its own device's backend.
  reset_backends_for_testing();
  reset_devices_for_testing();
  initialise_devices(ProcessOptions{.device_count = {{"CPU", 2}}});
  const auto& c = optim_reference()["optimizers"][3];  // sgd_nesterov
  REQUIRE(c["name"] == "sgd_nesterov");
  const auto init = c["init"].get<std::vector<float>>();
  std::vector<float> p0 = init, p1 = init, g(init.size());
  ParameterSet set;
  set.slots = slots_of(c);
  set.copies = {{.device = Device::cpu(0), .params = p0, .grads = g},
                {.device = Device::cpu(1), .params = p1, .grads = g}};
  int calls = 0;
  set.for_each_copy = [&](const std::function<void(int)>& fn) {  // one thread per copy
    std::thread t([&] { fn(1); });
    fn(0);
    t.join();
    ++calls;
  };
  auto opt = make(c, set);
  for (int s = 0; s < 3; ++s) {
    load(g, c["grads"][s]);
    opt->step();
  }
  CHECK(calls == 3);
  CHECK(p0 == p1);
  // Save after 3 steps, continue on a fresh optimizer from the saved state: the same parameters.
  OptimizerState saved = opt->state();
  REQUIRE(saved.step == 3);
  REQUIRE(saved.tensors.size() == 2);
  CHECK(saved.tensors[0].name == "p0.momentum_buffer");
  std::vector<float> q = p0;
  auto fresh = make(c, ParameterSet::single(q, g, slots_of(c)));
  fresh->load_state(saved);
  for (int s = 3; s < 6; ++s) {
    load(g, c["grads"][s]);
    opt->step();
    fresh->step();
  }
  CHECK(q == p0);
  CHECK(p0 == p1);
  const auto expect = c["params_after_step"][5].get<std::vector<float>>();
  for (std::size_t i = 0; i < q.size(); ++i) CHECK(q[i] == Approx(expect[i]).epsilon(1e-5));

  // A state from another optimizer is refused by name and changes nothing.
  OptimizerState wrong = saved;
  wrong.tensors[1].name = "p1.exp_avg";
  REQUIRE_THROWS_WITH(fresh->load_state(wrong), Catch::Contains("p1.momentum_buffer"));
  wrong = saved;
  wrong.tensors[0].values.pop_back();
  REQUIRE_THROWS_WITH(fresh->load_state(wrong), Catch::Contains("has 11 values"));
  wrong = saved;
  wrong.tensors.push_back({.name = "p9.momentum_buffer", .values = {}});
  REQUIRE_THROWS_WITH(fresh->load_state(wrong), Catch::Contains("unexpected tensor 'p9.momentum_buffer'"));
  CHECK(fresh->step_count() == 6);
}

TEST_CASE("optimizers reject bad options with the value and the fix", "[optim]") {
  std::vector<float> p(4), g(4);
  auto set = [&] { return ParameterSet::single(p, g); };
  REQUIRE_THROWS_WITH((Sgd(set(), {.lr = -0.1})), Catch::Contains("-0.1") && Catch::Contains(">= 0"));
  REQUIRE_THROWS_AS((Sgd(set(), {.lr = 0.1, .momentum = -1})), InvalidArgument);
  REQUIRE_THROWS_WITH((Sgd(set(), {.lr = 0.1, .momentum = 0, .nesterov = true})),
                      Catch::Contains("nesterov") && Catch::Contains("momentum > 0"));
  REQUIRE_THROWS_WITH((Sgd(set(), {.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .nesterov = true})),
                      Catch::Contains("dampening"));
  REQUIRE_THROWS_AS((Sgd(set(), {.lr = 0.1, .weight_decay = -1e-4})), InvalidArgument);
  // The one rule of every backend's fused update, on a CPU copy too (a GPU copy refuses these).
  REQUIRE_THROWS_WITH((Sgd(set(), {.lr = 0.1, .momentum = 0.9, .dampening = 1.5})),
                      Catch::Contains("dampening 1.5") && Catch::Contains("[0, 1]"));
  REQUIRE_THROWS_WITH((Adam(set(), {.beta2 = 0.99999999})), Catch::Contains("beta2 1"));
  REQUIRE_THROWS_WITH((Adam(set(), {.beta1 = 1.0})), Catch::Contains("beta1 1"));
  REQUIRE_THROWS_WITH((AdamW(set(), {.beta2 = -0.5})), Catch::Contains("AdamW beta2"));
  REQUIRE_THROWS_AS((Adam(set(), {.eps = -1})), InvalidArgument);
  std::vector<float> short_g(3);
  REQUIRE_THROWS_WITH(ParameterSet::single(p, short_g), Catch::Contains("same size"));
  ParameterSet gpu;
  gpu.copies = {{.device = Device::gpu(0), .params = p, .grads = g}};
  // A GPU copy needs that GPU (NotFound without it) and a CUDA build (DeviceError without it).
  REQUIRE_THROWS_AS(Sgd(gpu, {.lr = 0.1}), Error);
  REQUIRE_THROWS_WITH(Sgd(gpu, {.lr = 0.1}), Catch::Contains("/gpu:0") || Catch::Contains("CUDA"));
  Sgd ok(set(), {.lr = 0.1});
  REQUIRE_THROWS_AS(ok.set_lr(std::nan("")), InvalidArgument);
}

TEST_CASE("a schedule sets the learning rate of every step", "[optim]") {
  std::vector<float> p = {1.f}, g = {1.f};
  Sgd sgd(ParameterSet::single(p, g), {.lr = 1.0});
  sgd.set_schedule(step_decay_schedule(0.5, {1}, 0.1));
  sgd.step();  // lr 0.5
  CHECK(p[0] == Approx(0.5));
  sgd.step();  // lr 0.05
  CHECK(p[0] == Approx(0.45));
  CHECK(sgd.lr() == Approx(0.05));
}

TEST_CASE("optimizers by name", "[optim]") {
  std::vector<float> p = {1.f, -2.f}, g = {0.5f, 0.25f};
  auto sgd = make_optimizer(ParameterSet::single(p, g), {.name = "nesterov", .lr = 0.1, .momentum = 0.5});
  CHECK(sgd->name() == "SGD (Nesterov)");
  sgd->step();  // first step: buf = g, update = g + 0.5 g
  CHECK(p[0] == Approx(1.f - 0.1f * 0.75f));
  auto adamw = make_optimizer(ParameterSet::single(p, g), {.name = "adamw", .lr = 0.01, .weight_decay = 0.1});
  CHECK(adamw->name() == "AdamW");
  CHECK(adamw->state().tensors.size() == 2);
  REQUIRE_THROWS_WITH(make_optimizer(ParameterSet::single(p, g), {.name = "rmsprop"}),
                      Catch::Contains("'rmsprop'") && Catch::Contains("adamw"));
}

// Adam's eps: PyTorch allows 0, and the rule is one for every device (core/tensor/
// optimizer_update.h, which the GPU kernels apply too), so the CPU and the GPU agree on it.
TEST_CASE("Adam accepts eps = 0 on every device and refuses a negative eps", "[optim]") {
  std::vector<float> p = {1.0f, -2.0f, 0.5f}, g = {0.1f, 0.0f, -0.3f};
  Adam adam(ParameterSet::single(p, g), {.lr = 0.1, .eps = 0.0});
  adam.step();
  // m = 0.1 g, v = 0.001 g^2: p -= lr * sign(g), and 0/0 = NaN where g = 0 (as torch.optim.Adam).
  CHECK(p[0] == Approx(0.9f));
  CHECK(std::isnan(p[1]));
  CHECK(p[2] == Approx(0.6f));
  // The device-side rule is the same function: eps = 0 passes, a negative eps names the value.
  CHECK_NOTHROW(check_adam_update({.eps = 0.0f}));
  CHECK_THROWS_WITH(check_adam_update({.eps = -1e-8f}), Catch::Contains("eps") &&
                                                            Catch::Contains(">= 0"));
  CHECK_THROWS_WITH(check_adam_update({.beta1 = 1.0f}), Catch::Contains("beta1"));
  CHECK_THROWS_WITH(check_sgd_update({.momentum = 0.0f, .nesterov = true}),
                    Catch::Contains("nesterov"));
}

TEST_CASE("one update path: a copy in device memory gets the CPU copy's bits, a backend without "
          "the fused update is refused by name", "[optim]") {
  const auto& c = optim_reference()["optimizers"][3];  // sgd_nesterov
  REQUIRE(c["name"] == "sgd_nesterov");
  const auto init = c["init"].get<std::vector<float>>();
  // A stand-in for a GPU: host memory behind /gpu:0, its state from the device's allocator.
  const Device gpu = Device::gpu(0);
  auto allocator = make_bfc_allocator(make_host_sub_allocator(),
                                      {.device_name = "/gpu:0 (test)", .limit_bytes = 16 << 20});
  set_backend_for_testing(gpu, make_cpu_backend(gpu, *allocator, 1));
  for (const auto& kind : {"sgd_nesterov", "adamw"}) {
    SECTION(kind) {
      const nlohmann::json* ref = nullptr;
      for (const auto& o : optim_reference()["optimizers"])
        if (o["name"] == kind) ref = &o;
      REQUIRE(ref != nullptr);
      std::vector<float> host = (*ref)["init"].get<std::vector<float>>(), dev = host, g(host.size());
      ParameterSet set;
      set.slots = slots_of(*ref);
      set.copies = {{.device = Device::cpu(0), .params = host, .grads = g},
                    {.device = gpu, .params = dev, .grads = g}};
      auto opt = make(*ref, set);
      for (std::size_t s = 0; s < (*ref)["grads"].size(); ++s) {
        load(g, (*ref)["grads"][s]);
        opt->step();
      }
      CHECK(host == dev);
      CHECK(allocator->stats().bytes_in_use > 0);  // the state lives in the device's memory
      const OptimizerState saved = opt->state();
      opt.reset();
      CHECK(allocator->stats().bytes_in_use == 0);
      CHECK(!saved.tensors.empty());
    }
  }
  set_backend_for_testing(gpu, make_cpu_backend(gpu, *allocator, 1, {OpKind::kOptimizerUpdate}));
  std::vector<float> p = init, g(p.size());
  ParameterSet set;
  set.copies = {{.device = gpu, .params = p, .grads = g}};
  REQUIRE_THROWS_WITH(Sgd(set, {.lr = 0.1}),
                      Catch::Contains("/gpu:0") && Catch::Contains("no fused optimizer update"));
  set_backend_for_testing(gpu, nullptr);
}
