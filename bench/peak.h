#pragma once
// The machine's arithmetic peak, for benchmarks to put kernel rates beside: an FMA loop per x86
// instruction set the CPU and OS can run, VDPBF16PS (bf16 pairs into fp32) where the CPU has
// AVX512-BF16, and AMX's TDPBF16PS where the CPU has AMX-BF16 and Linux grants the tile state. Each loop is compiled for its own instruction set (target attributes) and listed
// only where it can run, so a portable build measures any machine. Note [The peak loop] in
// peak.cc says what the loops retire.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace towerflow::bench {

struct PeakLoop {
  std::string name;  // peak/<kind>/<isa>: peak/fp32_fma/avx512, peak/bf16_dot/avx512bf16,
                     // peak/bf16_amx/amx, ...
  float (*fn)(std::int64_t iters);
  double flop_per_iter;  // FLOPs of one iteration over all accumulators
};

// Iterations of one call of a PeakLoop's fn: about 100 us at 2 FMA ports.
constexpr std::int64_t kPeakIters = 1 << 14;

// The loops this machine can run, lowest instruction set first (empty off x86-64).
std::vector<PeakLoop> peak_loops();

// FLOP/s of `loop` run on `threads` threads at once for about `seconds` each.
double measure_peak_flops(const PeakLoop& loop, int threads, double seconds);

// STREAM's triad (a = b + s*c) over three arrays of `mib_per_array` MiB, each of `threads`
// threads on its own slice, repeated for about `seconds`: bytes/s by STREAM's count (reads and
// writes, no write-allocate), the best repetition's. towerflow_bench_kernels' mem/triad rows
// measure the same loop under Google Benchmark.
double measure_triad_bytes_per_s(int threads, std::size_t mib_per_array, double seconds);

// How AMX's TDPBF16PS rounds: `trials` instructions of one tile row on random normal operands,
// each adding `products` (2 to 32, even) products of bf16 to 16 fp32 accumulators, against the
// exactly rounded sum (in double, rounded once) and against two FMAs per pair (the emulation of
// core/cpu/bf16_amx.cc). No values (values 0) where the CPU has no AMX-BF16 or Linux refuses it.
struct AmxRounding {
  int products = 0;
  long long values = 0, differ_from_exact = 0, differ_from_fmas = 0;
  double worst_amx = 0, worst_fmas = 0;  // the largest |result - exact| over the largest term
};
AmxRounding measure_amx_rounding(int products, int trials);

}  // namespace towerflow::bench
