// The machine's limits and the CPU kernels against them, as Google Benchmark micro-benchmarks.
//
//   towerflow_bench_kernels [--threads N] [--batch B] [--bandwidth_mib M] [--benchmark_* flags]
//   towerflow_bench_kernels --benchmark_filter='^peak/' --benchmark_format=json
//
// Three families, one name scheme (family/what/detail), so that a filter picks any of them:
//
//   peak/fp32_fma/<isa>      an FMA loop per instruction set the CPU can run (baseline: SSE
//                            multiply + add, avx2: 256-bit FMA, avx512: 512-bit FMA), on 1 and on
//                            N threads. counters: flop_per_s. See Note [The peak loop] (bench/peak.cc).
//   peak/bf16_dot/avx512bf16 VDPBF16PS (bf16 pairs into fp32), only where the CPU has AVX512-BF16.
//   peak/bf16_amx/amx        AMX's TDPBF16PS, only where the CPU has AMX-BF16 and Linux grants
//                            the tile state.
//   mem/copy, mem/triad      STREAM's copy (b = a) and triad (a = b + s*c) over arrays of
//                            --bandwidth_mib each, split over 1 and N threads. counters:
//                            byte_per_s (STREAM's count: reads + writes, no write-allocate).
//   kernel/<model>/<op>/<layer>  every convolution of ResNet-20 and tfcnn (forward, backward
//                            input, backward weight), ResNet-20's fused batch norm + ReLU
//                            (forward, backward), tfcnn's max pools (forward, backward; also
//                            `_cold`: the input in memory, the caches full of written lines) and its
//                            largest fully-connected layer as GEMMs (forward and both backward
//                            products), at --batch on a CpuContext of --threads. counters:
//                            flop_per_s (2 per multiply-add; 0 for memory-bound ops) and
//                            byte_per_s (compulsory traffic: each operand read or written once).
//   kernel_bf16/<model>/<op>/<layer>  the same convolutions and GEMMs through the bf16 kernels
//                            (core/cpu/bf16.h: fp32 operands read as bf16, fp32 accumulation), with
//                            the kernels this CPU chooses (TOWERFLOW_BF16_KERNELS=onednn|emulated
//                            forces one; the context names them). Byte counts are the fp32 ones.
//
// Times are wall clock (UseRealTime). The context reports the instruction set the kernels use.
// The share of the machine each kernel reaches is computed by bench/suite.py from these rows.

#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "bench/peak.h"
#include "core/cpu/batch_norm.h"
#include "core/cpu/bf16.h"
#include "core/cpu/context.h"
#include "core/cpu/conv.h"
#include "core/cpu/gemm.h"
#include "core/cpu/isa.h"
#include "core/cpu/pool.h"

namespace cpu = towerflow::cpu;
using towerflow::Conv2dShape;
using towerflow::Pool2dShape;
using towerflow::bench::kPeakIters;
using towerflow::bench::PeakLoop;
using towerflow::bench::peak_loops;
using towerflow::bench::random_vector;

