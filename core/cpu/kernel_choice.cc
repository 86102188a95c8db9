#include "core/cpu/kernel_choice.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <unordered_map>

#include "core/cpu/bf16.h"
#include "core/cpu/conv.h"
#include "core/cpu/elementwise.h"
#include "core/cpu/gemm.h"
#include "core/cpu/isa.h"
#include "core/cpu/kernel_table.h"
#include "core/cpu/onednn_impl.h"
#include "core/error.h"
#include "core/kernel_choice.h"
#include "core/log.h"
#include "core/version.h"

// Note [Measured kernel choice]
// A problem (pass, shape, operand type, thread count) is measured once per process, at its first
// call: every candidate runs once untimed (oneDNN builds its primitive, scratch buffers grow), then
// the candidates run in turn, kTimedRuns rounds or fewer past kTimeBudgetS (in turn, so that a
// machine whose speed drifts favours none); a candidate's time is its fastest run. The
// winner runs once more if it was not the last to run, so the call's output is the winner's, as
// every later call's is. The fixed choice (candidates[0]) keeps the problem unless another
// candidate beats it by kChoiceMargin. A problem whose runs add to their output (the backward
// input added to dx) restores that output before each of them, untimed (run_chosen's
// before_each), so that the call adds once.
//
// One mutex covers the table of choices and every measurement, so towers that meet a new problem
// at once measure one at a time (each on its own threads) and a tower waits for a measurement in
// progress rather than making a second one; no measurement waits on anything else. After its
// first call each thread finds a problem's choice in its own table, without the lock.

namespace towerflow {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kTimedRuns = 3;
constexpr double kTimeBudgetS = 0.25;
constexpr const char* kCacheFormat = "towerflow kernel choices 1";

struct State {
  std::mutex mu;
  std::atomic<int> mode{-1};  // a KernelChoice, -1 until first read
  std::optional<std::string> cache_path;
  bool cache_read = false;
  bool write_failure_reported = false;  // once per cache path
  nlohmann::json cache = nlohmann::json::object();  // key -> {"chosen", "ms"}
  std::unordered_map<std::string, std::string> chosen;  // full key -> candidate
  std::vector<KernelChoiceRecord> records;
  std::unordered_map<std::string, std::string> layer_of_shape;  // forward's scope, for backward
  std::optional<std::string> forced;  // force_kernel_candidate_for_testing
  std::atomic<std::uint64_t> generation{1};  // bumped by reset, so threads drop their tables
};

State& state() {
  static State s;
  return s;
}

KernelChoice mode_locked(State& s) {
  if (s.mode.load() < 0) {
    const char* env = std::getenv("TOWERFLOW_KERNEL_CHOICE");
    s.mode = static_cast<int>(env && *env ? parse_kernel_choice(env, "TOWERFLOW_KERNEL_CHOICE")
                                          : KernelChoice::kFixed);
  }
  return static_cast<KernelChoice>(s.mode.load());
}

std::string default_cache_path() {
  if (const char* env = std::getenv("TOWERFLOW_KERNEL_CACHE")) {
    const std::string v(env);
    return v == "none" ? "" : v;
  }
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    return std::string(xdg) + "/towerflow/kernel-choices.json";
  if (const char* home = std::getenv("HOME"); home && *home)
    return std::string(home) + "/.cache/towerflow/kernel-choices.json";
  return "";
}

const std::string& cache_path_locked(State& s) {
  if (!s.cache_path) s.cache_path = default_cache_path();
  return *s.cache_path;
}

// The CPU part of every cache key: what makes a measurement of one machine mean nothing on
// another (the model, the kernels' instruction set, oneDNN's version and instruction set, the
// build).
std::string cpu_key() {
  static const std::string key = [] {
    std::string model = "unknown CPU";
    std::string family, number;
    std::ifstream in("/proc/cpuinfo");
    for (std::string line; std::getline(in, line);) {
      const auto colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string name = line.substr(0, colon);
      while (!name.empty() && (name.back() == ' ' || name.back() == '\t')) name.pop_back();
      const std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
      if (name == "model name") model = value;
      else if (name == "cpu family") family = value;
      else if (name == "model") number = value;
      if (name == "processor" && value != "0") break;  // the first CPU's lines are enough
    }
    std::string k = model;
    if (!family.empty()) k += " (family " + family + " model " + number + ")";
    k += "; kernels " + std::string(cpu::isa_name(cpu::active_isa()));
    if (cpu::onednn::built()) k += "; oneDNN " + cpu::onednn::version() + " " + cpu::onednn::isa();
    k += "; " + version_string();
    return k;
  }();
  return key;
}

// Reads the cache file once (the lock held). A missing file is an empty cache; an unreadable or
// malformed one is reported and ignored (it is rewritten by the next measurement).
void read_cache_locked(State& s) {
  if (s.cache_read) return;
  s.cache_read = true;
  const std::string& path = cache_path_locked(s);
  if (path.empty() || !std::filesystem::exists(path)) return;
  try {
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open it");
    const nlohmann::json j = nlohmann::json::parse(in);
    if (!j.is_object() || j.value("format", "") != kCacheFormat || !j.contains("choices") ||
        !j["choices"].is_object())
      throw std::runtime_error(std::string("it is not a kernel-choice cache of format '") +
                               kCacheFormat + "'");
    s.cache = j["choices"];
  } catch (const std::exception& e) {
    log_warning(str("kernel choice cache ", path, " is not usable (", e.what(),
                    "): every choice is measured again and the file rewritten; set "
                    "TOWERFLOW_KERNEL_CACHE to use another file"));
    s.cache = nlohmann::json::object();
  }
}

// Rewrites the cache file with everything known (the lock held): a temporary file renamed over
// it, so a reader never sees half a file. A failure is reported once; the run goes on.
void write_cache_locked(State& s) {
  const std::string& path = cache_path_locked(s);
  if (path.empty()) return;
  try {
    const std::filesystem::path p(path);
    if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
    const std::string tmp = path + ".tmp." + std::to_string(::getpid());
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << nlohmann::json{{"format", kCacheFormat}, {"choices", s.cache}}.dump(1) << "\n";
      if (!out.flush()) throw std::runtime_error("cannot write " + tmp);
    }
    std::filesystem::rename(tmp, p);
  } catch (const std::exception& e) {
    if (!s.write_failure_reported)
      log_warning(str("kernel choice cache ", path, " cannot be written (", e.what(),
                      "): choices are kept for this process only"));
    s.write_failure_reported = true;
  }
}

