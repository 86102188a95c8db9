// The measured kernel choice (core/kernel_choice.h, core/cpu/kernel_choice.h): the mechanism on
// candidates of known speed (busy loops), its cache file, and every real candidate this build and
// CPU run, each against towerflow's fixed kernels, on every ResNet-20 and tfcnn shape and odd ones.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/cpu/bf16.h"
#include "core/cpu/conv.h"
#include "core/cpu/gemm.h"
#include "core/cpu/isa.h"
#include "core/cpu/kernel_choice.h"
#include "core/cpu/onednn_impl.h"
#include "core/error.h"
#include "core/kernel_choice.h"
#include "core/log.h"
#include "kernel_test_util.h"

using namespace towerflow;
using namespace towerflow::cpu;
using towerflow::cpu::testing::compare;
using towerflow::cpu::testing::random_vector;

namespace {

// The instruction sets whose kernels the tests make candidates beside the active set's: every
// other one this CPU runs, the baseline's SSE pairs included, so that a CPU without AVX-512 runs
// the candidates of another set too (the rule itself offers AVX2's beside AVX-512's only).
std::vector<Isa> other_isas_here() {
  std::vector<Isa> out;
  for (const Isa i : supported_isas())
    if (i != active_isa()) out.push_back(i);
  return out;
}

// Puts the choice in a known state for one test and restores the fixed default after it.
struct ChoiceScope {
  std::filesystem::path cache;
  explicit ChoiceScope(KernelChoice mode, std::string cache_name = "") {
    reset_kernel_choices_for_testing();
    force_kernel_candidate_for_testing(std::nullopt);
    isa_candidates_for_testing(other_isas_here());
    if (!cache_name.empty()) {
      cache = std::filesystem::temp_directory_path() /
              ("towerflow-test-" + std::to_string(::getpid()) + "-" + cache_name + ".json");
      std::filesystem::remove(cache);
    }
    set_kernel_choice_cache(cache.string());
    set_kernel_choice(mode);
  }
  ~ChoiceScope() {
    set_kernel_choice(KernelChoice::kFixed);
    force_kernel_candidate_for_testing(std::nullopt);
    isa_candidates_for_testing(std::nullopt);
    reset_kernel_choices_for_testing();
    set_kernel_choice_cache("");
    if (!cache.empty()) std::filesystem::remove(cache);
  }
};

void spin_for(double ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double, std::milli>(ms);
  while (std::chrono::steady_clock::now() < until) {
  }
}

// Candidates that take known times; counts the runs of each and remembers the last.
struct Fake {
  std::map<std::string, double> ms;
  std::map<std::string, bool> declines;
  std::map<std::string, int> runs;
  std::string last;
  bool run(const std::string& name) {
    if (declines[name]) return false;
    ++runs[name];
    last = name;
    spin_for(ms.at(name));
    return true;
  }
};

ChoiceProblem problem(const std::string& key) {
  return {.key = key, .pass = "forward", .problem = key, .bf16 = false, .threads = 1};
}

void run(Fake& f, const std::string& key, const std::vector<std::string>& candidates,
         std::string_view layer = "layer") {
  run_chosen(problem(key), layer, candidates, [&](const std::string& n) { return f.run(n); });
}

}  // namespace

TEST_CASE("kernel choice: fixed runs the first candidate only and records nothing", "[kernel_choice]") {
  const ChoiceScope scope(KernelChoice::kFixed);
  Fake f{.ms = {{"towerflow", 0.5}, {"onednn", 0.1}}};
  for (int i = 0; i < 3; ++i) run(f, "p", {"towerflow", "onednn"});
  CHECK(f.runs["towerflow"] == 3);
  CHECK(f.runs["onednn"] == 0);
  CHECK(kernel_choices().empty());
}

