// How AMX's tdpbf16ps rounds, against two references: the exactly rounded sum (the products and
// the accumulator added in double, rounded once) and the pair of FMAs per lane that
// towerflow's emulated AMX kernels compute (Note [bf16 AMX kernels]). For each number of
// products per instruction (2 to 32), it runs one instruction per trial on random normal
// operands and prints, as a JSON line, how many results differ from each reference and the
// largest difference as a fraction of the largest term. It needs a CPU with AMX-BF16.
//
//   towerflow_bench_amx_rounding [--trials N]
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>

#include "core/cpu/isa.h"

namespace {

struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

float from_bf16(std::uint16_t b) {
  const std::uint32_t u = std::uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::uint16_t to_bf16(float f) {  // truncation: the operands only need to be bf16 values
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<std::uint16_t>(u >> 16);
}

struct Result {
  long long values = 0, differ_exact = 0, differ_fmas = 0;
  double worst_amx = 0, worst_fmas = 0;  // |result - exact| / the largest term
};

// One tile row: C (1 x 16 fp32) += A (1 x k bf16) times B (k / 2 rows of 16 pairs).
__attribute__((target("amx-tile,amx-bf16"))) Result measure(int k, int trials) {
  TileConfig cfg;
  cfg.colsb[0] = 64, cfg.rows[0] = 1;
  cfg.colsb[1] = static_cast<std::uint16_t>(2 * k), cfg.rows[1] = 1;
  cfg.colsb[2] = 64, cfg.rows[2] = static_cast<std::uint8_t>(k / 2);
  _tile_loadconfig(&cfg);
  std::mt19937 gen(static_cast<unsigned>(k));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Result r;
  for (int t = 0; t < trials; ++t) {
    alignas(64) std::uint16_t a[32] = {};
    alignas(64) std::uint32_t b[16 * 16] = {};
    alignas(64) float c[16], c0[16];
    for (int i = 0; i < k; ++i) a[i] = to_bf16(normal(gen));
    for (int i = 0; i < k / 2 * 16; ++i) b[i] = to_bf16(normal(gen)) | std::uint32_t{to_bf16(normal(gen))} << 16;
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
      for (int p = 0; p < k / 2; ++p) {
        const float a0 = from_bf16(a[2 * p]), a1 = from_bf16(a[2 * p + 1]);
        const float b0 = from_bf16(static_cast<std::uint16_t>(b[p * 16 + n])),
                    b1 = from_bf16(static_cast<std::uint16_t>(b[p * 16 + n] >> 16));
        exact += double{a0} * b0 + double{a1} * b1;
        largest = std::max({largest, std::fabs(double{a0} * b0), std::fabs(double{a1} * b1)});
        fmas = std::fma(a1, b1, std::fma(a0, b0, fmas));
      }
      ++r.values;
      r.differ_exact += c[n] != static_cast<float>(exact);
      r.differ_fmas += c[n] != fmas;
      r.worst_amx = std::max(r.worst_amx, std::fabs(c[n] - exact) / largest);
      r.worst_fmas = std::max(r.worst_fmas, std::fabs(fmas - exact) / largest);
    }
  }
  _tile_release();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int trials = 5000;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--trials" && i + 1 < argc) {
      trials = std::stoi(argv[++i]);
    } else {
      std::fprintf(stderr, "towerflow_bench_amx_rounding: unknown argument '%s'; the only option is --trials N\n", argv[i]);
      return 2;
    }
  }
  if (const std::string why = towerflow::cpu::amx_unavailable(); !why.empty()) {
    std::fprintf(stderr, "towerflow_bench_amx_rounding: AMX cannot run here: %s\n", why.c_str());
    return 1;
  }
  for (const int k : {2, 4, 8, 16, 32}) {
    const Result r = measure(k, trials);
    std::printf("{\"products\": %d, \"values\": %lld, \"differ_from_exact\": %.4f, \"differ_from_fmas\": %.4f, "
                "\"worst_amx\": \"2^%.1f\", \"worst_fmas\": \"2^%.1f\"}\n",
                k, r.values, double(r.differ_exact) / r.values, double(r.differ_fmas) / r.values,
                std::log2(r.worst_amx), std::log2(r.worst_fmas));
  }
}