// The tables each thread keeps of choices it has looked up.
struct ThreadTable {
  std::uint64_t generation = 0;
  std::unordered_map<std::string, std::string> chosen;
};

}  // namespace

const char* kernel_choice_name(KernelChoice c) { return c == KernelChoice::kAuto ? "auto" : "fixed"; }

KernelChoice parse_kernel_choice(std::string_view text, std::string_view what) {
  if (text == "auto") return KernelChoice::kAuto;
  if (text == "fixed") return KernelChoice::kFixed;
  raise<InvalidArgument>(what, " '", text, "' is not a choice; use auto (the fastest kernel of each "
                         "problem, measured at its first call) or fixed (towerflow's own rule)");
}

void set_kernel_choice(KernelChoice c) { state().mode = static_cast<int>(c); }

KernelChoice kernel_choice() {
  State& s = state();
  if (const int m = s.mode.load(); m >= 0) return static_cast<KernelChoice>(m);
  std::lock_guard lock(s.mu);
  return mode_locked(s);
}

std::string kernel_choice_cache() {
  State& s = state();
  std::lock_guard lock(s.mu);
  return cache_path_locked(s);
}

void set_kernel_choice_cache(std::string path) {
  State& s = state();
  std::lock_guard lock(s.mu);
  s.cache_path = path == "none" ? "" : std::move(path);
  s.cache_read = false;
  s.write_failure_reported = false;
  s.cache = nlohmann::json::object();
}

std::vector<KernelChoiceRecord> kernel_choices() {
  State& s = state();
  std::lock_guard lock(s.mu);
  return s.records;
}

std::string format_kernel_choice(const KernelChoiceRecord& r) {
  std::ostringstream o;
  o << (r.layer.empty() ? "(no scope)" : r.layer) << "  " << r.pass << "  " << r.problem << "  "
    << r.operands << " x" << r.threads << (r.threads == 1 ? " thread: " : " threads: ") << r.chosen;
  if (r.from_cache) {
    o << " (cached)";
    return o.str();
  }
  o.setf(std::ios::fixed);
  o.precision(2);
  std::string others;
  for (const auto& [name, ms] : r.ms) {
    if (name == r.chosen) {
      o << " " << ms << " ms";
    } else {
      std::ostringstream t;
      t.setf(std::ios::fixed);
      t.precision(2);
      t << (others.empty() ? "" : ", ") << name << " " << ms;
      others += t.str();
    }
  }
  if (!others.empty()) o << " (" << others << ")";
  return o.str();
}