TEST_CASE("kernel choice: auto measures each candidate once, keeps the fastest, ends on it", "[kernel_choice]") {
  const ChoiceScope scope(KernelChoice::kAuto);
  Fake f{.ms = {{"towerflow", 6.0}, {"onednn", 0.3}, {"other", 3.0}}};
  run(f, "p", {"towerflow", "onednn", "other"}, "conv1");
  CHECK(f.last == "onednn");  // the call's output is the winner's
  const int measured = f.runs["towerflow"];
  CHECK(measured >= 2);  // one untimed run, then at least one timed
  for (int i = 0; i < 4; ++i) run(f, "p", {"towerflow", "onednn", "other"}, "conv1");
  CHECK(f.runs["towerflow"] == measured);  // no more measuring
  CHECK(f.last == "onednn");
  const auto records = kernel_choices();
  REQUIRE(records.size() == 1);
  CHECK(records[0].chosen == "onednn");
  CHECK(records[0].layer == "conv1");
  CHECK_FALSE(records[0].from_cache);
  REQUIRE(records[0].ms.size() == 3);
  for (const auto& [name, ms] : records[0].ms) {
    INFO(name);
    CHECK(ms >= f.ms[name]);
    CHECK(ms < f.ms[name] + 200.0);  // the candidate's own time (a loaded machine adds to it)
  }
  const std::string line = format_kernel_choice(records[0]);
  INFO(line);
  CHECK(line.find("conv1  forward  p  fp32 x1 thread: onednn") == 0);
  CHECK(line.find("towerflow") != std::string::npos);
  // Another problem is measured on its own.
  run(f, "q", {"towerflow", "onednn"});
  CHECK(kernel_choices().size() == 2);
}

TEST_CASE("kernel choice: the fixed candidate stays unless another beats it by the margin", "[kernel_choice]") {
  // The rule on exact times (a timed test would depend on the machine's load).
  CHECK(choose_fastest({{"towerflow", 4.0}, {"onednn", 4.0 * 0.98}}, "towerflow") == "towerflow");
  CHECK(choose_fastest({{"towerflow", 4.0}, {"onednn", 4.0 * 0.94}}, "towerflow") == "onednn");
  CHECK(choose_fastest({{"towerflow", 4.0}, {"onednn", 4.5}}, "towerflow") == "towerflow");
  CHECK(choose_fastest({{"emulated", 4.0}, {"onednn", 3.0}, {"amx", 1.0}}, "emulated") == "amx");
  // Where the fixed one declined (not timed), the fastest of the others.
  CHECK(choose_fastest({{"onednn", 3.0}, {"amx", 2.9}}, "emulated") == "amx");
}

TEST_CASE("kernel choice: a candidate that declines is not timed or chosen", "[kernel_choice]") {
  const ChoiceScope scope(KernelChoice::kAuto);
  Fake f{.ms = {{"towerflow", 1.0}, {"onednn", 0.1}}, .declines = {{"onednn", true}}};
  run(f, "p", {"towerflow", "onednn"});
  const auto r = kernel_choices().at(0);
  CHECK(r.chosen == "towerflow");
  REQUIRE(r.ms.size() == 1);
  CHECK(r.ms[0].first == "towerflow");
}

TEST_CASE("kernel choice: a second process reads the choice from the cache without measuring", "[kernel_choice]") {
  const ChoiceScope scope(KernelChoice::kAuto, "cache");
  Fake f{.ms = {{"towerflow", 2.0}, {"onednn", 0.2}}};
  run(f, "p", {"towerflow", "onednn"});
  REQUIRE(std::filesystem::exists(scope.cache));
  {
    std::ifstream in(scope.cache);
    const auto j = nlohmann::json::parse(in);
    CHECK(j.at("format") == "towerflow kernel choices 1");
    REQUIRE(j.at("choices").size() == 1);
    const auto& entry = j.at("choices").begin().value();
    CHECK(entry.at("chosen") == "onednn");
    CHECK(j.at("choices").begin().key().find("fp32 1 threads p") != std::string::npos);
  }
  // As a new process: nothing chosen yet, the same cache file.
  reset_kernel_choices_for_testing();
  Fake g{.ms = {{"towerflow", 2.0}, {"onednn", 0.2}}};
  run(g, "p", {"towerflow", "onednn"});
  CHECK(g.runs["towerflow"] == 0);
  CHECK(g.runs["onednn"] == 1);
  const auto r = kernel_choices().at(0);
  CHECK(r.from_cache);
  CHECK(r.chosen == "onednn");
  CHECK(format_kernel_choice(r).find("onednn (cached)") != std::string::npos);
  // A cached choice that is no longer a candidate is measured again.
  reset_kernel_choices_for_testing();
  Fake h{.ms = {{"towerflow", 0.2}, {"amx", 2.0}}};
  run(h, "p", {"towerflow", "amx"});
  CHECK(h.runs["amx"] >= 2);
  CHECK(kernel_choices().at(0).chosen == "towerflow");
}

