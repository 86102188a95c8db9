#include <catch2/catch.hpp>

#include <cmath>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/platform/registry.h"
#include "core/tensor/backend_impl.h"
#include "fixtures.h"
#include "optim/optim.h"

using namespace towerflow;
using namespace towerflow::optim;

namespace {

std::vector<ParameterSlot> slots_of(const nlohmann::json& c) {
  std::vector<ParameterSlot> slots;
  std::size_t off = 0;
  for (const auto& s : c["slots"]) {
    const std::size_t n = s["size"];
    slots.push_back({.name = s["name"], .offset = off, .size = n, .shape = {static_cast<std::int64_t>(n)}});
    off += n;
  }
  return slots;
}

// The fixture's groups as towerflow's: the slots torch.optim never saw in a frozen group first,
// then each torch.optim group with its lr as a scale of the optimizer's (the default group's).
std::vector<ParameterGroup> groups_of(const nlohmann::json& c) {
  std::vector<ParameterGroup> groups;
  if (!c["never_stepped"].empty())
    groups.push_back({.name = "never_stepped",
                      .slots = slots_named(c["never_stepped"].get<std::vector<std::string>>()),
                      .frozen = true});
  for (const auto& g : c["groups"]) {
    ParameterGroup group{.name = g["name"], .slots = slots_named(g["slots"].get<std::vector<std::string>>()),
                         .lr_scale = g["lr_scale"]};
    if (g.contains("weight_decay")) group.weight_decay = g["weight_decay"].get<double>();
    groups.push_back(std::move(group));
  }
  return groups;
}

std::unique_ptr<Optimizer> make(const nlohmann::json& c, ParameterSet set) {
  const auto& o = c["options"];
  const std::string kind = c["kind"];
  if (kind == "sgd")
    return std::make_unique<Sgd>(std::move(set),
                                 SgdOptions{.lr = o["lr"], .momentum = o["momentum"],
                                            .weight_decay = o["weight_decay"], .nesterov = o["nesterov"]},
                                 groups_of(c));
  const AdamOptions a{.lr = o["lr"], .weight_decay = o["weight_decay"]};
  if (kind == "adam") return std::make_unique<Adam>(std::move(set), a, groups_of(c));
  return std::make_unique<AdamW>(std::move(set), a, groups_of(c));
}

const nlohmann::json& group_case(const std::string& name) {
  for (const auto& c : optim_reference()["param_groups"])
    if (c["name"] == name) return c;
  throw std::runtime_error("reference.json has no param_groups case " + name);
}

void load(std::vector<float>& g, const nlohmann::json& values) {
  const auto v = values.get<std::vector<float>>();
  REQUIRE(v.size() == g.size());
  std::copy(v.begin(), v.end(), g.begin());
}

// Freezes and unfreezes the fixture's groups as torch.optim saw them at `step`.
void freeze_for(Optimizer& opt, const nlohmann::json& c, std::size_t step) {
  for (const auto& [group, steps] : c["frozen_steps"].items()) {
    const auto s = steps.get<std::vector<std::size_t>>();
    opt.set_group_frozen(group, std::find(s.begin(), s.end(), step) != s.end());
  }
}

// Norm-wise relative error against the largest parameter, as the optimizers' test.
double error_against(const std::vector<float>& p, const nlohmann::json& expected) {
  const auto e = expected.get<std::vector<float>>();
  double scale = 0, err = 0;
  for (float x : e) scale = std::max(scale, std::abs(double(x)));
  for (std::size_t i = 0; i < p.size(); ++i) err = std::max(err, std::abs(double(p[i]) - e[i]) / scale);
  return err;
}

std::vector<float> slot_values(const std::vector<float>& p, const ParameterSlot& s) {
  return {p.begin() + static_cast<std::ptrdiff_t>(s.offset),
          p.begin() + static_cast<std::ptrdiff_t>(s.offset + s.size)};
}

}  // namespace