void reset_kernel_choices_for_testing() {
  State& s = state();
  std::lock_guard lock(s.mu);
  s.chosen.clear();
  s.records.clear();
  s.layer_of_shape.clear();
  s.cache = nlohmann::json::object();
  s.cache_read = false;
  ++s.generation;
}

namespace cpu {

std::string choose_fastest(const std::vector<std::pair<std::string, double>>& times,
                           const std::string& fixed) {
  std::string best;
  double best_time = std::numeric_limits<double>::infinity();
  double fixed_time = best_time;
  for (const auto& [name, t] : times) {
    if (name == fixed) fixed_time = t;
    if (t < best_time) {
      best_time = t;
      best = name;
    }
  }
  if (best != fixed && fixed_time < std::numeric_limits<double>::infinity() &&
      best_time > fixed_time * (1.0 - kChoiceMargin))
    return fixed;
  return best;
}

namespace {
// A problem's key within this CPU and build: operands, threads and the problem.
std::string local_key_of(const ChoiceProblem& p) {
  return str(p.bf16 ? "bf16" : "fp32", " ", p.threads, " threads ", p.key);
}
}  // namespace

std::optional<std::string> settled_choice(const ChoiceProblem& p,
                                          const std::vector<std::string>& candidates) {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (mode_locked(s) == KernelChoice::kFixed || candidates.size() < 2) return candidates.front();
  if (s.forced) {
    const bool listed = std::find(candidates.begin(), candidates.end(), *s.forced) != candidates.end();
    return listed ? *s.forced : candidates.front();
  }
  if (const auto it = s.chosen.find(cpu_key() + " | " + local_key_of(p)); it != s.chosen.end())
    return it->second;
  return std::nullopt;
}

void run_chosen(const ChoiceProblem& p, std::string_view layer,
                const std::vector<std::string>& candidates,
                const std::function<bool(const std::string&)>& run,
                const std::function<void()>& before_each) {
  State& s = state();
  const std::string operands = p.bf16 ? "bf16" : "fp32";
  const std::string local_key = local_key_of(p);
  // Fast path: this thread has seen the problem.
  thread_local ThreadTable table;
  if (const std::uint64_t g = s.generation.load(); table.generation != g) {
    table.chosen.clear();
    table.generation = g;
  } else if (const auto it = table.chosen.find(local_key); it != table.chosen.end()) {
    if (!run(it->second)) run(candidates.front());
    return;
  }
  std::unique_lock lock(s.mu);
  if (mode_locked(s) == KernelChoice::kFixed || candidates.size() < 2) {
    lock.unlock();
    run(candidates.front());
    return;
  }
  if (s.forced) {
    const bool listed = std::find(candidates.begin(), candidates.end(), *s.forced) != candidates.end();
    const std::string name = listed ? *s.forced : candidates.front();
    lock.unlock();
    if (!run(name)) run(candidates.front());
    return;
  }
  const std::string full_key = cpu_key() + " | " + local_key;
  if (const auto it = s.chosen.find(full_key); it != s.chosen.end()) {
    const std::string choice = it->second;
    lock.unlock();
    table.chosen.emplace(local_key, choice);
    if (!run(choice)) run(candidates.front());
    return;
  }
  KernelChoiceRecord record{.layer = std::string(layer), .pass = p.pass, .problem = p.problem,
                            .operands = operands, .threads = p.threads};
  if (record.layer.empty()) {
    if (const auto it = s.layer_of_shape.find(p.problem); it != s.layer_of_shape.end())
      record.layer = it->second;
  } else {
    s.layer_of_shape.emplace(p.problem, record.layer);
  }
  read_cache_locked(s);
  std::string choice;
  if (const auto it = s.cache.find(full_key); it != s.cache.end() && it->is_object()) {
    const std::string cached = it->value("chosen", "");
    if (std::find(candidates.begin(), candidates.end(), cached) != candidates.end() &&
        run(cached)) {
      choice = cached;
      record.from_cache = true;
    }
  }
  if (choice.empty()) {
    // Note [Measured kernel choice].
    const auto prepare = [&] {
      if (before_each) before_each();
    };
    std::vector<std::string> runnable;
    for (const std::string& c : candidates) {
      prepare();
      if (run(c)) runnable.push_back(c);  // the untimed run; a candidate that declines is out
    }
    std::vector<double> fastest(runnable.size(), std::numeric_limits<double>::infinity());
    const Clock::time_point begin = Clock::now();
    for (int r = 0; r < kTimedRuns; ++r) {
      for (std::size_t i = 0; i < runnable.size(); ++i) {
        prepare();
        const Clock::time_point t0 = Clock::now();
        run(runnable[i]);
        fastest[i] = std::min(fastest[i], std::chrono::duration<double>(Clock::now() - t0).count());
      }
      if (std::chrono::duration<double>(Clock::now() - begin).count() > kTimeBudgetS) break;
    }
    for (std::size_t i = 0; i < runnable.size(); ++i) record.ms.emplace_back(runnable[i], fastest[i] * 1e3);
    const std::string last = runnable.empty() ? "" : runnable.back();
    if (runnable.empty())
      raise<InternalError>("kernel choice: every candidate declined ", p.pass, " ", p.problem);
    choice = choose_fastest(record.ms, candidates.front());
    if (choice != last || before_each) {
      prepare();
      run(choice);
    }
    nlohmann::json ms = nlohmann::json::object();
    for (const auto& [name, t] : record.ms) ms[name] = t;
    s.cache[full_key] = {{"chosen", choice}, {"ms", ms}, {"layer", record.layer}};
    write_cache_locked(s);
  }
  record.chosen = choice;
  s.chosen.emplace(full_key, choice);
  s.records.push_back(std::move(record));
  lock.unlock();
  table.chosen.emplace(local_key, choice);
}

void force_kernel_candidate_for_testing(std::optional<std::string> name) {
  State& s = state();
  std::lock_guard lock(s.mu);
  s.forced = std::move(name);
  ++s.generation;
}

namespace {

// Note [Other instruction sets as candidates]
// towerflow's kernels are built for each instruction set (isa.h), and the fixed rule runs the
// best one the CPU has. Where that is AVX-512, the same direct and Winograd kernels built for
// AVX2 are fp32 candidates too ("towerflow-avx2", "winograd-avx2"): 16-lane vectors are not
// faster on every CPU and layer (a block of 16 output channels is bound by its broadcasts; AMD's
// Zen 4 runs a 512-bit FMA as two 256-bit halves; Intel's cores clock lower while they run
// 512-bit FMAs), so which width is faster is measured, layer by layer. The baseline build's SSE
// pairs never compete with AVX2 and are no candidate. The candidates agree within the tests'
// fp32 tolerance, as every other pair of candidates does.

std::optional<std::vector<Isa>> g_isa_candidates_for_testing;
std::atomic<int> g_isa_generation{0};  // bumped by isa_candidates_for_testing

// The instruction sets whose kernels are candidates beside the active one's.
std::vector<Isa> other_isas() {
  if (g_isa_candidates_for_testing) return *g_isa_candidates_for_testing;
  std::vector<Isa> out;
  const Isa active = active_isa();
  for (const Isa i : supported_isas())
    if (i < active && i != Isa::Baseline && i != Isa::Generic) out.push_back(i);
  return out;
}

// "towerflow-avx2" -> the AVX2 table; a name with no instruction set -> the active table.
const KernelTable& table_of_candidate(const std::string& name) {
  const std::size_t dash = name.find('-');
  if (dash == std::string::npos) return kernels();
  const std::string isa = name.substr(dash + 1);
  for (const Isa i : built_isas())
    if (isa == isa_name(i)) return kernels_of(i);
  raise<InternalError>("kernel choice: no instruction set named '", isa, "' in candidate '", name, "'");
}

// "towerflow", "winograd" or "onednn": the kernels of a candidate, whatever their instructions.
std::string_view family_of(const std::string& name) {
  return std::string_view(name).substr(0, name.find('-'));
}

std::vector<std::string> candidate_names(bool bf16) {
  std::vector<std::string> out;
  if (bf16) {
    out.emplace_back(bf16_kernels_name(active_bf16_kernels()));
    if (bf16_kernels_fixed()) return out;
    for (const Bf16Kernels k : runnable_bf16_kernels()) {
      if (out.front() != bf16_kernels_name(k)) out.emplace_back(bf16_kernels_name(k));
      // 3x3 stride-1 convolutions only (Note [bf16 Winograd convolution] in bf16_pairs.cc).
      if (k == Bf16Kernels::Avx512Bf16) out.emplace_back(str("winograd-", bf16_kernels_name(k)));
    }
    return out;
  }
  out.emplace_back("towerflow");
  out.emplace_back("winograd");  // 3x3 stride-1 convolutions only
  if (onednn::built()) out.emplace_back("onednn");
  for (const Isa i : other_isas()) {  // Note [Other instruction sets as candidates]
    out.emplace_back(str("towerflow-", isa_name(i)));
    out.emplace_back(str("winograd-", isa_name(i)));
  }
  return out;
}

const std::vector<std::string>& candidates(bool bf16) {
  // The lists follow the active kernels, which a test may change: the fp32 list is made again
  // when its table changes or a test names other instruction sets (generation), the bf16 list
  // at every call.
  thread_local std::vector<std::string> fp32;
  thread_local const KernelTable* fp32_table = nullptr;
  thread_local int fp32_generation = -1;
  if (!bf16) {
    if (fp32_table != &kernels() || fp32_generation != g_isa_generation.load()) {
      fp32_table = &kernels();
      fp32_generation = g_isa_generation.load();
      fp32 = candidate_names(false);
    }
    return fp32;
  }
  thread_local std::vector<std::string> b;
  b = candidate_names(true);
  return b;
}

Bf16Kernels bf16_by_name(const std::string& name) {
  for (const Bf16Kernels k : built_bf16_kernels())
    if (name == bf16_kernels_name(k)) return k;
  raise<InternalError>("kernel choice: no bf16 kernels named '", name, "'");
}

// The fixed choice of a bf16 problem must not decline: oneDNN's reference problems run emulated.
// A Winograd candidate ("winograd-avx512bf16") declines: the convolutions run it through
// bf16_conv, and matrix products have none.
bool bf16_or_emulated(const std::string& name, bool is_fixed, const std::function<bool(Bf16Kernels)>& f) {
  if (family_of(name) == "winograd") return false;
  if (f(bf16_by_name(name))) return true;
  return is_fixed ? f(Bf16Kernels::Emulated) : false;
}

// A bf16 convolution pass on candidate `name`: winograd(k) on the Winograd kernels of the
// candidate's family k (false where they decline), else direct(k) as bf16_or_emulated runs it.
template <typename Winograd, typename Direct>
bool bf16_conv(const std::string& name, bool is_fixed, Winograd&& winograd, Direct&& direct) {
  if (family_of(name) == "winograd") return winograd(bf16_by_name(name.substr(name.find('-') + 1)));
  return bf16_or_emulated(name, is_fixed, direct);
}

// The bf16 weight gradient on candidate `name`. x: floats or bf16 bits.
template <typename In>
bool bf16_weight_grad(const std::string& name, bool is_fixed, const CpuContext& ctx,
                      const Conv2dShape& s, const In* x, const float* dy, float* dw) {
  return bf16_conv(
      name, is_fixed,
      [&](Bf16Kernels k) { return conv2d_backward_weight_bf16_winograd_with(k, ctx, s, x, dy, dw); },
      [&](Bf16Kernels k) {
        if constexpr (std::is_same_v<In, float>) return conv2d_backward_weight_bf16_with(k, ctx, s, x, dy, dw);
        else return conv2d_backward_weight_bf16_input_with(k, ctx, s, x, dy, dw);
      });
}

// The bf16 forward on candidate `name`. x and y: floats or bf16 bits.
template <typename In, typename Out>
bool bf16_forward(const std::string& name, bool is_fixed, const CpuContext& ctx, const Conv2dShape& s,
                  const In* x, const float* w, const float* bias_or_null, Out* y) {
  return bf16_conv(
      name, is_fixed,
      [&](Bf16Kernels k) { return conv2d_forward_bf16_winograd_with(k, ctx, s, x, w, bias_or_null, y); },
      [&](Bf16Kernels k) {
        if constexpr (std::is_same_v<Out, std::uint16_t>)
          return conv2d_forward_bf16_output_with(k, ctx, s, x, w, bias_or_null, y);
        else if constexpr (std::is_same_v<In, float>)
          return conv2d_forward_bf16_with(k, ctx, s, x, w, bias_or_null, y);
        else return conv2d_forward_bf16_input_with(k, ctx, s, x, w, bias_or_null, y);
      });
}

}  // namespace

}  // namespace cpu