TEST_CASE("kernel choice: a damaged cache file is reported, measured around and rewritten", "[kernel_choice]") {
  const ChoiceScope scope(KernelChoice::kAuto, "damaged");
  std::ofstream(scope.cache) << "{\"format\": \"towerflow kernel choices 1\", \"choices\": [tru";
  std::vector<std::string> warnings;
  const LogSink previous = set_log_sink([&](LogLevel level, std::string_view m) {
    if (level == LogLevel::Warning) warnings.emplace_back(m);
  });
  Fake f{.ms = {{"towerflow", 1.5}, {"onednn", 0.1}}};
  run(f, "p", {"towerflow", "onednn"});
  set_log_sink(previous);
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find(scope.cache.string()) != std::string::npos);
  CHECK(warnings[0].find("measured again") != std::string::npos);
  CHECK(warnings[0].find("TOWERFLOW_KERNEL_CACHE") != std::string::npos);
  CHECK(kernel_choices().at(0).chosen == "onednn");
  std::ifstream in(scope.cache);
  CHECK(nlohmann::json::parse(in).at("choices").size() == 1);  // rewritten whole
}

TEST_CASE("kernel choice: a cache that cannot be written is reported once and the run goes on", "[kernel_choice]") {
  const ChoiceScope scope(KernelChoice::kAuto);
  // A folder where the file should be: a path under a regular file cannot be made.
  const auto blocker = std::filesystem::temp_directory_path() / ("towerflow-test-blocker-" + std::to_string(::getpid()));
  std::ofstream(blocker) << "x";
  const std::string path = (blocker / "kernel-choices.json").string();
  set_kernel_choice_cache(path);
  std::vector<std::string> warnings;
  const LogSink previous = set_log_sink([&](LogLevel level, std::string_view m) {
    if (level == LogLevel::Warning) warnings.emplace_back(m);
  });
  Fake f{.ms = {{"towerflow", 1.5}, {"onednn", 0.1}}};
  run(f, "p", {"towerflow", "onednn"});
  run(f, "q", {"towerflow", "onednn"});
  set_log_sink(previous);
  std::filesystem::remove(blocker);
  CHECK(kernel_choices().size() == 2);  // both chosen, for this process
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find(path) != std::string::npos);
  CHECK(warnings[0].find("cannot be written") != std::string::npos);
  CHECK(warnings[0].find("for this process only") != std::string::npos);
}

TEST_CASE("kernel choice: a mode that is not one is refused with the choices", "[kernel_choice]") {
  CHECK(parse_kernel_choice("auto") == KernelChoice::kAuto);
  CHECK(parse_kernel_choice("fixed") == KernelChoice::kFixed);
  CHECK_THROWS_MATCHES(parse_kernel_choice("fastest", "--kernel_choice"), InvalidArgument,
                       Catch::Matchers::Message(
                           "--kernel_choice 'fastest' is not a choice; use auto (the fastest kernel "
                           "of each problem, measured at its first call) or fixed (towerflow's own rule)"));
}

namespace {

// The fp32 candidates under a ChoiceScope: the active set's kernels, oneDNN's, and those of the
// other sets (other_isas_here).
std::vector<std::string> fp32_candidates() {
  std::vector<std::string> c{"towerflow", "winograd"};
  if (onednn::built()) c.emplace_back("onednn");
  for (const Isa i : other_isas_here()) {
    c.emplace_back(std::string("towerflow-") + isa_name(i));
    c.emplace_back(std::string("winograd-") + isa_name(i));
  }
  return c;
}

// ResNet-20's and tfcnn's convolutions at a small batch, and odd ones: batches that the two slices
// of a 2-thread context cut unevenly, 1x1 strided (oneDNN declines some), unequal strides.
const std::vector<Conv2dShape> kChoiceShapes = {
    {.n = 3, .h = 32, .w = 32, .c_in = 3, .c_out = 16, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1},
    {.n = 2, .h = 32, .w = 32, .c_in = 16, .c_out = 16, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1},
    {.n = 3, .h = 32, .w = 32, .c_in = 16, .c_out = 32, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1},
    {.n = 2, .h = 32, .w = 32, .c_in = 16, .c_out = 32, .kh = 1, .kw = 1, .stride_h = 2, .stride_w = 2},
    {.n = 2, .h = 16, .w = 16, .c_in = 32, .c_out = 32, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1},
    {.n = 3, .h = 16, .w = 16, .c_in = 32, .c_out = 64, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1},
    {.n = 2, .h = 8, .w = 8, .c_in = 64, .c_out = 64, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1},
    {.n = 3, .h = 32, .w = 32, .c_in = 3, .c_out = 64, .kh = 5, .kw = 5, .pad_h = 2, .pad_w = 2},
    {.n = 2, .h = 16, .w = 16, .c_in = 64, .c_out = 64, .kh = 5, .kw = 5, .pad_h = 2, .pad_w = 2},
    {.n = 1, .h = 10, .w = 11, .c_in = 20, .c_out = 6, .kh = 5, .kw = 4, .stride_h = 3, .stride_w = 2, .pad_h = 2, .pad_w = 1},
    {.n = 5, .h = 7, .w = 9, .c_in = 5, .c_out = 7, .kh = 3, .kw = 3},
};

}  // namespace