TEST_CASE("parameter groups match torch.optim param_groups step by step", "[optim][groups]") {
  for (const auto& c : optim_reference()["param_groups"]) {
    const std::string name = c["name"];
    SECTION(name) {
      std::vector<float> p = c["init"].get<std::vector<float>>(), g(p.size());
      const auto slots = slots_of(c);
      auto opt = make(c, ParameterSet::single(p, g, slots));
      if (!c["schedule"].is_null()) {
        // airbench94's hyper-parameters, computed here as the fixture computed them.
        const double L = 11.5 / (1024 * (1 + 1 / (1 - 0.85)));
        const double W = 0.0153 * 1024 / (1024 * (1 + 1 / (1 - 0.85)));
        REQUIRE(L == c["schedule"]["L"].get<double>());
        REQUIRE(W == c["schedule"]["W"].get<double>());
        REQUIRE(W / L == c["options"]["weight_decay"].get<double>());
        REQUIRE(W / (64 * L) == c["groups"][0]["weight_decay"].get<double>());
        const std::int64_t T = c["schedule"]["total_steps"];
        opt->set_schedule(piecewise_linear_schedule(L, {{0, 0.2}, {step_at_fraction(0.23, T), 1.0}, {T, 0.07}}));
      }
      double max_err = 0;
      std::vector<float> before = p;
      for (std::size_t s = 0; s < c["grads"].size(); ++s) {
        freeze_for(*opt, c, s);
        load(g, c["grads"][s]);
        opt->step();
        // The learning rate of every torch.optim group (the groups, then the default group).
        const auto lrs = c["lrs"][s].get<std::vector<double>>();
        for (std::size_t k = 0; k + 1 < lrs.size(); ++k)
          CHECK(opt->lr() * c["groups"][k]["lr_scale"].get<double>() == Approx(lrs[k]).epsilon(1e-14));
        CHECK(opt->lr() == Approx(lrs.back()).epsilon(1e-14));
        max_err = std::max(max_err, error_against(p, c["params_after_step"][s]));
        // A frozen slot keeps its bits (torch.optim's grad None): never_stepped, and frozen groups.
        for (const ParameterSlot& slot : slots) {
          const std::string_view group = opt->group_of(slot.name);
          bool frozen = false;
          for (const ParameterGroup& gr : opt->groups())
            if (gr.name == group) frozen = gr.frozen;
          if (frozen) CHECK(slot_values(p, slot) == slot_values(before, slot));
        }
        before = p;
      }
      INFO(name << ": max norm-wise relative error " << max_err);
      CHECK(max_err < 5e-7);
      for (const auto& n : c["never_stepped"]) {
        const auto never = n.get<std::string>();  // clang's C++20 finds string == json ambiguous
        const auto& slot = *std::find_if(slots.begin(), slots.end(), [&](const auto& s) { return s.name == never; });
        CHECK(slot_values(p, slot) == slot_values(c["init"].get<std::vector<float>>(), slot));
      }
    }
  }
}

TEST_CASE("a frozen group is not touched, lr_scale 0 keeps the parameters but moves the state",
          "[optim][groups]") {
  std::vector<float> p = {1.f, 2.f, 3.f, 4.f}, g = {0.5f, -0.25f, 1.f, 2.f};
  const std::vector<ParameterSlot> slots = {{.name = "a.weight", .offset = 0, .size = 2},
                                            {.name = "a.bias", .offset = 2, .size = 2}};
  // Dampening makes the first momentum step differ from a zero buffer: d, not (1 - 0.5) * d.
  Sgd sgd(ParameterSet::single(p, g, slots),
          {.lr = 0.1, .momentum = 0.9, .dampening = 0.5, .weight_decay = 0.01},
          {{.name = "bias", .slots = slots_containing("bias"), .frozen = true}});
  CHECK(sgd.group_of("a.bias") == "bias");
  CHECK(sgd.group_of("a.weight") == kDefaultGroup);
  sgd.step();
  sgd.step();
  CHECK(p[2] == 3.f);
  CHECK(p[3] == 4.f);
  CHECK(p[0] != 1.f);
  OptimizerState st = sgd.state();
  CHECK(st.tensors[1].name == "a.bias.momentum_buffer");  // the names a checkpoint keeps, as before
  CHECK(st.tensors[1].values == std::vector<float>{0.f, 0.f});
  CHECK(st.slot_steps == std::map<std::string, std::int64_t>{{"a.bias", 0}});

  // Unfrozen, the bias starts its momentum at its first gradient (torch.optim: buf is None),
  // although the optimizer is at its third step.
  sgd.set_group_frozen("bias", false);
  sgd.step();
  CHECK(sgd.state().tensors[1].values[0] == Approx(1.03));  // d = g + wd * p
  CHECK(p[2] == Approx(3 - 0.1 * 1.03));
  CHECK(sgd.state().slot_steps == std::map<std::string, std::int64_t>{{"a.bias", 1}});

  // lr_scale 0: as torch.optim with lr 0, the parameters keep their bits, the momentum moves.
  sgd.set_group_lr_scale("bias", 0.0);
  const std::vector<float> kept = p;
  const float momentum_before = sgd.state().tensors[1].values[0];
  sgd.step();
  CHECK(p[2] == kept[2]);
  CHECK(p[3] == kept[3]);
  CHECK(sgd.state().tensors[1].values[0] != momentum_before);
}

