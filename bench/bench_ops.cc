// Per-op CPU kernel benchmark: every convolution of ResNet-20 and tfcnn at batch 128 (forward,
// backward input, backward weight), their batch norms and max pools, and tfcnn's largest GEMM.
//
//   towerflow_bench_ops [--threads N] [--batch B] [--precision fp32|bf16|both] [--json]
//                       [--filter TEXT] [--min_time S]
//
// Prints a fixed-width table (median ms over timed repetitions after one warm-up call, GFLOP/s
// for convolutions and GEMM counting 2 FLOPs per multiply-add, GB/s of compulsory traffic for
// the memory-bound ops) and, with --json, one JSON line per row. The check column compares a
// sample of outputs against a double-precision reference computed here (for bf16 rows, on the
// operands rounded to bf16).
//
// --precision bf16 (or both) adds the convolutions and the GEMM through the bf16 kernels
// (core/cpu/bf16.h, the ones this CPU chooses; TOWERFLOW_BF16_KERNELS forces one). The header
// gives the machine's peaks on --threads threads (bench/peak.h: the widest fp32 FMA loop, and
// VDPBF16PS where the CPU has AVX512-BF16), and the "% peak" column puts each row against the
// peak of the instructions it runs: the bf16 peak for oneDNN's and towerflow's AVX512-BF16
// kernels where it was measured, the fp32 peak for fp32 rows and for emulated bf16 (which runs
// the fp32 kernels). The winograd_* rows (Winograd F(2x2, 3x3), 3x3 stride-1 layers) count the
// direct convolution's multiply-adds, as the training benchmarks do, so that their GFLOP/s compare
// with the conv_* rows; having 16/36 of those to do, they may pass 100% of the peak. With bf16 they
// are towerflow's bf16 Winograd kernels, where the CPU has AVX512-BF16.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/peak.h"
#include "core/cpu/bf16.h"
#include "core/cpu/batch_norm.h"
#include "core/cpu/conv.h"
#include "core/cpu/gemm.h"
#include "core/cpu/pool.h"

namespace tw = towerflow::cpu;