TEST_CASE("kernel choice: every fp32 candidate agrees with towerflow's kernels on every shape",
          "[kernel_choice]") {
  for (const std::string& candidate : fp32_candidates()) {
    for (const int threads : {1, 2}) {
      const ChoiceScope scope(KernelChoice::kAuto);
      force_kernel_candidate_for_testing(candidate);
      const CpuContext ctx(threads);
      std::uint32_t seed = 10;
      for (const Conv2dShape& s : kChoiceShapes) {
        INFO(candidate << " on " << threads << " threads: " << s.to_string());
        const std::size_t xn = std::size_t(s.n) * s.h * s.w * s.c_in,
                          wn = std::size_t(s.c_out) * s.c_in * s.kh * s.kw,
                          yn = std::size_t(s.n) * s.out_h() * s.out_w() * s.c_out;
        const auto x = random_vector(xn, seed), w = random_vector(wn, seed + 1),
                   dy = random_vector(yn, seed + 2), bias = random_vector(std::size_t(s.c_out), seed + 3);
        seed += 4;
        // Outputs start as NaN: the chosen kernel must overwrite all of each.
        std::vector<float> y(yn, NAN), dx(xn, NAN), dw(wn, NAN), ry(yn), rdx(xn), rdw(wn);
        conv2d_forward_chosen(ctx, s, x.data(), w.data(), bias.data(), y.data(), false, "t");
        conv2d_backward_input_chosen(ctx, s, dy.data(), w.data(), dx.data(), false, "t");
        conv2d_backward_weight_chosen(ctx, s, x.data(), dy.data(), dw.data(), false, "t");
        conv2d_forward_bias(ctx, s, x.data(), w.data(), bias.data(), ry.data());
        conv2d_backward_input(ctx, s, dy.data(), w.data(), rdx.data());
        conv2d_backward_weight(ctx, s, x.data(), dy.data(), rdw.data());
        const auto ey = compare(y, ry), edx = compare(dx, rdx), edw = compare(dw, rdw);
        INFO("y " << ey.describe() << "; dx " << edx.describe() << "; dw " << edw.describe());
        CHECK(ey.max_error < 1e-5);
        CHECK(edx.max_error < 1e-5);
        CHECK(edw.max_error < 1e-5);
        // Where the chosen kernel adds its backward input in place (towerflow's direct and
        // Winograd kernels), it adds the values it gives, rounded once; oneDNN's leaves dx alone.
        const auto base = random_vector(xn, seed + 100);
        std::vector<float> sum = base;
        if (conv2d_backward_input_add_chosen(ctx, s, dy.data(), w.data(), sum.data(), "t")) {
          std::vector<float> want(xn);
          for (std::size_t i = 0; i < xn; ++i) want[i] = base[i] + dx[i];
          CHECK(sum == want);
        } else {
          CHECK(candidate == "onednn");
          CHECK(sum == base);
        }
        // The same call again gives the same bits.
        std::vector<float> dw2(wn);
        conv2d_backward_weight_chosen(ctx, s, x.data(), dy.data(), dw2.data(), false, "t");
        CHECK(dw2 == dw);
      }
      // Matrix products: tfcnn's and ResNet-20's fully connected layers (forward, both
      // gradients), with rows the slices cut unevenly and leading dimensions wider than the rows.
      struct Mm {
        bool ta, tb;
        int m, n, k, lda, ldb, ldc;
      };
      for (const Mm& g : {Mm{false, true, 37, 24, 96, 96, 96, 24}, Mm{false, false, 37, 96, 24, 24, 96, 96},
                          Mm{true, false, 24, 96, 37, 24, 96, 96}, Mm{false, true, 5, 10, 64, 70, 64, 12},
                          Mm{true, true, 19, 7, 11, 23, 13, 9}}) {
        INFO(candidate << " on " << threads << " threads: matmul " << g.m << "x" << g.n << "x" << g.k
                       << " ta " << g.ta << " tb " << g.tb);
        const auto a = random_vector(std::size_t(g.ta ? g.k : g.m) * g.lda, seed),
                   b = random_vector(std::size_t(g.tb ? g.n : g.k) * g.ldb, seed + 1);
        seed += 2;
        std::vector<float> c(std::size_t(g.m) * g.ldc, NAN), rc(std::size_t(g.m) * g.ldc, NAN);
        gemm_chosen(ctx, g.ta, g.tb, g.m, g.n, g.k, a.data(), g.lda, b.data(), g.ldb, c.data(), g.ldc, false, "t");
        gemm(ctx, g.ta, g.tb, g.m, g.n, g.k, 1.0f, a.data(), g.lda, b.data(), g.ldb, 0.0f, rc.data(), g.ldc);
        std::vector<float> got, want;
        for (int i = 0; i < g.m; ++i)
          for (int j = 0; j < g.n; ++j) {
            got.push_back(c[std::size_t(i) * g.ldc + j]);
            want.push_back(rc[std::size_t(i) * g.ldc + j]);
          }
        const auto e = compare(got, want);
        INFO(e.describe());
        CHECK(e.max_error < 1e-5);
      }
      CHECK(kernel_choices().empty());  // forced: nothing measured
    }
  }
}