TEST_CASE("groups split the update into runs: copies stay identical, bits as without groups",
          "[optim][groups]") {
  reset_backends_for_testing();
  reset_devices_for_testing();
  initialise_devices(ProcessOptions{.device_count = {{"CPU", 2}}});
  const auto& c = group_case("sgd_nesterov_freeze_midrun");
  const auto init = c["init"].get<std::vector<float>>();
  std::vector<float> p0 = init, p1 = init, plain = init, g(init.size());
  ParameterSet set;
  set.slots = slots_of(c);
  set.copies = {{.device = Device::cpu(0), .params = p0, .grads = g},
                {.device = Device::cpu(1), .params = p1, .grads = g}};
  set.for_each_copy = [&](const std::function<void(int)>& fn) {
    std::thread t([&] { fn(1); });
    fn(0);
    t.join();
  };
  // Groups that change nothing (a scale of 1, the optimizer's weight decay) on every other slot:
  // three runs per step instead of one, the same bits.
  const SgdOptions o{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3, .nesterov = true};
  Sgd grouped(set, o, {{.name = "norm", .slots = slots_containing("norm.")},
                       {.name = "fc", .slots = slots_named({"fc.weight"}), .weight_decay = 1e-3}});
  Sgd ungrouped(ParameterSet::single(plain, g, slots_of(c)), o);
  for (std::size_t s = 0; s < c["grads"].size(); ++s) {
    load(g, c["grads"][s]);
    grouped.step();
    ungrouped.step();
  }
  CHECK(p0 == p1);
  CHECK(p0 == plain);
}

TEST_CASE("state with groups saves and restores, update counts included", "[optim][groups]") {
  const auto& c = group_case("adamw_unfreeze");  // norm frozen at steps 0-1, fc at step 2
  std::vector<float> p = c["init"].get<std::vector<float>>(), g(p.size());
  auto opt = make(c, ParameterSet::single(p, g, slots_of(c)));
  for (std::size_t s = 0; s < 3; ++s) {
    freeze_for(*opt, c, s);
    load(g, c["grads"][s]);
    opt->step();
  }
  const OptimizerState saved = opt->state();
  CHECK(saved.step == 3);
  CHECK(saved.slot_steps ==
        std::map<std::string, std::int64_t>{{"norm.weight", 1}, {"norm.bias", 1}, {"fc.weight", 2}});
  // The tensors are those of an optimizer without groups: a checkpoint cannot tell them apart.
  std::vector<float> q = c["init"].get<std::vector<float>>();
  AdamW plain(ParameterSet::single(q, g, slots_of(c)), {.lr = 0.01});
  REQUIRE(plain.state().tensors.size() == saved.tensors.size());
  for (std::size_t i = 0; i < saved.tensors.size(); ++i) CHECK(plain.state().tensors[i].name == saved.tensors[i].name);

  q = p;
  auto fresh = make(c, ParameterSet::single(q, g, slots_of(c)));
  fresh->load_state(saved);
  for (std::size_t s = 3; s < c["grads"].size(); ++s) {
    freeze_for(*opt, c, s);
    freeze_for(*fresh, c, s);
    load(g, c["grads"][s]);
    opt->step();
    fresh->step();
  }
  CHECK(q == p);
  CHECK(error_against(q, c["params_after_step"].back()) < 5e-7);

  // A state without counts (a checkpoint that keeps the step and the tensors) loads, every slot
  // at the step; counts for a slot that does not exist, or more updates than steps, are refused.
  OptimizerState bare = saved;
  bare.slot_steps.clear();
  CHECK_NOTHROW(fresh->load_state(bare));
  CHECK(fresh->state().slot_steps.empty());
  OptimizerState wrong = saved;
  wrong.slot_steps["head.bias"] = 1;
  CHECK_THROWS_WITH(fresh->load_state(wrong), Catch::Contains("'head.bias'") && Catch::Contains("not a parameter slot"));
  wrong = saved;
  wrong.slot_steps["fc.weight"] = 4;
  CHECK_THROWS_WITH(fresh->load_state(wrong), Catch::Contains("received 4 updates in 3 steps"));
}

