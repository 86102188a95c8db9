// train::Lookahead: the weight average against the same averaging done by hand in double, its
// final copy, and a resumed run that goes on exactly as the uninterrupted one (the average is in
// the checkpoint's hook_state.safetensors).

#include <catch2/catch.hpp>

#include <cmath>

#include "models/airbench.h"
#include "train/fit_fixtures.h"

namespace tw = towerflow;
using namespace towerflow::train;
using namespace towerflow::train::testing;

namespace {

// airbench94 with narrow groups: parameters, frozen buffers and batch-norm statistics.
tw::nn::ModelFactory narrow_airbench() {
  return [](const tw::Device& d) {
    tw::nn::InitRng rng(3);
    auto m = std::make_shared<tw::models::Airbench94>(d, tw::models::Airbench94Options{.widths = {8, 16, 16}}, rng);
    m->flatten();
    return m;
  };
}

std::vector<std::vector<float>> state_of(tw::nn::Module& m) {
  std::vector<std::vector<float>> out;
  for (const auto& [name, t] : m.named_parameters()) out.push_back(t.to_host());
  for (const auto& [name, t] : m.named_buffers()) out.push_back(t.to_host());
  return out;
}

FitOptions no_dir() {
  FitOptions o = tiny({});
  o.train_dir.clear();
  return o;
}

}  // namespace

TEST_CASE("Lookahead averages parameters and batch-norm statistics as the same average kept by hand "
          "in double, and ends on the average",
          "[train][lookahead]") {
  fresh_devices();
  const auto decay = [](std::int64_t step, std::int64_t total) { return 0.2 + 0.6 * double(step) / double(total); };
  std::vector<std::vector<float>> with_hook, by_hand, without;
  {
    Setup s(narrow_airbench(), 0.05);
    Lookahead lookahead({.every = 3, .decay = decay});
    fit(s.trainer, s.sgd, s.train, nullptr, no_dir(), {&lookahead});
    with_hook = state_of(s.trainer.model());
    CHECK(state_of(s.trainer.replica(1)) == with_hook);  // every replica was given the average
  }
  {
    Setup s(narrow_airbench(), 0.05);
    std::vector<std::vector<double>> avg;
    auto put = [&](bool mix, double d) {
      tw::nn::Module& m = s.trainer.model();
      std::size_t k = 0;
      for (auto named : {m.named_parameters(), m.named_buffers()})
        for (auto& [name, t] : named) {
          const auto now = t.to_host();
          std::vector<float> out(now.size());
          for (std::size_t i = 0; i < now.size(); ++i) {
            if (mix) avg[k][i] = d * avg[k][i] + (1 - d) * now[i];
            out[i] = static_cast<float>(avg[k][i]);
          }
          t.copy_from_host(std::span<const float>(out));
          ++k;
        }
      s.trainer.broadcast_from_replica0();
    };
    LambdaHook hand;
    hand.start = [&](const StartInfo&) {
      for (const auto& v : state_of(s.trainer.model())) avg.emplace_back(v.begin(), v.end());
    };
    hand.step = [&](const StepInfo& i) {
      if (i.step % 3 == 0) put(true, decay(i.step, 8));
      if (i.step == 8) put(false, 1.0);
    };
    fit(s.trainer, s.sgd, s.train, nullptr, no_dir(), {&hand});
    by_hand = state_of(s.trainer.model());
  }
  {
    Setup s(narrow_airbench(), 0.05);
    fit(s.trainer, s.sgd, s.train, nullptr, no_dir());
    without = state_of(s.trainer.model());
  }
  REQUIRE(with_hook.size() == by_hand.size());
  double worst = 0, moved = 0;
  for (std::size_t k = 0; k < with_hook.size(); ++k)
    for (std::size_t i = 0; i < with_hook[k].size(); ++i) {
      worst = std::max(worst, double(std::abs(with_hook[k][i] - by_hand[k][i])));
      moved = std::max(moved, double(std::abs(with_hook[k][i] - without[k][i])));
    }
  INFO("largest difference from the hand-kept average " << worst << ", from the run without it " << moved);
  CHECK(worst <= 1e-5);
  CHECK(moved > 1e-3);  // the average changed the run: the comparison means something
}

TEST_CASE("a run with Lookahead resumed from a checkpoint ends bit for bit as the uninterrupted run, and "
          "a checkpoint without the average is refused",
          "[train][lookahead][resume]") {
  fresh_devices();
  TempDir full_dir, crash_dir;
  struct Crash {};
  {
    Setup s(narrow_airbench(), 0.05);
    Lookahead lookahead;
    fit(s.trainer, s.sgd, s.train, nullptr, tiny(full_dir.path), {&lookahead});
  }
  {
    Setup s(narrow_airbench(), 0.05);
    Lookahead lookahead;
    LambdaHook crash;
    crash.step = [](const StepInfo& i) {
      if (i.step == 5) throw Crash{};
    };
    CHECK_THROWS_AS(fit(s.trainer, s.sgd, s.train, nullptr, tiny(crash_dir.path), {&lookahead, &crash}), Crash);
  }
  const auto hook_state = tensors_of(crash_dir.path / "ckpt-0000000003" / kHookStateFile);
  CHECK(hook_state.count("lookahead.2.conv1.weight") == 1);
  CHECK(hook_state.count("lookahead.2.norm1.running_mean") == 1);
  {
    Setup s(narrow_airbench(), 0.05);
    FitOptions o = tiny(crash_dir.path);
    o.resume = true;
    Lookahead lookahead;
    fit(s.trainer, s.sgd, s.train, nullptr, o, {&lookahead});
  }
  for (const char* file : {kModelFile, kStateFile, kHookStateFile})
    CHECK(tensors_of(full_dir.path / "ckpt-0000000008" / file) == tensors_of(crash_dir.path / "ckpt-0000000008" / file));

  // A run without Lookahead wrote this one; resuming it with Lookahead cannot go on alike.
  TempDir plain_dir;
  {
    Setup s(narrow_airbench(), 0.05);
    FitOptions o = tiny(plain_dir.path);
    o.max_steps = 3;
    fit(s.trainer, s.sgd, s.train, nullptr, o);
  }
  Setup s(narrow_airbench(), 0.05);
  FitOptions o = tiny(plain_dir.path);
  o.resume = true;
  Lookahead lookahead;
  CHECK_THROWS_WITH(fit(s.trainer, s.sgd, s.train, nullptr, o, {&lookahead}),
                    Catch::Contains("0 of the") && Catch::Contains("Lookahead averages") &&
                        Catch::Contains("ckpt-0000000003"));
}

TEST_CASE("Lookahead refuses a period below one step, no decay, and a decay outside [0, 1]", "[train][lookahead]") {
  CHECK_THROWS_WITH(Lookahead({.every = 0}), Catch::Contains("every 0"));
  CHECK_THROWS_WITH(Lookahead({.decay = {}}), Catch::Contains("decay"));
  fresh_devices();
  Setup s(narrow_airbench(), 0.05);
  Lookahead bad({.every = 1, .decay = [](std::int64_t, std::int64_t) { return 1.5; }});
  CHECK_THROWS_WITH(fit(s.trainer, s.sgd, s.train, nullptr, no_dir(), {&bad}), Catch::Contains("decay 1.5"));
  CHECK(airbench_lookahead_decay(476, 476) == Approx(std::pow(0.95, 5)));
  CHECK(airbench_lookahead_decay(238, 476) == Approx(std::pow(0.95, 5) / 8));
}