std::vector<std::string> kernel_choice_candidates(bool bf16) { return cpu::candidate_names(bf16); }

void cpu::isa_candidates_for_testing(std::optional<std::vector<Isa>> isas) {
  for (const Isa i : isas.value_or(std::vector<Isa>{})) (void)kernels_of(i);  // built and supported
  g_isa_candidates_for_testing = std::move(isas);
  ++g_isa_generation;
}

namespace cpu {

void conv2d_forward_chosen(const CpuContext& ctx, const Conv2dShape& s, const float* x,
                           const float* w, const float* bias_or_null, float* y, bool bf16,
                           std::string_view layer) {
  const std::vector<std::string>& c = candidates(bf16);
  if (kernel_choice() == KernelChoice::kFixed || c.size() < 2) {
    if (bf16) return conv2d_forward_bf16(ctx, s, x, w, bias_or_null, y);
    return conv2d_forward_bias(ctx, s, x, w, bias_or_null, y);
  }
  const std::string problem = s.describe();
  const ChoiceProblem p{.key = "conv forward " + problem + (bias_or_null ? " +bias" : ""),
                        .pass = "forward", .problem = problem, .bf16 = bf16,
                        .threads = ctx.threads()};
  run_chosen(p, layer, c, [&](const std::string& name) {
    if (bf16) return bf16_forward(name, name == c.front(), ctx, s, x, w, bias_or_null, y);
    if (name == "onednn") return onednn::conv2d_forward(ctx, s, x, w, bias_or_null, y, onednn::Operands::kFp32);
    const KernelTable& k = table_of_candidate(name);
    if (family_of(name) == "winograd") return k.conv2d_forward_winograd(ctx, s, x, w, bias_or_null, y);
    k.conv2d_forward_bias(ctx, s, x, w, bias_or_null, y);
    return true;
  });
}

namespace {
// The backward input's problem, for its choice and for whether that choice is settled.
ChoiceProblem backward_input_problem(const Conv2dShape& s, bool bf16, int threads) {
  const std::string problem = s.describe();
  return {.key = "conv backward input " + problem, .pass = "backward input", .problem = problem,
          .bf16 = bf16, .threads = threads};
}
}  // namespace

void conv2d_backward_input_chosen(const CpuContext& ctx, const Conv2dShape& s, const float* dy,
                                  const float* w, float* dx, bool bf16, std::string_view layer) {
  const std::vector<std::string>& c = candidates(bf16);
  if (kernel_choice() == KernelChoice::kFixed || c.size() < 2) {
    if (bf16) return conv2d_backward_input_bf16(ctx, s, dy, w, dx);
    return conv2d_backward_input(ctx, s, dy, w, dx);
  }
  const ChoiceProblem p = backward_input_problem(s, bf16, ctx.threads());
  run_chosen(p, layer, c, [&](const std::string& name) {
    if (bf16)
      return bf16_conv(
          name, name == c.front(),
          [&](Bf16Kernels k) { return conv2d_backward_input_bf16_winograd_with(k, ctx, s, dy, w, dx); },
          [&](Bf16Kernels k) { return conv2d_backward_input_bf16_with(k, ctx, s, dy, w, dx); });
    if (name == "onednn") return onednn::conv2d_backward_input(ctx, s, dy, w, dx, onednn::Operands::kFp32);
    const KernelTable& k = table_of_candidate(name);
    if (family_of(name) == "winograd") return k.conv2d_backward_input_winograd(ctx, s, dy, w, dx);
    k.conv2d_backward_input(ctx, s, dy, w, dx);
    return true;
  });
}

bool conv2d_backward_input_bf16_add_chosen(const CpuContext& ctx, const Conv2dShape& s,
                                           const float* dy, const float* w, float* dx,
                                           std::string_view layer) {
  const std::vector<std::string>& c = candidates(true);
  if (kernel_choice() == KernelChoice::kFixed || c.size() < 2)
    return conv2d_backward_input_bf16_add_with(active_bf16_kernels(), ctx, s, dy, w, dx);
  const std::string problem = s.describe();
  const ChoiceProblem p{.key = "conv backward input added " + problem, .pass = "backward input, added",
                        .problem = problem, .bf16 = true, .threads = ctx.threads()};
  // Kernels that store their backward input (oneDNN's) leave the add to the caller once chosen.
  const auto adds_as_it_stores = [](const std::string& name) {
    return family_of(name) == "winograd" || bf16_backward_input_adds(bf16_by_name(name));
  };
  if (const std::optional<std::string> settled = settled_choice(p, c); settled && !adds_as_it_stores(*settled))
    return false;
  const std::int64_t n = std::int64_t{s.n} * s.h * s.w * s.c_in;
  std::vector<float> before;  // dx as the caller gave it, while the candidates are measured
  std::vector<float> apart;   // the backward input of kernels that store it, before it is added
  run_chosen(
      p, layer, c,
      [&](const std::string& name) {
        if (family_of(name) == "winograd")
          return conv2d_backward_input_bf16_winograd_add_with(bf16_by_name(name.substr(name.find('-') + 1)), ctx,
                                                              s, dy, w, dx);
        if (adds_as_it_stores(name)) return conv2d_backward_input_bf16_add_with(bf16_by_name(name), ctx, s, dy, w, dx);
        apart.resize(static_cast<std::size_t>(n));
        if (!bf16_or_emulated(name, name == c.front(), [&](Bf16Kernels k) {
              return conv2d_backward_input_bf16_with(k, ctx, s, dy, w, apart.data());
            }))
          return false;
        axpy(ctx, n, 1.0f, apart.data(), dx);
        return true;
      },
      [&] {
        if (before.empty()) before.assign(dx, dx + n);
        else std::copy(before.begin(), before.end(), dx);
      });
  return true;
}

bool conv2d_backward_input_add_chosen(const CpuContext& ctx, const Conv2dShape& s, const float* dy,
                                      const float* w, float* dx, std::string_view layer) {
  const std::vector<std::string>& c = candidates(false);
  const std::string problem = s.describe();
  const ChoiceProblem p{.key = "conv backward input added " + problem, .pass = "backward input, added",
                        .problem = problem, .bf16 = false, .threads = ctx.threads()};
  // oneDNN stores its backward input: once chosen, it leaves the add to the caller.
  if (const std::optional<std::string> settled = settled_choice(p, c); settled && *settled == "onednn")
    return false;
  const std::int64_t n = std::int64_t{s.n} * s.h * s.w * s.c_in;
  std::vector<float> before;  // dx as the caller gave it, while the candidates are measured
  std::vector<float> apart;   // oneDNN's backward input, before it is added
  run_chosen(
      p, layer, c,
      [&](const std::string& name) {
        if (name == "onednn") {
          apart.resize(static_cast<std::size_t>(n));
          if (!onednn::conv2d_backward_input(ctx, s, dy, w, apart.data(), onednn::Operands::kFp32)) return false;
          axpy(ctx, n, 1.0f, apart.data(), dx);
          return true;
        }
        const KernelTable& k = table_of_candidate(name);
        if (family_of(name) == "winograd") return k.conv2d_backward_input_add_winograd(ctx, s, dy, w, dx);
        k.conv2d_backward_input_add(ctx, s, dy, w, dx);
        return true;
      },
      [&] {
        if (before.empty()) before.assign(dx, dx + n);
        else std::copy(before.begin(), before.end(), dx);
      });
  return true;
}

void conv2d_backward_weight_chosen(const CpuContext& ctx, const Conv2dShape& s, const float* x,
                                   const float* dy, float* dw, bool bf16, std::string_view layer) {
  const std::vector<std::string>& c = candidates(bf16);
  if (kernel_choice() == KernelChoice::kFixed || c.size() < 2) {
    if (bf16) return conv2d_backward_weight_bf16(ctx, s, x, dy, dw);
    return conv2d_backward_weight(ctx, s, x, dy, dw);
  }
  const std::string problem = s.describe();
  const ChoiceProblem p{.key = "conv backward weight " + problem, .pass = "backward weight",
                        .problem = problem, .bf16 = bf16, .threads = ctx.threads()};
  run_chosen(p, layer, c, [&](const std::string& name) {
    if (bf16) return bf16_weight_grad(name, name == c.front(), ctx, s, x, dy, dw);
    if (name == "onednn") return onednn::conv2d_backward_weight(ctx, s, x, dy, dw, onednn::Operands::kFp32);
    const KernelTable& k = table_of_candidate(name);
    if (family_of(name) == "winograd") return k.conv2d_backward_weight_winograd(ctx, s, x, dy, dw);
    k.conv2d_backward_weight(ctx, s, x, dy, dw);
    return true;
  });
}

bool conv2d_backward_weight_bf16_dy_rows_chosen(const CpuContext& ctx, const Conv2dShape& s,
                                                const float* x, const DyRows& rows, float* dw) {
  const std::vector<std::string>& c = candidates(true);
  const std::string problem = s.describe();
  const ChoiceProblem p{.key = "conv backward weight " + problem, .pass = "backward weight",
                        .problem = problem, .bf16 = true, .threads = ctx.threads()};
  const std::optional<std::string> settled = settled_choice(p, c);
  if (!settled || family_of(*settled) == "winograd") return false;
  return conv2d_backward_weight_bf16_dy_rows_with(bf16_by_name(*settled), ctx, s, x, rows, dw);
}

void conv2d_forward_bf16_input_chosen(const CpuContext& ctx, const Conv2dShape& s,
                                      const std::uint16_t* x, const float* w,
                                      const float* bias_or_null, float* y, std::string_view layer) {
  const std::vector<std::string>& c = candidates(true);
  if (kernel_choice() == KernelChoice::kFixed || c.size() < 2)
    return conv2d_forward_bf16_input(ctx, s, x, w, bias_or_null, y);
  const std::string problem = s.describe() + ", bf16 input";
  const ChoiceProblem p{.key = "conv forward " + problem + (bias_or_null ? " +bias" : ""),
                        .pass = "forward", .problem = problem, .bf16 = true,
                        .threads = ctx.threads()};
  run_chosen(p, layer, c, [&](const std::string& name) {
    return bf16_forward(name, name == c.front(), ctx, s, x, w, bias_or_null, y);
  });
}

namespace {
template <typename In>
void forward_bf16_output_chosen(const CpuContext& ctx, const Conv2dShape& s, const In* x,
                                const float* w, const float* bias_or_null, std::uint16_t* y,
                                std::string_view layer) {
  const std::vector<std::string>& c = candidates(true);
  if (kernel_choice() == KernelChoice::kFixed || c.size() < 2)
    return conv2d_forward_bf16_output(ctx, s, x, w, bias_or_null, y);
  const std::string problem =
      s.describe() + (std::is_same_v<In, std::uint16_t> ? ", bf16 input" : "") + ", bf16 output";
  const ChoiceProblem p{.key = "conv forward " + problem + (bias_or_null ? " +bias" : ""),
                        .pass = "forward", .problem = problem, .bf16 = true,
                        .threads = ctx.threads()};
  run_chosen(p, layer, c, [&](const std::string& name) {
    return bf16_forward(name, name == c.front(), ctx, s, x, w, bias_or_null, y);
  });
}
}  // namespace

void conv2d_forward_bf16_output_chosen(const CpuContext& ctx, const Conv2dShape& s, const float* x,
                                       const float* w, const float* bias_or_null, std::uint16_t* y,
                                       std::string_view layer) {
  forward_bf16_output_chosen(ctx, s, x, w, bias_or_null, y, layer);
}

void conv2d_forward_bf16_output_chosen(const CpuContext& ctx, const Conv2dShape& s,
                                       const std::uint16_t* x, const float* w,
                                       const float* bias_or_null, std::uint16_t* y,
                                       std::string_view layer) {
  forward_bf16_output_chosen(ctx, s, x, w, bias_or_null, y, layer);
}

void conv2d_backward_weight_bf16_input_chosen(const CpuContext& ctx, const Conv2dShape& s,
                                              const std::uint16_t* x, const float* dy, float* dw,
                                              std::string_view layer) {
  const std::vector<std::string>& c = candidates(true);
  if (kernel_choice() == KernelChoice::kFixed || c.size() < 2)
    return conv2d_backward_weight_bf16_input(ctx, s, x, dy, dw);
  const std::string problem = s.describe() + ", bf16 input";
  const ChoiceProblem p{.key = "conv backward weight " + problem, .pass = "backward weight",
                        .problem = problem, .bf16 = true, .threads = ctx.threads()};
  run_chosen(p, layer, c, [&](const std::string& name) {
    return bf16_weight_grad(name, name == c.front(), ctx, s, x, dy, dw);
  });
}

void gemm_chosen(const CpuContext& ctx, bool trans_a, bool trans_b, int m, int n, int k,
                 const float* a, int lda, const float* b, int ldb, float* c, int ldc, bool bf16,
                 std::string_view layer) {
  const std::vector<std::string>& cands = candidates(bf16);
  const bool invalid = m <= 0 || n <= 0 || k <= 0 || lda < (trans_a ? m : k) ||
                       ldb < (trans_b ? k : n) || ldc < n;
  if (kernel_choice() == KernelChoice::kFixed || cands.size() < 2 || invalid) {
    if (bf16) return gemm_bf16(ctx, trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc);
    return gemm(ctx, trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
  }
  const std::string problem = describe_matmul(trans_a, trans_b, m, n, k);
  const ChoiceProblem p{.key = str("matmul ", problem, " ld ", lda, ",", ldb, ",", ldc),
                        .pass = "matmul", .problem = problem, .bf16 = bf16,
                        .threads = ctx.threads()};
  run_chosen(p, layer, cands, [&](const std::string& name) {
    if (bf16)
      return bf16_or_emulated(name, name == cands.front(), [&](Bf16Kernels kk) {
        return gemm_bf16_with(kk, ctx, trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc);
      });
    if (family_of(name) == "winograd") return false;
    if (name == "onednn")
      return onednn::gemm(ctx, trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc, onednn::Operands::kFp32);
    table_of_candidate(name).gemm(ctx, trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
    return true;
  });
}

}  // namespace cpu
}  // namespace towerflow