TEST_CASE("parameter groups reject bad groups by name, with the fix", "[optim][groups]") {
  std::vector<float> p(10), g(10);
  const std::vector<ParameterSlot> slots = {{.name = "conv.weight", .offset = 0, .size = 4},
                                            {.name = "norm.weight", .offset = 4, .size = 2},
                                            {.name = "norm.bias", .offset = 6, .size = 2},
                                            {.name = "fc.weight", .offset = 8, .size = 2}};
  auto set = [&] { return ParameterSet::single(p, g, slots); };
  auto sgd = [&](std::vector<ParameterGroup> groups) { return Sgd(set(), {.lr = 0.1}, std::move(groups)); };
  const auto norm = slots_containing("norm");
  CHECK_THROWS_WITH(sgd({{.slots = norm}}), Catch::Contains("empty name"));
  CHECK_THROWS_WITH(sgd({{.name = "default", .slots = norm}}), Catch::Contains("'default' is reserved"));
  CHECK_THROWS_WITH(sgd({{.name = "n", .slots = norm}, {.name = "n", .slots = slots_containing("fc")}}),
                    Catch::Contains("'n' is used twice"));
  CHECK_THROWS_WITH(sgd({{.name = "n"}}), Catch::Contains("'n' has no slot predicate"));
  CHECK_THROWS_WITH(sgd({{.name = "n", .slots = norm, .lr_scale = -1}}),
                    Catch::Contains("group 'n': lr_scale -1") && Catch::Contains(".frozen = true"));
  CHECK_THROWS_WITH(sgd({{.name = "n", .slots = norm, .lr_scale = INFINITY}}), Catch::Contains("lr_scale inf"));
  CHECK_THROWS_WITH(sgd({{.name = "n", .slots = norm, .weight_decay = std::nan("")}}),
                    Catch::Contains("group 'n': weight_decay nan"));
  CHECK_THROWS_WITH(sgd({{.name = "n", .slots = norm, .weight_decay = -5e-4}}), Catch::Contains("weight_decay -0.0005"));
  // A predicate that misses is a mistake: the message lists the slots.
  CHECK_THROWS_WITH(sgd({{.name = "nrom", .slots = slots_containing("nrom")}}),
                    Catch::Contains("'nrom' takes no slot") && Catch::Contains("conv.weight, norm.weight"));
  CHECK_THROWS_WITH(sgd({{.name = "norm", .slots = norm}, {.name = "bias", .slots = slots_named({"norm.bias"})}}),
                    Catch::Contains("'bias' takes no slot") && Catch::Contains("norm.bias to 'norm'"));

  Sgd ok = sgd({{.name = "norm", .slots = norm, .lr_scale = 64}});
  // A refused set_groups changes nothing.
  CHECK_THROWS_AS(ok.set_groups({{.name = "x", .slots = slots_containing("x")}}), InvalidArgument);
  CHECK(ok.groups().size() == 1);
  CHECK(ok.group_of("norm.bias") == "norm");
  CHECK_THROWS_WITH(ok.set_group_frozen("fc", true), Catch::Contains("no parameter group 'fc'") &&
                                                         Catch::Contains("'norm'"));
  CHECK_THROWS_WITH(ok.set_group_lr_scale("norm", std::nan("")), Catch::Contains("group 'norm': lr_scale nan"));
  CHECK(ok.groups()[0].lr_scale == 64);
  CHECK_THROWS_WITH(ok.group_of("head.bias"), Catch::Contains("'head.bias' is not a parameter slot"));
  ok.set_groups({});
  CHECK(ok.group_of("norm.bias") == kDefaultGroup);

  const std::vector<ParameterSlot> overlapping = {{.name = "a", .offset = 0, .size = 6},
                                                  {.name = "b", .offset = 4, .size = 6}};
  CHECK_THROWS_WITH(Sgd(ParameterSet::single(p, g, overlapping), {.lr = 0.1}),
                    Catch::Contains("'a' [0, 6) and 'b' [4, 10) overlap"));
}
