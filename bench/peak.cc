// The peak loops of bench/peak.h: see Note [The peak loop].

#include "bench/peak.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <cstdint>
#include <thread>
#include <vector>

#include "core/cpu/isa.h"

namespace towerflow::bench {

namespace {

// Note [The peak loop]
// The peak is what the cores' vector units can retire: kAcc independent accumulators, each
// updated by acc = acc * a + b, so that the FMA latency (4 cycles on current cores) times the FMA
// ports (2) is covered and the loop runs at one FMA per port per cycle. Each function is compiled
// for its own instruction set with a target attribute and called only when the CPU (and the OS,
// for the wide registers) supports it, so the binary runs on any x86-64 and never assumes the
// instructions of the machine it was built on. a and b keep the accumulators finite.
constexpr int kAcc = 12;

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) float peak_sse(std::int64_t iters) {
  __m128 acc[kAcc];
  for (int j = 0; j < kAcc; ++j) acc[j] = _mm_set1_ps(0.001f * j);
  const __m128 a = _mm_set1_ps(0.999999f), b = _mm_set1_ps(1e-7f);
  for (std::int64_t i = 0; i < iters; ++i)
#pragma GCC unroll 12
    for (int j = 0; j < kAcc; ++j) acc[j] = _mm_add_ps(_mm_mul_ps(acc[j], a), b);
  __m128 s = acc[0];
  for (int j = 1; j < kAcc; ++j) s = _mm_add_ps(s, acc[j]);
  return _mm_cvtss_f32(s);
}

__attribute__((target("avx2,fma"))) float peak_avx2(std::int64_t iters) {
  __m256 acc[kAcc];
  for (int j = 0; j < kAcc; ++j) acc[j] = _mm256_set1_ps(0.001f * j);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (std::int64_t i = 0; i < iters; ++i)
#pragma GCC unroll 12
    for (int j = 0; j < kAcc; ++j) acc[j] = _mm256_fmadd_ps(acc[j], a, b);
  __m256 s = acc[0];
  for (int j = 1; j < kAcc; ++j) s = _mm256_add_ps(s, acc[j]);
  return _mm256_cvtss_f32(s);
}

__attribute__((target("avx512f"))) float peak_avx512(std::int64_t iters) {
  __m512 acc[kAcc];
  for (int j = 0; j < kAcc; ++j) acc[j] = _mm512_set1_ps(0.001f * j);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (std::int64_t i = 0; i < iters; ++i)
#pragma GCC unroll 12
    for (int j = 0; j < kAcc; ++j) acc[j] = _mm512_fmadd_ps(acc[j], a, b);
  __m512 s = acc[0];
  for (int j = 1; j < kAcc; ++j) s = _mm512_add_ps(s, acc[j]);  // every accumulator stays live
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, s);
  return lanes[0] + lanes[15];
}

// VDPBF16PS: per 32-bit lane, two bf16 products added to an fp32 accumulator (4 FLOPs per lane).
__attribute__((target("avx512f,avx512bf16"))) float peak_avx512bf16(std::int64_t iters) {
  __m512 acc[kAcc];
  for (int j = 0; j < kAcc; ++j) acc[j] = _mm512_set1_ps(0.001f * j);
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80);  // 1.0 in bf16
  const __m512bh b = (__m512bh)_mm512_set1_epi16(0x3380);  // ~6e-8 in bf16
  for (std::int64_t i = 0; i < iters; ++i)
#pragma GCC unroll 12
    for (int j = 0; j < kAcc; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], a, b);
  __m512 s = acc[0];
  for (int j = 1; j < kAcc; ++j) s = _mm512_add_ps(s, acc[j]);  // every accumulator stays live
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, s);
  return lanes[0] + lanes[15];
}
#endif

#if defined(__x86_64__) && defined(__linux__)
// AMX (Intel Sapphire Rapids and later): TDPBF16PS multiplies a tile of 16 rows x 32 bf16 by a tile
// of 16 rows x 16 bf16 pairs into 16 x 16 fp32 accumulators, 16 * 16 * 32 multiply-adds. Four
// accumulator tiles (0-3) from four source tiles (4-7), as oneDNN's kernels use them, so that
// consecutive instructions do not wait on one accumulator.
constexpr int kAmxTiles = 4;
constexpr double kAmxFlopsPerTile = 16.0 * 16 * 32 * 2;