TEST_CASE("kernel choice: the candidates are the kernels this CPU runs, the fixed rule's first",
          "[kernel_choice]") {
  const ChoiceScope scope(KernelChoice::kAuto);
  CHECK(kernel_choice_candidates() == fp32_candidates());
  // The rule (Note [Other instruction sets as candidates]): AVX2's kernels beside AVX-512's,
  // nothing beside AVX2's (the baseline's SSE pairs never compete), so on each CPU as many
  // candidates as it has instruction sets worth timing.
  isa_candidates_for_testing(std::nullopt);
  const auto supported = supported_isas();
  const auto has = [&](Isa i) { return std::find(supported.begin(), supported.end(), i) != supported.end(); };
  const auto listed = [](const std::string& name) {
    const auto c = kernel_choice_candidates();
    return std::find(c.begin(), c.end(), name) != c.end();
  };
  for (const Isa active : {Isa::Avx2, Isa::Avx512}) {
    if (!has(active)) continue;
    force_isa_for_testing(active);
    INFO("kernels of " << isa_name(active));
    CHECK(kernel_choice_candidates().front() == "towerflow");
    // AVX2's kernels where this build has them (-DTOWERFLOW_CPU_ISAS may leave them out).
    CHECK(listed("towerflow-avx2") == (active == Isa::Avx512 && has(Isa::Avx2)));
    CHECK(listed("winograd-avx2") == (active == Isa::Avx512 && has(Isa::Avx2)));
    CHECK_FALSE(listed("towerflow-baseline"));
    CHECK_FALSE(listed(std::string("towerflow-") + isa_name(active)));
  }
  force_isa_for_testing(std::nullopt);
  CHECK_THROWS_AS(isa_candidates_for_testing(std::vector<Isa>{static_cast<Isa>(99)}), InvalidArgument);
}

TEST_CASE("kernel choice: auto on real kernels chooses per problem and matches the fixed results",
          "[kernel_choice]") {
  const ChoiceScope scope(KernelChoice::kAuto);
  const CpuContext ctx(2);
  const Conv2dShape s{.n = 4, .h = 16, .w = 16, .c_in = 16, .c_out = 32, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1};
  const std::size_t xn = std::size_t(s.n) * s.h * s.w * s.c_in, wn = std::size_t(s.c_out) * s.c_in * 9,
                    yn = std::size_t(s.n) * s.h * s.w * s.c_out;
  const auto x = random_vector(xn, 1), w = random_vector(wn, 2), dy = random_vector(yn, 3);
  std::vector<float> y(yn), ry(yn), dw(wn), rdw(wn);
  conv2d_forward_chosen(ctx, s, x.data(), w.data(), nullptr, y.data(), false, "block.conv");
  conv2d_backward_weight_chosen(ctx, s, x.data(), dy.data(), dw.data(), false, "");
  conv2d_forward(ctx, s, x.data(), w.data(), ry.data());
  conv2d_backward_weight(ctx, s, x.data(), dy.data(), rdw.data());
  CHECK(compare(y, ry).max_error < 1e-5);
  CHECK(compare(dw, rdw).max_error < 1e-5);
  const auto records = kernel_choices();
  const std::size_t expected = fp32_candidates().size() > 1 ? 2 : 0;
  REQUIRE(records.size() == expected);
  for (const auto& r : records) {
    INFO(format_kernel_choice(r));
    CHECK(r.layer == "block.conv");  // the backward pass is named after its forward
    CHECK(r.ms.size() == fp32_candidates().size());
    CHECK(r.problem == "4x16x16x16 -> 32, 3x3, stride 1, pad 1");
  }
  // Later calls give the chosen kernel's bits.
  std::vector<float> y2(yn);
  conv2d_forward_chosen(ctx, s, x.data(), w.data(), nullptr, y2.data(), false, "block.conv");
  CHECK(y2 == y);
}

