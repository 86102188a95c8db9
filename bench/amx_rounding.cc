// How AMX's tdpbf16ps rounds (Note [bf16 AMX kernels] in core/cpu/bf16_amx.cc): for 2 to 32
// products per instruction, one JSON line with the share of results that differ from the exactly
// rounded sum and from the emulation's two FMAs per pair, and the largest difference from the
// exact sum as a fraction of the largest term (bench/peak.h, measure_amx_rounding). It needs a
// CPU with AMX-BF16.
//
//   towerflow_bench_amx_rounding [--trials N]
#include <cmath>
#include <cstdio>
#include <string>

#include "bench/peak.h"
#include "core/cpu/isa.h"

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
    const towerflow::bench::AmxRounding r = towerflow::bench::measure_amx_rounding(k, trials);
    std::printf("{\"products\": %d, \"values\": %lld, \"differ_from_exact\": %.4f, \"differ_from_fmas\": %.4f, "
                "\"worst_amx\": \"2^%.1f\", \"worst_fmas\": \"2^%.1f\"}\n",
                k, r.values, double(r.differ_from_exact) / r.values, double(r.differ_from_fmas) / r.values,
                std::log2(r.worst_amx), std::log2(r.worst_fmas));
  }
}