namespace {

using towerflow::bench::conv_cases;
using towerflow::bench::random_vector;

// With cpu_clock, the process CPU time divided by the thread count: on a machine shared with
// other work this leaves out the time the threads spend descheduled (wall time does not).
bool g_cpu_clock = false;
int g_threads = 1;

double now_s() {
  if (g_cpu_clock) {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (ts.tv_sec + ts.tv_nsec * 1e-9) / g_threads;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median_ms(const std::function<void()>& fn, double min_time) {
  fn();  // warm-up: scratch buffers grow, caches and pages are touched
  std::vector<double> times;
  double total = 0.0;
  while ((total < min_time || times.size() < 3) && times.size() < 50) {
    const double t0 = now_s();
    fn();
    const double s = now_s() - t0;
    times.push_back(s);
    total += s;
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2] * 1e3;
}

struct Row {
  std::string model, layer, op, shape;
  std::string precision = "fp32";
  double ms = 0.0, gflops = 0.0, gbytes = 0.0;
  double peak_gflops = 0.0;  // the peak this row is measured against (0: none; memory-bound)
  double max_error = 0.0;
  // The check's bound: 1e-4 against the double reference on the same (rounded) operands; 2e-2, the
  // bf16 tolerance, for the bf16 Winograd kernels, which round their transforms too.
  double tol = 1e-4;
  bool ok = true;
};

// A sampled relative error: |got - want| / (|want| + scale), scale = rms of the sampled wants.
struct Sampler {
  std::vector<std::pair<double, double>> pairs;
  void add(double got, double want) { pairs.emplace_back(got, want); }
  double error() const {
    double sq = 0.0;
    for (auto& p : pairs) sq += p.second * p.second;
    const double rms = std::sqrt(sq / std::max<std::size_t>(1, pairs.size())) + 1e-30;
    double worst = 0.0;
    for (auto& p : pairs) {
      const double e = std::abs(p.first - p.second) / (std::abs(p.second) + rms);
      worst = std::isnan(e) ? INFINITY : std::max(worst, e);
    }
    return worst;
  }
};

// Double-precision conv terms for one output element of each kernel.
double ref_y(const towerflow::Conv2dShape& s, const float* x, const float* w, int n, int oh, int ow, int co) {
  double acc = 0.0;
  for (int ci = 0; ci < s.c_in; ++ci)
    for (int i = 0; i < s.kh; ++i)
      for (int j = 0; j < s.kw; ++j) {
        const int ih = oh * s.stride_h - s.pad_h + i, iw = ow * s.stride_w - s.pad_w + j;
        if (ih < 0 || ih >= s.h || iw < 0 || iw >= s.w) continue;
        acc += double(x[((std::int64_t(n) * s.h + ih) * s.w + iw) * s.c_in + ci]) *
               w[((std::int64_t(co) * s.c_in + ci) * s.kh + i) * s.kw + j];
      }
  return acc;
}

double ref_dx(const towerflow::Conv2dShape& s, const float* dy, const float* w, int n, int ih, int iw, int ci) {
  double acc = 0.0;
  for (int co = 0; co < s.c_out; ++co)
    for (int i = 0; i < s.kh; ++i)
      for (int j = 0; j < s.kw; ++j) {
        const int th = ih + s.pad_h - i, tw_ = iw + s.pad_w - j;
        if (th < 0 || tw_ < 0 || th % s.stride_h || tw_ % s.stride_w) continue;
        const int oh = th / s.stride_h, ow = tw_ / s.stride_w;
        if (oh >= s.out_h() || ow >= s.out_w()) continue;
        acc += double(dy[((std::int64_t(n) * s.out_h() + oh) * s.out_w() + ow) * s.c_out + co]) *
               w[((std::int64_t(co) * s.c_in + ci) * s.kh + i) * s.kw + j];
      }
  return acc;
}

double ref_dw(const towerflow::Conv2dShape& s, const float* x, const float* dy, int co, int ci, int i, int j) {
  double acc = 0.0;
  for (int n = 0; n < s.n; ++n)
    for (int oh = 0; oh < s.out_h(); ++oh)
      for (int ow = 0; ow < s.out_w(); ++ow) {
        const int ih = oh * s.stride_h - s.pad_h + i, iw = ow * s.stride_w - s.pad_w + j;
        if (ih < 0 || ih >= s.h || iw < 0 || iw >= s.w) continue;
        acc += double(x[((std::int64_t(n) * s.h + ih) * s.w + iw) * s.c_in + ci]) *
               dy[((std::int64_t(n) * s.out_h() + oh) * s.out_w() + ow) * s.c_out + co];
      }
  return acc;
}

// v rounded to bf16 (the bf16 kernels' operands), for the references of bf16 rows.
std::vector<float> rounded(std::vector<float> v) {
  tw::round_to_bf16(static_cast<std::int64_t>(v.size()), v.data(), v.data());
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"towerflow CPU kernel benchmark (ResNet-20 and tfcnn ops, NHWC)"};
  int threads = 2, batch = 128;
  bool json = false;
  double min_time = 0.3;
  std::string filter, precision = "fp32";
  app.add_option("--threads", threads, "intra-op threads of the CPU context")->check(CLI::PositiveNumber);
  app.add_option("--precision", precision,
                 "fp32, bf16 (the bf16 kernels this CPU chooses), or both (each convolution and "
                 "the GEMM in fp32 and in bf16)")
      ->check(CLI::IsMember({"fp32", "bf16", "both"}));
  app.add_option("--batch", batch, "batch size")->check(CLI::PositiveNumber);
  app.add_option("--min_time", min_time, "seconds of timed repetitions per row (at least 3 runs)");
  app.add_option("--filter", filter, "only rows whose model, layer or op contains this text");
  app.add_flag("--json", json, "also print one JSON line per row");
  app.add_flag("--cpu_clock", g_cpu_clock,
               "time with process CPU time / threads instead of wall time (for a busy machine; "
               "idle waiting inside a kernel is then not counted)");
  CLI11_PARSE(app, argc, argv);
  g_threads = threads;

  tw::CpuContext ctx(threads);
  std::mt19937 pick(12345);
  std::vector<Row> rows;
  std::vector<std::string> precisions;
  if (precision != "bf16") precisions.push_back("fp32");
  if (precision != "fp32") precisions.push_back("bf16");
  auto wanted = [&](const std::string& model, const std::string& layer, const std::string& op) {
    return filter.empty() || (model + " " + layer + " " + op).find(filter) != std::string::npos;
  };

  // The machine's peaks on `threads` threads (bench/peak.h), for the "% peak" column.
  double fp32_peak = 0.0, bf16_peak = 0.0, amx_peak = 0.0;
  std::string fp32_peak_name = "none", bf16_peak_name = "none";
  for (const auto& loop : towerflow::bench::peak_loops()) {
    const double gflops = towerflow::bench::measure_peak_flops(loop, threads, 0.3) / 1e9;
    if (loop.name.rfind("peak/fp32_fma/", 0) == 0) {
      fp32_peak = gflops;  // the loops come lowest instruction set first: keep the widest
      fp32_peak_name = loop.name;
    } else if (loop.name.rfind("peak/bf16_dot/", 0) == 0) {
      bf16_peak = gflops;
      bf16_peak_name = loop.name;
    } else if (loop.name.rfind("peak/bf16_amx/", 0) == 0) {
      amx_peak = gflops;
    }
  }
  // oneDNN on AMX runs its tile kernels: their rows go over the AMX peak.
  if (amx_peak > 0 && tw::active_bf16_kernels() == tw::Bf16Kernels::OneDnn &&
      tw::onednn_isa() == "avx512_core_amx") {
    bf16_peak = amx_peak;
    bf16_peak_name = "peak/bf16_amx/amx";
  }
  const tw::Bf16Kernels bf16_kernels = tw::active_bf16_kernels();
  const bool bf16_native = bf16_kernels == tw::Bf16Kernels::OneDnn || bf16_kernels == tw::Bf16Kernels::Avx512Bf16;
  // The peak of the instructions a row of this precision runs (see the header comment).
  auto peak_for = [&](const std::string& p) {
    return p == "bf16" && bf16_native && bf16_peak > 0 ? bf16_peak : fp32_peak;
  };

  auto emit = [&](Row r) {
    r.ok = r.max_error < r.tol;
    const std::string op = r.precision == "fp32" ? r.op : r.op + "_" + r.precision;
    if (r.gflops > 0) r.peak_gflops = peak_for(r.precision);
    char share[16] = "";
    if (r.peak_gflops > 0) std::snprintf(share, sizeof share, "%5.1f%%", 100.0 * r.gflops / r.peak_gflops);
    std::printf("%-9s %-24s %-19s %9.3f %9.1f %7s %8.1f  %s (%.1e)\n", r.model.c_str(), r.layer.c_str(),
                op.c_str(), r.ms, r.gflops, share, r.gbytes, r.ok ? "ok" : "FAIL", r.max_error);
    std::fflush(stdout);
    rows.push_back(r);
  };
  std::printf("# towerflow_bench_ops: threads=%d batch=%d clock=%s (median of timed runs after a warm-up)\n",
              threads, batch, g_cpu_clock ? "cpu/threads" : "wall");
  std::printf("# peak on %d threads: fp32 %.1f GFLOP/s (%s); bf16 %s\n", threads, fp32_peak,
              fp32_peak_name.c_str(),
              bf16_peak > 0 ? (std::to_string(int(bf16_peak + 0.5)) + " GFLOP/s (" + bf16_peak_name + ")").c_str()
                            : "none measured (no AVX512-BF16 or AMX here)");
  if (precision != "fp32") std::printf("# bf16 kernels: %s\n", tw::describe_bf16_kernels().c_str());
  std::printf("%-9s %-24s %-19s %9s %9s %7s %8s  %s\n", "model", "layer", "op", "ms", "GFLOP/s",
              "% peak", "GB/s", "check (max rel err)");

  // ---- convolutions (fp32 and/or bf16: the reference then uses the bf16-rounded operands) ----
  const auto runnable = tw::runnable_bf16_kernels();
  const bool winograd_bf16 =
      std::find(runnable.begin(), runnable.end(), tw::Bf16Kernels::Avx512Bf16) != runnable.end();
  for (const auto& cc : conv_cases(batch)) {
    const auto& s = cc.s;
    const std::size_t nx = std::size_t(s.n) * s.h * s.w * s.c_in;
    const std::size_t ny = std::size_t(s.n) * s.out_h() * s.out_w() * s.c_out;
    const std::size_t nw = std::size_t(s.c_out) * s.c_in * s.kh * s.kw;
    const auto x = random_vector(nx, 1), w = random_vector(nw, 2), dy = random_vector(ny, 3);
    std::vector<float> y(ny), dx(nx), dw(nw);
    const double gflop = 2.0 * s.macs() / 1e9;
    const double gb_fwd = (nx + ny + nw) * 4.0 / 1e9;
    auto uni = [&](int hi) { return std::uniform_int_distribution<int>(0, hi - 1)(pick); };
    for (const std::string& p : precisions) {
      const bool bf16 = p == "bf16";
      const std::vector<float> xr = bf16 ? rounded(x) : x, wr = bf16 ? rounded(w) : w,
                               dyr = bf16 ? rounded(dy) : dy;
      // A row of op timing run() and checking its output against the reference (the three
      // passes' checks: y, dx, or dw), where wanted.
      auto fwd_row = [&](const std::string& op, auto run, double row_tol = 1e-4) {
        Row r{cc.model, cc.layer, op, s.to_string(), p};
        r.tol = row_tol;
        r.ms = median_ms(run, min_time);
        Sampler smp;
        for (int t = 0; t < 300; ++t) {
          const int n = uni(s.n), oh = uni(s.out_h()), ow = uni(s.out_w()), co = uni(s.c_out);
          smp.add(y[((std::size_t(n) * s.out_h() + oh) * s.out_w() + ow) * s.c_out + co],
                  ref_y(s, xr.data(), wr.data(), n, oh, ow, co));
        }
        r.gflops = gflop / (r.ms / 1e3);
        r.gbytes = gb_fwd / (r.ms / 1e3);
        r.max_error = smp.error();
        emit(r);
      };
      auto bwd_input_row = [&](const std::string& op, auto run, double row_tol = 1e-4) {
        Row r{cc.model, cc.layer, op, s.to_string(), p};
        r.tol = row_tol;
        r.ms = median_ms(run, min_time);
        Sampler smp;
        for (int t = 0; t < 300; ++t) {
          const int n = uni(s.n), ih = uni(s.h), iw = uni(s.w), ci = uni(s.c_in);
          smp.add(dx[((std::size_t(n) * s.h + ih) * s.w + iw) * s.c_in + ci],
                  ref_dx(s, dyr.data(), wr.data(), n, ih, iw, ci));
        }
        r.gflops = gflop / (r.ms / 1e3);
        r.gbytes = gb_fwd / (r.ms / 1e3);
        r.max_error = smp.error();
        emit(r);
      };
      auto bwd_weight_row = [&](const std::string& op, auto run, double row_tol = 1e-4) {
        Row r{cc.model, cc.layer, op, s.to_string(), p};
        r.tol = row_tol;
        r.ms = median_ms(run, min_time);
        Sampler smp;
        for (int t = 0; t < 12; ++t) {
          const int co = uni(s.c_out), ci = uni(s.c_in), i = uni(s.kh), j = uni(s.kw);
          smp.add(dw[((std::size_t(co) * s.c_in + ci) * s.kh + i) * s.kw + j],
                  ref_dw(s, xr.data(), dyr.data(), co, ci, i, j));
        }
        r.gflops = gflop / (r.ms / 1e3);
        r.gbytes = gb_fwd / (r.ms / 1e3);
        r.max_error = smp.error();
        emit(r);
      };
      if (wanted(cc.model, cc.layer, "conv_fwd"))
        fwd_row("conv_fwd", [&] {
          if (bf16)
            tw::conv2d_forward_bf16(ctx, s, x.data(), w.data(), nullptr, y.data());
          else
            tw::conv2d_forward(ctx, s, x.data(), w.data(), y.data());
        });
      if (wanted(cc.model, cc.layer, "conv_bwd_input"))
        bwd_input_row("conv_bwd_input", [&] {
          if (bf16)
            tw::conv2d_backward_input_bf16(ctx, s, dy.data(), w.data(), dx.data());
          else
            tw::conv2d_backward_input(ctx, s, dy.data(), w.data(), dx.data());
        });
      if (wanted(cc.model, cc.layer, "conv_bwd_weight"))
        bwd_weight_row("conv_bwd_weight", [&] {
          if (bf16)
            tw::conv2d_backward_weight_bf16(ctx, s, x.data(), dy.data(), dw.data());
          else
            tw::conv2d_backward_weight(ctx, s, x.data(), dy.data(), dw.data());
        });
      // Winograd F(2x2, 3x3), a kernel-choice candidate, on the 3x3 stride-1 layers it computes
      // (a first call says whether it does).
      if (!bf16 && wanted(cc.model, cc.layer, "winograd_fwd") &&
          tw::conv2d_forward_winograd(ctx, s, x.data(), w.data(), nullptr, y.data()))
        fwd_row("winograd_fwd", [&] { tw::conv2d_forward_winograd(ctx, s, x.data(), w.data(), nullptr, y.data()); });
      if (!bf16 && wanted(cc.model, cc.layer, "winograd_bwd_input") &&
          tw::conv2d_backward_input_winograd(ctx, s, dy.data(), w.data(), dx.data()))
        bwd_input_row("winograd_bwd_input",
                      [&] { tw::conv2d_backward_input_winograd(ctx, s, dy.data(), w.data(), dx.data()); });
      if (!bf16 && wanted(cc.model, cc.layer, "winograd_bwd_weight") &&
          tw::conv2d_backward_weight_winograd(ctx, s, x.data(), dy.data(), dw.data()))
        bwd_weight_row("winograd_bwd_weight",
                       [&] { tw::conv2d_backward_weight_winograd(ctx, s, x.data(), dy.data(), dw.data()); });
      // The bf16 Winograd kernels, a candidate where the CPU has AVX512-BF16 (Note [bf16 Winograd
      // convolution] in core/cpu/bf16_pairs.cc), checked to the bf16 tolerance.
      if (bf16 && winograd_bf16) {
        constexpr auto k = tw::Bf16Kernels::Avx512Bf16;
        constexpr double kBf16Tol = 2e-2;
        // Each runs once to see whether the kernel takes the layer, then is timed as a row.
        const auto fwd = [&] {
          return tw::conv2d_forward_bf16_winograd_with(k, ctx, s, x.data(), w.data(), nullptr, y.data());
        };
        const auto bwd_input = [&] {
          return tw::conv2d_backward_input_bf16_winograd_with(k, ctx, s, dy.data(), w.data(), dx.data());
        };
        const auto bwd_weight = [&] {
          return tw::conv2d_backward_weight_bf16_winograd_with(k, ctx, s, x.data(), dy.data(), dw.data());
        };
        if (wanted(cc.model, cc.layer, "winograd_fwd") && fwd()) fwd_row("winograd_fwd", fwd, kBf16Tol);
        if (wanted(cc.model, cc.layer, "winograd_bwd_input") && bwd_input())
          bwd_input_row("winograd_bwd_input", bwd_input, kBf16Tol);
        if (wanted(cc.model, cc.layer, "winograd_bwd_weight") && bwd_weight())
          bwd_weight_row("winograd_bwd_weight", bwd_weight, kBf16Tol);
      }
    }
  }

  // ---- batch norm (ResNet-20's three widths), fused with ReLU as the network uses it ----
  for (auto [hw, c] : {std::pair{32, 16}, std::pair{16, 32}, std::pair{8, 64}}) {
    const std::int64_t n_rows = std::int64_t(batch) * hw * hw;
    const std::string layer = "bn " + std::to_string(c) + "ch " + std::to_string(hw) + "x" + std::to_string(hw);
    const std::string shape = "rows=" + std::to_string(n_rows) + " c=" + std::to_string(c);
    const auto x = random_vector(n_rows * c, 4), dy = random_vector(n_rows * c, 5);
    const auto gamma = random_vector(c, 6), beta = random_vector(c, 7);
    std::vector<float> y(x.size()), dx(x.size()), mean(c), invstd(c), dg(c), db(c);
    const double bytes = x.size() * 4.0;
    // Reference statistics of a sampled channel, in double.
    auto check_stats = [&](Sampler& smp) {
      const int ch = int(pick() % c);
      double m = 0.0, v = 0.0;
      for (std::int64_t r = 0; r < n_rows; ++r) m += x[r * c + ch];
      m /= n_rows;
      for (std::int64_t r = 0; r < n_rows; ++r) v += (x[r * c + ch] - m) * (x[r * c + ch] - m);
      v /= n_rows;
      smp.add(mean[ch], m);
      smp.add(invstd[ch], 1.0 / std::sqrt(v + 1e-5));
      for (int t = 0; t < 100; ++t) {
        const std::int64_t r = pick() % n_rows;
        smp.add(y[r * c + ch], std::max(0.0, (x[r * c + ch] - m) / std::sqrt(v + 1e-5) * gamma[ch] + beta[ch]));
      }
    };
    if (wanted("resnet20", layer, "bn_relu_fwd")) {
      Row r{"resnet20", layer, "bn_relu_fwd", shape};
      r.ms = median_ms([&] {
        tw::batch_norm_relu_forward_training(ctx, n_rows, c, x.data(), gamma.data(), beta.data(),
                                             1e-5f, y.data(), mean.data(), invstd.data());
      }, min_time);
      Sampler smp;
      check_stats(smp);
      r.gbytes = 3 * bytes / 1e9 / (r.ms / 1e3);  // read x twice, write y
      r.max_error = smp.error();
      emit(r);
    }
    if (wanted("resnet20", layer, "bn_relu_bwd")) {
      tw::batch_norm_relu_forward_training(ctx, n_rows, c, x.data(), gamma.data(), beta.data(),
                                           1e-5f, y.data(), mean.data(), invstd.data());
      Row r{"resnet20", layer, "bn_relu_bwd", shape};
      r.ms = median_ms([&] {
        tw::batch_norm_relu_backward(ctx, n_rows, c, x.data(), nullptr, dy.data(), gamma.data(),
                                     beta.data(), mean.data(), invstd.data(), dx.data(), dg.data(),
                                     db.data(), nullptr);
      }, min_time);
      // Check dbeta of one channel: the sum of the masked gradient.
      Sampler smp;
      const int ch = int(pick() % c);
      double sum = 0.0;
      for (std::int64_t q = 0; q < n_rows; ++q) sum += y[q * c + ch] > 0 ? dy[q * c + ch] : 0.0;
      smp.add(db[ch], sum);
      r.gbytes = 5 * bytes / 1e9 / (r.ms / 1e3);  // x and dy twice (the mask from x); write dx
      r.max_error = smp.error();
      emit(r);
    }
  }

  // ---- max pool (tfcnn) ----
  for (int hw : {32, 16}) {
    const towerflow::Pool2dShape s{.n = batch, .h = hw, .w = hw, .c = 64, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1};
    const std::string layer = "maxpool 3x3 s2 " + std::to_string(hw) + "x" + std::to_string(hw);
    const std::size_t nx = std::size_t(s.n) * s.h * s.w * s.c, ny = std::size_t(s.n) * s.out_h() * s.out_w() * s.c;
    const auto x = random_vector(nx, 8), dy = random_vector(ny, 9);
    std::vector<float> y(ny), dx(nx);
    std::vector<std::int32_t> arg(ny);
    if (wanted("tfcnn", layer, "maxpool_fwd")) {
      Row r{"tfcnn", layer, "maxpool_fwd", s.to_string()};
      r.ms = median_ms([&] { tw::max_pool_forward(ctx, s, x.data(), y.data(), arg.data()); }, min_time);
      Sampler smp;
      for (int t = 0; t < 300; ++t) {
        const std::size_t o = pick() % ny;
        const int ch = int(o % s.c), ow = int(o / s.c % s.out_w()), oh = int(o / s.c / s.out_w() % s.out_h());
        const std::size_t n = o / s.c / s.out_w() / s.out_h();
        double best = -INFINITY;
        for (int i = 0; i < 3; ++i)
          for (int j = 0; j < 3; ++j) {
            const int ih = oh * 2 - 1 + i, iw = ow * 2 - 1 + j;
            if (ih >= 0 && ih < hw && iw >= 0 && iw < hw)
              best = std::max<double>(best, x[((n * hw + ih) * hw + iw) * s.c + ch]);
          }
        smp.add(y[o], best);
      }
      r.gbytes = (nx + 2 * ny) * 4.0 / 1e9 / (r.ms / 1e3);
      r.max_error = smp.error();
      emit(r);
    }
    if (wanted("tfcnn", layer, "maxpool_bwd")) {
      tw::max_pool_forward(ctx, s, x.data(), y.data(), arg.data());
      Row r{"tfcnn", layer, "maxpool_bwd", s.to_string()};
      r.ms = median_ms([&] { tw::max_pool_backward(ctx, s, dy.data(), arg.data(), dx.data()); }, min_time);
      double total_dy = 0.0, total_dx = 0.0;
      for (float v : dy) total_dy += v;
      for (float v : dx) total_dx += v;
      Sampler smp;
      smp.add(total_dx, total_dy);  // every gradient lands somewhere exactly once
      r.gbytes = (nx + 2 * ny) * 4.0 / 1e9 / (r.ms / 1e3);
      r.max_error = smp.error();
      emit(r);
    }
  }

  // ---- GEMM: tfcnn's fc1 forward, y[B, 384] = x[B, 4096] * W^T ----
  if (wanted("tfcnn", "fc1 4096->384", "gemm")) {
    const int m = batch, n = 384, k = 4096;
    const auto a = random_vector(std::size_t(m) * k, 10), b = random_vector(std::size_t(n) * k, 11);
    std::vector<float> c(std::size_t(m) * n);
    for (const std::string& p : precisions) {
      const bool bf16 = p == "bf16";
      const std::vector<float> ar = bf16 ? rounded(a) : a, br = bf16 ? rounded(b) : b;
      Row r{"tfcnn", "fc1 4096->384", "gemm_nt", "m=" + std::to_string(m) + " n=384 k=4096", p};
      r.ms = median_ms([&] {
        if (bf16)
          tw::gemm_bf16(ctx, false, true, m, n, k, a.data(), k, b.data(), k, c.data(), n);
        else
          tw::gemm(ctx, false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, c.data(), n);
      }, min_time);
      Sampler smp;
      for (int t = 0; t < 50; ++t) {
        const int i = int(pick() % m), j = int(pick() % n);
        double acc = 0.0;
        for (int q = 0; q < k; ++q) acc += double(ar[std::size_t(i) * k + q]) * br[std::size_t(j) * k + q];
        smp.add(c[std::size_t(i) * n + j], acc);
      }
      r.gflops = 2.0 * m * n * k / 1e9 / (r.ms / 1e3);
      r.max_error = smp.error();
      emit(r);
    }
  }

  if (json)
    for (const auto& r : rows)
      std::printf("%s\n", nlohmann::json{{"bench", "ops"}, {"framework", "towerflow"}, {"threads", threads},
                                         {"batch", batch}, {"clock", g_cpu_clock ? "cpu" : "wall"}, {"model", r.model}, {"layer", r.layer},
                                         {"op", r.op}, {"precision", r.precision}, {"shape", r.shape}, {"ms", r.ms},
                                         {"gflop_per_s", r.gflops}, {"gb_per_s", r.gbytes},
                                         {"peak_gflop_per_s", r.peak_gflops},
                                         {"max_rel_error", r.max_error}, {"ok", r.ok}}
                                  .dump()
                                  .c_str());
  const bool all_ok = std::all_of(rows.begin(), rows.end(), [](const Row& r) { return r.ok; });
  return all_ok ? 0 : 1;
}