namespace {

void run_peak(benchmark::State& state, const PeakLoop& loop) {
  float sink = 0;
  for (auto _ : state) {
    sink += loop.fn(kPeakIters);
    benchmark::DoNotOptimize(sink);
  }
  state.counters["flop_per_s"] =
      benchmark::Counter(loop.flop_per_iter * kPeakIters * state.iterations(), benchmark::Counter::kIsRate);
}

// STREAM arrays, shared by the threads of one run; each thread takes its own contiguous slice.
struct StreamArrays {
  std::vector<float> a, b, c;
};
StreamArrays g_stream;

void run_copy(benchmark::State& state) {
  const std::size_t n = g_stream.a.size(), t = state.thread_index(), nt = state.threads();
  const std::size_t lo = n * t / nt, hi = n * (t + 1) / nt;
  float* __restrict a = g_stream.a.data();
  float* __restrict b = g_stream.b.data();
  for (auto _ : state) {
    for (std::size_t i = lo; i < hi; ++i) b[i] = a[i];
    benchmark::ClobberMemory();
  }
  state.counters["byte_per_s"] =
      benchmark::Counter(2.0 * sizeof(float) * (hi - lo) * state.iterations(), benchmark::Counter::kIsRate);
}

void run_triad(benchmark::State& state) {
  const std::size_t n = g_stream.a.size(), t = state.thread_index(), nt = state.threads();
  const std::size_t lo = n * t / nt, hi = n * (t + 1) / nt;
  float* __restrict a = g_stream.a.data();
  const float* __restrict b = g_stream.b.data();
  const float* __restrict c = g_stream.c.data();
  for (auto _ : state) {
    for (std::size_t i = lo; i < hi; ++i) a[i] = b[i] + 3.0f * c[i];
    benchmark::ClobberMemory();
  }
  state.counters["byte_per_s"] =
      benchmark::Counter(3.0 * sizeof(float) * (hi - lo) * state.iterations(), benchmark::Counter::kIsRate);
}

// 64 MiB of floats: more than the caches of the CPUs the suite runs on.
constexpr std::size_t kColdFloats = std::size_t{64} << 20 >> 2;

// Writes every cache line of v (a cold-cache benchmark's untimed set-up).
void write_all(std::vector<float>& v) {
  for (std::size_t i = 0; i < v.size(); i += 16) v[i] += 1.0f;
}

void set_rates(benchmark::State& state, double flop_per_call, double byte_per_call) {
  const auto it = static_cast<double>(state.iterations());
  state.counters["flop_per_s"] = benchmark::Counter(flop_per_call * it, benchmark::Counter::kIsRate);
  state.counters["byte_per_s"] = benchmark::Counter(byte_per_call * it, benchmark::Counter::kIsRate);
}

template <class Fn>
void add_kernel(const std::string& name, Fn fn) {
  benchmark::RegisterBenchmark(name.c_str(), fn)->UseRealTime()->Unit(benchmark::kMillisecond);
}

void register_kernels(const cpu::CpuContext& ctx, int batch) {
  // Convolutions: forward, backward input, backward weight; in fp32, then through the bf16 kernels.
  for (const bool bf16 : {false, true})
  for (const auto& cc : towerflow::bench::conv_cases(batch)) {
    const Conv2dShape s = cc.s;
    const double flop = 2.0 * static_cast<double>(s.macs());
    const std::size_t nx = std::size_t(s.n) * s.h * s.w * s.c_in;
    const std::size_t ny = std::size_t(s.n) * s.out_h() * s.out_w() * s.c_out;
    const std::size_t nw = std::size_t(s.c_out) * s.c_in * s.kh * s.kw;
    const double bytes = 4.0 * (nx + ny + nw);
    const std::string base = (bf16 ? "kernel_bf16/" : "kernel/") + cc.model + "/";
    add_kernel(base + "conv_fwd/" + cc.layer, [&ctx, s, nx, ny, nw, flop, bytes, bf16](benchmark::State& st) {
      const auto x = random_vector(nx, 1), w = random_vector(nw, 2);
      std::vector<float> y(ny);
      for (auto _ : st)
        bf16 ? cpu::conv2d_forward_bf16(ctx, s, x.data(), w.data(), nullptr, y.data())
             : cpu::conv2d_forward(ctx, s, x.data(), w.data(), y.data());
      set_rates(st, flop, bytes);
    });
    add_kernel(base + "conv_bwd_input/" + cc.layer, [&ctx, s, nx, ny, nw, flop, bytes, bf16](benchmark::State& st) {
      const auto dy = random_vector(ny, 3), w = random_vector(nw, 2);
      std::vector<float> dx(nx);
      for (auto _ : st)
        bf16 ? cpu::conv2d_backward_input_bf16(ctx, s, dy.data(), w.data(), dx.data())
             : cpu::conv2d_backward_input(ctx, s, dy.data(), w.data(), dx.data());
      set_rates(st, flop, bytes);
    });
    add_kernel(base + "conv_bwd_weight/" + cc.layer, [&ctx, s, nx, ny, nw, flop, bytes, bf16](benchmark::State& st) {
      const auto x = random_vector(nx, 1), dy = random_vector(ny, 3);
      std::vector<float> dw(nw);
      for (auto _ : st)
        bf16 ? cpu::conv2d_backward_weight_bf16(ctx, s, x.data(), dy.data(), dw.data())
             : cpu::conv2d_backward_weight(ctx, s, x.data(), dy.data(), dw.data());
      set_rates(st, flop, bytes);
    });
  }

  // Batch norm fused with ReLU, as ResNet-20 uses it, at its three widths.
  for (auto [hw, c] : {std::pair{32, 16}, std::pair{16, 32}, std::pair{8, 64}}) {
    const std::int64_t rows = std::int64_t(batch) * hw * hw;
    const std::string layer = "bn " + std::to_string(c) + "ch " + std::to_string(hw) + "x" + std::to_string(hw);
    const double bytes = 4.0 * rows * c;
    // forward: reads x twice (statistics, then normalise), writes y.
    add_kernel("kernel/resnet20/bn_relu_fwd/" + layer, [&ctx, rows, c, bytes](benchmark::State& st) {
      const auto x = random_vector(rows * c, 4), gamma = random_vector(c, 6), beta = random_vector(c, 7);
      std::vector<float> y(x.size()), mean(c), invstd(c);
      for (auto _ : st)
        cpu::batch_norm_relu_forward_training(ctx, rows, c, x.data(), gamma.data(), beta.data(), 1e-5f,
                                              y.data(), mean.data(), invstd.data());
      set_rates(st, 0, 3 * bytes);
    });
    // forward storing y as bf16 (bf16 precision, the output a convolution alone reads).
    add_kernel("kernel/resnet20/bn_relu_fwd_bf16/" + layer, [&ctx, rows, c, bytes](benchmark::State& st) {
      const auto x = random_vector(rows * c, 4), gamma = random_vector(c, 6), beta = random_vector(c, 7);
      std::vector<std::uint16_t> y(x.size());
      std::vector<float> mean(c), invstd(c);
      for (auto _ : st)
        cpu::batch_norm_relu_forward_training_bf16(ctx, rows, c, x.data(), gamma.data(), beta.data(),
                                                   1e-5f, y.data(), mean.data(), invstd.data());
      set_rates(st, 0, 2.5 * bytes);
    });
    // backward: reads x, y, dy twice (reduce, then apply), writes dx.
    add_kernel("kernel/resnet20/bn_relu_bwd/" + layer, [&ctx, rows, c, bytes](benchmark::State& st) {
      const auto x = random_vector(rows * c, 4), dy = random_vector(rows * c, 5);
      const auto gamma = random_vector(c, 6), beta = random_vector(c, 7);
      std::vector<float> y(x.size()), dx(x.size()), mean(c), invstd(c), dg(c), db(c);
      cpu::batch_norm_relu_forward_training(ctx, rows, c, x.data(), gamma.data(), beta.data(), 1e-5f,
                                            y.data(), mean.data(), invstd.data());
      for (auto _ : st)
        cpu::batch_norm_relu_backward(ctx, rows, c, x.data(), nullptr, dy.data(), gamma.data(), beta.data(),
                                      mean.data(), invstd.data(), dx.data(), dg.data(), db.data(), nullptr);
      set_rates(st, 0, 5 * bytes);  // the mask recomputed from x: x and dy read twice, dx written
    });
  }

  // tfcnn's max pools (3x3, stride 2, 64 channels).
  for (int hw : {32, 16}) {
    const Pool2dShape s{.n = batch, .h = hw, .w = hw, .c = 64, .kh = 3, .kw = 3, .stride_h = 2,
                             .stride_w = 2, .pad_h = 1, .pad_w = 1};
    const std::string layer = "maxpool 3x3 s2 " + std::to_string(hw) + "x" + std::to_string(hw);
    const std::size_t nx = std::size_t(s.n) * s.h * s.w * s.c, ny = std::size_t(s.n) * s.out_h() * s.out_w() * s.c;
    const double bytes = 4.0 * (nx + 2 * ny);  // x, y and the argmax indices (forward); dy, argmax, dx (backward)
    add_kernel("kernel/tfcnn/maxpool_fwd/" + layer, [&ctx, s, nx, ny, bytes](benchmark::State& st) {
      const auto x = random_vector(nx, 8);
      std::vector<float> y(ny);
      std::vector<std::int32_t> arg(ny);
      for (auto _ : st) cpu::max_pool_forward(ctx, s, x.data(), y.data(), arg.data());
      set_rates(st, 0, bytes);
    });
    // The same with the pool's inputs in memory and the caches full of other written lines, as
    // in a training step after the convolution (Note [Prefetching the next rows], pool.cc).
    add_kernel("kernel/tfcnn/maxpool_fwd_cold/" + layer, [&ctx, s, nx, ny, bytes](benchmark::State& st) {
      auto x = random_vector(nx, 8);
      std::vector<float> y(ny), other(kColdFloats);
      std::vector<std::int32_t> arg(ny);
      for (auto _ : st) {
        st.PauseTiming();
        write_all(x);
        write_all(other);
        st.ResumeTiming();
        cpu::max_pool_forward(ctx, s, x.data(), y.data(), arg.data());
      }
      set_rates(st, 0, bytes);
    });
    add_kernel("kernel/tfcnn/maxpool_bwd_cold/" + layer, [&ctx, s, nx, ny, bytes](benchmark::State& st) {
      const auto x = random_vector(nx, 8);
      auto dy = random_vector(ny, 9);
      std::vector<float> y(ny), dx(nx), other(kColdFloats);
      std::vector<std::int32_t> arg(ny);
      cpu::max_pool_forward(ctx, s, x.data(), y.data(), arg.data());
      for (auto _ : st) {
        st.PauseTiming();
        write_all(dy);
        write_all(other);
        st.ResumeTiming();
        cpu::max_pool_backward(ctx, s, dy.data(), arg.data(), dx.data());
      }
      set_rates(st, 0, bytes);
    });
    add_kernel("kernel/tfcnn/maxpool_bwd/" + layer, [&ctx, s, nx, ny, bytes](benchmark::State& st) {
      const auto x = random_vector(nx, 8), dy = random_vector(ny, 9);
      std::vector<float> y(ny), dx(nx);
      std::vector<std::int32_t> arg(ny);
      cpu::max_pool_forward(ctx, s, x.data(), y.data(), arg.data());
      for (auto _ : st) cpu::max_pool_backward(ctx, s, dy.data(), arg.data(), dx.data());
      set_rates(st, 0, bytes);
    });
  }

  // tfcnn's fc1 (4096 -> 384) as its three GEMMs: y = x W^T, dx = dy W, dW = dy^T x.
  struct Gemm {
    std::string op;
    bool ta, tb;
    int m, n, k;
  };
  for (const Gemm& g : {Gemm{"gemm_fwd", false, true, batch, 384, 4096},
                        Gemm{"gemm_bwd_input", false, false, batch, 4096, 384},
                        Gemm{"gemm_bwd_weight", true, false, 384, 4096, batch}}) {
    const double flop = 2.0 * g.m * g.n * g.k;
    const double bytes = 4.0 * (double(g.m) * g.k + double(g.k) * g.n + double(g.m) * g.n);
    for (const bool bf16 : {false, true})
      add_kernel((bf16 ? "kernel_bf16/tfcnn/" : "kernel/tfcnn/") + g.op + "/fc1 4096->384",
                 [&ctx, g, flop, bytes, bf16](benchmark::State& st) {
        const auto a = random_vector(std::size_t(g.m) * g.k, 10), b = random_vector(std::size_t(g.k) * g.n, 11);
        std::vector<float> c(std::size_t(g.m) * g.n);
        const int lda = g.ta ? g.m : g.k, ldb = g.tb ? g.k : g.n;
        for (auto _ : st)
          bf16 ? cpu::gemm_bf16(ctx, g.ta, g.tb, g.m, g.n, g.k, a.data(), lda, b.data(), ldb, c.data(), g.n)
               : cpu::gemm(ctx, g.ta, g.tb, g.m, g.n, g.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), g.n);
        set_rates(st, flop, bytes);
      });
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);  // takes the --benchmark_* flags, leaves ours
  CLI::App app{"towerflow kernel micro-benchmarks and the machine's limits (Google Benchmark)"};
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  int threads = cores, batch = 128, bandwidth_mib = 256;
  app.add_option("--threads", threads, "threads of the kernels' CpuContext and of the multi-threaded peak and bandwidth rows")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--batch", batch, "images per kernel call")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--bandwidth_mib", bandwidth_mib, "MiB per STREAM array (three arrays; make them well beyond the last-level cache)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  benchmark::AddCustomContext("towerflow_isa", cpu::describe_active_isa());
  benchmark::AddCustomContext("towerflow_kernel_threads", std::to_string(threads));
  benchmark::AddCustomContext("towerflow_batch", std::to_string(batch));
  benchmark::AddCustomContext("cpu_features", cpu::cpu_features());
  benchmark::AddCustomContext("towerflow_bf16_kernels", cpu::describe_bf16_kernels());

  std::vector<int> thread_counts{1};
  if (threads > 1) thread_counts.push_back(threads);
  const auto loops = peak_loops();
  for (const auto& loop : loops)
    for (int t : thread_counts)
      benchmark::RegisterBenchmark(loop.name.c_str(), run_peak, loop)->Threads(t)->UseRealTime();
  if (std::none_of(loops.begin(), loops.end(),
                   [](const auto& l) { return l.name.find("bf16_dot") != std::string::npos; }))
    benchmark::AddCustomContext("bf16_peak", "skipped: this CPU has no AVX512-BF16");

  const std::size_t n = std::size_t(bandwidth_mib) * 1024 * 1024 / sizeof(float);
  g_stream.a.assign(n, 1.0f);
  g_stream.b.assign(n, 2.0f);
  g_stream.c.assign(n, 0.5f);
  for (int t : thread_counts) {
    benchmark::RegisterBenchmark("mem/copy", run_copy)->Threads(t)->UseRealTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("mem/triad", run_triad)->Threads(t)->UseRealTime()->Unit(benchmark::kMillisecond);
  }

  cpu::CpuContext ctx(threads);
  register_kernels(ctx, batch);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