// LDTILECFG's 64-byte operand (palette 1: up to 16 rows of up to 64 bytes per tile).
struct alignas(64) TileConfig {
  std::uint8_t palette_id = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

__attribute__((target("amx-tile,amx-bf16"))) float peak_amx_bf16(std::int64_t iters) {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  _tile_loadconfig(&cfg);
  alignas(64) std::uint16_t a[16 * 32], b[16 * 32];
  std::fill(a, a + 16 * 32, std::uint16_t{0x3f80});  // 1.0 in bf16
  std::fill(b, b + 16 * 32, std::uint16_t{0x3380});  // ~6e-8 in bf16: the sums stay finite
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, a, 64);
  _tile_loadd(5, b, 64);
  _tile_loadd(6, b, 64);
  _tile_loadd(7, a, 64);
  for (std::int64_t i = 0; i < iters; ++i) {
    _tile_dpbf16ps(0, 4, 5);
    _tile_dpbf16ps(1, 4, 6);
    _tile_dpbf16ps(2, 7, 5);
    _tile_dpbf16ps(3, 7, 6);
  }
  alignas(64) float out[kAmxTiles][16 * 16];
  _tile_stored(0, out[0], 64);
  _tile_stored(1, out[1], 64);
  _tile_stored(2, out[2], 64);
  _tile_stored(3, out[3], 64);
  _tile_release();
  return out[0][0] + out[1][0] + out[2][0] + out[3][255];
}


float from_bf16(std::uint16_t b) {
  const std::uint32_t u = std::uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::uint16_t to_bf16(float f) {  // truncated: the operands only need to be bf16 values
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<std::uint16_t>(u >> 16);
}

// measure_amx_rounding (peak.h): one tile row per trial, C (1 x 16 fp32) += A (1 x products bf16)
// times B (products / 2 rows of 16 pairs).
__attribute__((target("amx-tile,amx-bf16"))) AmxRounding amx_rounding(int products, int trials) {
  TileConfig cfg;
  cfg.colsb[0] = 64, cfg.rows[0] = 1;
  cfg.colsb[1] = static_cast<std::uint16_t>(2 * products), cfg.rows[1] = 1;
  cfg.colsb[2] = 64, cfg.rows[2] = static_cast<std::uint8_t>(products / 2);
  _tile_loadconfig(&cfg);
  std::mt19937 gen(static_cast<unsigned>(products));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  AmxRounding r{.products = products};
  for (int t = 0; t < trials; ++t) {
    alignas(64) std::uint16_t a[32] = {};
    alignas(64) std::uint32_t b[16 * 16] = {};
    alignas(64) float c[16], c0[16];
    for (int i = 0; i < products; ++i) a[i] = to_bf16(normal(gen));
    for (int i = 0; i < products / 2 * 16; ++i)
      b[i] = to_bf16(normal(gen)) | std::uint32_t{to_bf16(normal(gen))} << 16;
    for (float& v : c0) v = normal(gen);
    std::memcpy(c, c0, sizeof c);
    _tile_loadd(0, c, 64);
    _tile_loadd(1, a, 64);
    _tile_loadd(2, b, 64);
    _tile_dpbf16ps(0, 1, 2);
    _tile_stored(0, c, 64);
    for (int n = 0; n < 16; ++n) {
      double exact = c0[n], largest = std::fabs(c0[n]);
      float fmas = c0[n];
      for (int p = 0; p < products / 2; ++p) {
        const float a0 = from_bf16(a[2 * p]), a1 = from_bf16(a[2 * p + 1]);
        const float b0 = from_bf16(static_cast<std::uint16_t>(b[p * 16 + n])),
                    b1 = from_bf16(static_cast<std::uint16_t>(b[p * 16 + n] >> 16));
        exact += double{a0} * b0 + double{a1} * b1;
        largest = std::max({largest, std::fabs(double{a0} * b0), std::fabs(double{a1} * b1)});
        fmas = std::fma(a1, b1, std::fma(a0, b0, fmas));
      }
      ++r.values;
      r.differ_from_exact += c[n] != static_cast<float>(exact);
      r.differ_from_fmas += c[n] != fmas;
      r.worst_amx = std::max(r.worst_amx, std::fabs(c[n] - exact) / largest);
      r.worst_fmas = std::max(r.worst_fmas, std::fabs(fmas - exact) / largest);
    }
  }
  _tile_release();
  return r;
}
#endif

}  // namespace