// bf16.h's bf16 inputs: a forward and a weight gradient whose x is stored as bf16 are problems of
// their own ("..., bf16 input"), and every bf16 candidate reads such an x with the bits it gives
// for the fp32 x it was rounded from. Where only one bf16 candidate runs (the emulated path,
// on CPUs without AVX512-BF16 or AMX), there is nothing to choose among and the test says so.
TEST_CASE("kernel choice: a bf16 input is a problem of its own, read with the fp32 input's bits",
          "[kernel_choice][bf16]") {
  const std::vector<std::string> names = kernel_choice_candidates(true);
  if (names.size() < 2) {
    WARN("the bf16 input's choice is not tested here: one bf16 candidate (" << names.front()
                                                                            << ") runs on this CPU");
    return;
  }
  const Conv2dShape s{.n = 4, .h = 16, .w = 16, .c_in = 16, .c_out = 16, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1};
  const std::size_t xn = std::size_t(s.n) * s.h * s.w * s.c_in, wn = std::size_t(s.c_out) * s.c_in * 9,
                    yn = std::size_t(s.n) * s.h * s.w * s.c_out;
  auto x = random_vector(xn, 4);
  std::vector<std::uint16_t> xb(xn);
  for (std::size_t i = 0; i < xn; ++i) {
    x[i] = round_to_bf16(x[i]);
    xb[i] = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(x[i]) >> 16);
  }
  const auto w = random_vector(wn, 5), dy = random_vector(yn, 6);
  const CpuContext ctx(2);
  for (const std::string& name : names) {
    INFO("candidate " << name);
    const ChoiceScope scope(KernelChoice::kAuto);
    force_kernel_candidate_for_testing(name);
    std::vector<float> y(yn, NAN), yb(yn, NAN), dw(wn, NAN), dwb(wn, NAN);
    conv2d_forward_chosen(ctx, s, x.data(), w.data(), nullptr, y.data(), true, "t");
    conv2d_forward_bf16_input_chosen(ctx, s, xb.data(), w.data(), nullptr, yb.data(), "t");
    conv2d_backward_weight_chosen(ctx, s, x.data(), dy.data(), dw.data(), true, "t");
    conv2d_backward_weight_bf16_input_chosen(ctx, s, xb.data(), dy.data(), dwb.data(), "t");
    CHECK(yb == y);
    CHECK(dwb == dw);
  }
  const ChoiceScope scope(KernelChoice::kAuto);
  std::vector<float> y(yn), dw(wn);
  conv2d_forward_bf16_input_chosen(ctx, s, xb.data(), w.data(), nullptr, y.data(), "block.conv2");
  conv2d_backward_weight_bf16_input_chosen(ctx, s, xb.data(), dy.data(), dw.data(), "");
  const auto records = kernel_choices();
  REQUIRE(records.size() == 2);
  for (const auto& r : records) {
    INFO(format_kernel_choice(r));
    CHECK(r.layer == "block.conv2");
    CHECK(r.problem == "4x16x16x16 -> 16, 3x3, stride 1, pad 1, bf16 input");
    CHECK(r.ms.size() == names.size());
  }
}

// Runs that add to their output: run_chosen restores it before each run while it measures, so
// that the call adds once, and calls nothing once the choice is made.
TEST_CASE("kernel choice: runs that add to their output start from it each time they are measured",
          "[kernel_choice]") {
  const ChoiceScope scope(KernelChoice::kAuto);
  const std::map<std::string, double> adds = {{"towerflow", 1.0}, {"onednn", 10.0}, {"other", 100.0}};
  Fake f{.ms = {{"towerflow", 3.0}, {"onednn", 0.3}, {"other", 6.0}}};
  double out = 5.0, saved = 0.0;
  int restores = 0;
  const auto call = [&] {
    run_chosen(
        problem("adds"), "layer", {"towerflow", "onednn", "other"},
        [&](const std::string& n) {
          if (!f.run(n)) return false;
          out += adds.at(n);
          return true;
        },
        [&] {
          if (restores++ == 0) saved = out;
          else out = saved;
        });
  };
  call();
  CHECK(out == 15.0);  // 5 plus the winner's 10, once
  CHECK(restores >= 7);  // before each of 3 untimed runs, 3 or more timed ones and the last
  const int before = restores;
  call();
  CHECK(out == 25.0);
  CHECK(restores == before);
}

namespace {
// The one record a measured added backward input leaves (named "block.conv1" by its call).
KernelChoiceRecord added_record() {
  const auto records = kernel_choices();
  REQUIRE(records.size() == 1);
  const KernelChoiceRecord& r = records[0];
  INFO(format_kernel_choice(r));
  CHECK(r.pass == "backward input, added");
  CHECK(r.layer == "block.conv1");
  return r;
}
}  // namespace

// The fp32 backward input added to the gradient another consumer gave (a ResNet block's input):
// a problem of its own, measured with the add each candidate needs (towerflow's direct and
// Winograd kernels add as they store, oneDNN's stores and an add pass follows), so that a
// candidate that is faster alone but needs the extra pass is not chosen for it. The measuring
// call adds the winner's dx once; later calls add on it again, or leave oneDNN's add to the caller.
TEST_CASE("kernel choice: the fp32 backward input added to a gradient is measured with its add",
          "[kernel_choice]") {
  const CpuContext ctx(2);
  for (const Conv2dShape& s : {Conv2dShape{.n = 4, .h = 16, .w = 16, .c_in = 16, .c_out = 16, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1},
                               Conv2dShape{.n = 2, .h = 16, .w = 16, .c_in = 16, .c_out = 32, .kh = 1, .kw = 1, .stride_h = 2, .stride_w = 2}}) {
    INFO(s.to_string());
    const std::size_t xn = std::size_t(s.n) * s.h * s.w * s.c_in, wn = std::size_t(s.c_out) * s.c_in * s.kh * s.kw,
                      yn = std::size_t(s.n) * s.out_h() * s.out_w() * s.c_out;
    const auto w = random_vector(wn, 17), dy = random_vector(yn, 18), base = random_vector(xn, 19);
    std::map<std::string, std::vector<float>> want;  // base + each candidate's dx
    for (const std::string& name : fp32_candidates()) {
      const ChoiceScope scope(KernelChoice::kAuto);
      force_kernel_candidate_for_testing(name);
      std::vector<float> dx(xn, NAN);
      conv2d_backward_input_chosen(ctx, s, dy.data(), w.data(), dx.data(), false, "t");
      auto& wanted = want[name];
      wanted.resize(xn);
      for (std::size_t i = 0; i < xn; ++i) wanted[i] = base[i] + dx[i];
    }
    const ChoiceScope scope(KernelChoice::kAuto);
    std::vector<float> sum = base;
    REQUIRE(conv2d_backward_input_add_chosen(ctx, s, dy.data(), w.data(), sum.data(), "block.conv1"));
    const KernelChoiceRecord r = added_record();
    INFO(format_kernel_choice(r));
    CHECK(r.problem == s.describe());
    // Every candidate was timed with its add on the 3x3; on the 1x1, Winograd declines (and
    // oneDNN may), and towerflow's direct kernels run.
    if (s.kh == 3) CHECK(r.ms.size() == fp32_candidates().size());
    CHECK(std::any_of(r.ms.begin(), r.ms.end(), [](const auto& m) { return m.first == "towerflow"; }));
    for (const auto& [name, ms] : r.ms) CHECK((s.kh == 3 || name.rfind("winograd", 0) != 0));
    CHECK(sum == want.at(r.chosen));  // added once, whatever ran before it while measuring
    // Settled: the same call adds again on the same kernels, or leaves oneDNN's add to the caller.
    std::vector<float> again = base;
    const bool adds = r.chosen != "onednn";
    CHECK(conv2d_backward_input_add_chosen(ctx, s, dy.data(), w.data(), again.data(), "block.conv1") == adds);
    CHECK(again == (adds ? want.at(r.chosen) : base));
    CHECK(kernel_choices().size() == 1);  // nothing measured again
  }
}