std::vector<PeakLoop> peak_loops() {
  std::vector<PeakLoop> out;
#if defined(__x86_64__)
  for (cpu::Isa isa : cpu::supported_isas()) {
    switch (isa) {
      case cpu::Isa::Baseline: out.push_back({"peak/fp32_fma/baseline", peak_sse, kAcc * 4 * 2.0}); break;
      case cpu::Isa::Avx2: out.push_back({"peak/fp32_fma/avx2", peak_avx2, kAcc * 8 * 2.0}); break;
      case cpu::Isa::Avx512:
        out.push_back({"peak/fp32_fma/avx512", peak_avx512, kAcc * 16 * 2.0});
        // The OS saves the 512-bit state (supported_isas checked XGETBV); the CPU must have BF16.
        if (__builtin_cpu_supports("avx512bf16"))
          out.push_back({"peak/bf16_dot/avx512bf16", peak_avx512bf16, kAcc * 16 * 4.0});
#if defined(__linux__)
        // The CPU has AMX-BF16 and Linux granted the tile data (core/cpu/isa.h).
        if (cpu::cpu_has_amx_bf16())
          out.push_back({"peak/bf16_amx/amx", peak_amx_bf16, kAmxTiles * kAmxFlopsPerTile});
#endif
        break;
      default: break;
    }
  }
#endif
  return out;
}


double measure_peak_flops(const PeakLoop& loop, int threads, double seconds) {
  // Each thread runs the loop for `seconds`; the rate is all threads' FLOPs over the longest
  // thread's time (they start together and stop on their own clock).
  std::vector<double> flops(threads), times(threads);
  std::vector<float> sinks(threads);  // the loops' results, kept so that no call is elided
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      float sink = 0;
      std::int64_t calls = 0;
      const auto t0 = std::chrono::steady_clock::now();
      double elapsed = 0;
      do {
        sink += loop.fn(kPeakIters);
        ++calls;
        elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      } while (elapsed < seconds);
      flops[t] = loop.flop_per_iter * kPeakIters * calls;
      sinks[t] = sink;
      times[t] = elapsed;
    });
  for (auto& th : pool) th.join();
  double total = 0;
  for (double f : flops) total += f;
  return total / *std::max_element(times.begin(), times.end());
}

double measure_triad_bytes_per_s(int threads, std::size_t mib_per_array, double seconds) {
  const std::size_t n = mib_per_array * (1 << 20) / sizeof(float);
  std::vector<float> a(n, 1.0f), b(n, 2.0f), c(n, 0.5f);
  double best = 0, spent = 0;
  while (spent < seconds || best == 0) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        const std::size_t lo = n * t / threads, hi = n * (t + 1) / threads;
        float* __restrict pa = a.data();
        const float* __restrict pb = b.data();
        const float* __restrict pc = c.data();
        for (std::size_t i = lo; i < hi; ++i) pa[i] = pb[i] + 3.0f * pc[i];
      });
    for (auto& th : pool) th.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    spent += s;
    best = std::max(best, 3.0 * sizeof(float) * n / s);
  }
  if (a[n / 2] != 2.0f + 3.0f * 0.5f) best = 0;  // reads the result, so the loop stays
  return best;
}

AmxRounding measure_amx_rounding(int products, int trials) {
#if defined(__x86_64__) && defined(__linux__)
  if (cpu::cpu_has_amx_bf16()) return amx_rounding(products, trials);
#endif
  return AmxRounding{.products = products};
}

}  // namespace towerflow::bench