// The bf16 backward input added to the gradient another consumer gave (a ResNet block's input):
// a problem of its own, whose candidates add as they store or (oneDNN) add apart. Each adds
// the dx its plain problem gives on the same candidate, once; a call settled on kernels that
// store leaves the gradient to the caller, and so does fixed mode on such kernels.
TEST_CASE("kernel choice: the bf16 backward input added to a gradient adds each candidate's dx once",
          "[kernel_choice][bf16]") {
  const std::vector<std::string> names = kernel_choice_candidates(true);
  // Whether candidate `name` adds as it stores (Winograd, pairs, the emulation) or stores.
  const auto adds = [](const std::string& name) {
    if (name.rfind("winograd-", 0) == 0) return true;
    for (const Bf16Kernels k : {Bf16Kernels::Emulated, Bf16Kernels::OneDnn, Bf16Kernels::Avx512Bf16,
                                Bf16Kernels::Avx512Bf16Emulated, Bf16Kernels::Amx, Bf16Kernels::AmxEmulated})
      if (name == bf16_kernels_name(k)) return bf16_backward_input_adds(k);
    FAIL("no bf16 kernels named " << name);
    return false;
  };
  const CpuContext ctx(2);
  for (const Conv2dShape& s : {Conv2dShape{.n = 4, .h = 16, .w = 16, .c_in = 16, .c_out = 16, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1},
                               Conv2dShape{.n = 3, .h = 8, .w = 8, .c_in = 32, .c_out = 32, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1},
                               Conv2dShape{.n = 2, .h = 16, .w = 16, .c_in = 16, .c_out = 32, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1},
                               Conv2dShape{.n = 2, .h = 16, .w = 16, .c_in = 16, .c_out = 32, .kh = 1, .kw = 1, .stride_h = 2, .stride_w = 2}}) {
    const std::size_t xn = std::size_t(s.n) * s.h * s.w * s.c_in, wn = std::size_t(s.c_out) * s.c_in * s.kh * s.kw,
                      yn = std::size_t(s.n) * s.out_h() * s.out_w() * s.c_out;
    const auto w = random_vector(wn, 7), dy = random_vector(yn, 8), base = random_vector(xn, 9);
    std::map<std::string, std::vector<float>> want;  // base + each candidate's dx
    for (const std::string& name : names) {
      INFO("candidate " << name << ": " << s.to_string());
      const ChoiceScope scope(KernelChoice::kAuto);
      force_kernel_candidate_for_testing(name);
      std::vector<float> dx(xn, NAN), sum = base;
      conv2d_backward_input_chosen(ctx, s, dy.data(), w.data(), dx.data(), true, "t");
      auto& wanted = want[name];
      wanted.resize(xn);
      for (std::size_t i = 0; i < xn; ++i) wanted[i] = base[i] + dx[i];
      if (!adds(name)) {
        CHECK_FALSE(conv2d_backward_input_bf16_add_chosen(ctx, s, dy.data(), w.data(), sum.data(), "t"));
        CHECK(sum == base);
      } else if (conv2d_backward_input_bf16_add_chosen(ctx, s, dy.data(), w.data(), sum.data(), "t")) {
        CHECK(sum == wanted);
      } else {
        FAIL_CHECK("a forced candidate that adds as it stores left the add to the caller");
      }
    }
    if (names.size() < 2) {
      WARN("the added backward input's measured choice is not tested here: one bf16 candidate ("
           << names.front() << ") runs on this CPU");
    } else {  // Measured: the call adds the chosen candidate's dx once, and says which in the record.
      const ChoiceScope scope(KernelChoice::kAuto);
      std::vector<float> sum = base;
      REQUIRE(conv2d_backward_input_bf16_add_chosen(ctx, s, dy.data(), w.data(), sum.data(), "block.conv1"));
      const KernelChoiceRecord r = added_record();
      INFO(format_kernel_choice(r));
      CHECK(sum == want.at(r.chosen));
      // Settled: a second call adds again on the same kernels, or leaves oneDNN's add to the caller.
      std::vector<float> again = base;
      CHECK(conv2d_backward_input_bf16_add_chosen(ctx, s, dy.data(), w.data(), again.data(), "block.conv1") ==
            adds(r.chosen));
      CHECK(again == (adds(r.chosen) ? want.at(r.chosen) : base));
    }
    {  // Fixed: the fixed kernels' add, where they have one.
      const ChoiceScope scope(KernelChoice::kFixed);
      const std::string fixed = names.front();
      std::vector<float> sum = base;
      CHECK(conv2d_backward_input_bf16_add_chosen(ctx, s, dy.data(), w.data(), sum.data(), "t") == adds(fixed));
      CHECK(sum == (adds(fixed) ? want.at(fixed) : base));
    }
  }
}
