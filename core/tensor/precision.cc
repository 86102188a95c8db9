#include "core/tensor/precision.h"

#include <bit>
#include <cmath>
#include <cstdint>

#include "core/cpu/bf16.h"
#include "core/error.h"

namespace towerflow {

namespace {
thread_local Precision t_precision = Precision::Fp32;
}  // namespace

Precision parse_precision(std::string_view text) {
  if (text == "fp32") return Precision::Fp32;
  if (text == "bf16") return Precision::Bf16;
  if (text == "fp16") return Precision::Fp16;
  raise<InvalidArgument>("precision '", text, "' is not known; use fp32, bf16 or fp16");
}

Precision current_precision() { return t_precision; }

PrecisionScope::PrecisionScope(Precision p) : previous_(t_precision) { t_precision = p; }
PrecisionScope::~PrecisionScope() { t_precision = previous_; }

float round_to_bf16(float x) { return cpu::round_to_bf16(x); }

void round_to_bf16(std::int64_t n, const float* x, float* y) { cpu::round_to_bf16(n, x, y); }

namespace {

// The bits of x rounded to IEEE half, as a float. Every case is computed and one selected, so
// that loops over it vectorise:
// - below 2^-14 halves are subnormal, multiples of 2^-24: the float sum with 0.5 (whose ulp is
//   2^-24) rounds |x| to that grid, to nearest even, and subtracting 0.5 again is exact;
// - normal halves keep 10 of the float's 23 fraction bits: the other 13 are rounded away, to
//   nearest even (a carry into the exponent is right); from 65520 up the result is 2^16, which
//   becomes infinity;
// - infinities and NaN pass unchanged.
inline float fp16_value(float x) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  const std::uint32_t sign = bits & 0x80000000u, abs = bits & 0x7fffffffu;
  const std::uint32_t subnormal = std::bit_cast<std::uint32_t>((std::fabs(x) + 0.5f) - 0.5f);
  std::uint32_t normal = (abs + 0xfffu + ((abs >> 13) & 1u)) & 0xffffe000u;
  // Selected with masks rather than ?: so that the compiler keeps every case's arithmetic
  // (it would move the float sum into a branch, which then stops vectorisation).
  const std::uint32_t overflow = 0u - std::uint32_t(normal >= 0x47800000u);
  normal = (normal & ~overflow) | (0x7f800000u & overflow);
  const std::uint32_t special = 0u - std::uint32_t(abs >= 0x7f800000u);
  const std::uint32_t tiny = 0u - std::uint32_t(abs < 0x38800000u);
  const std::uint32_t finite = sign | (subnormal & tiny) | (normal & ~tiny);
  return std::bit_cast<float>((bits & special) | (finite & ~special));
}

}  // namespace

float round_to_fp16(float x) { return fp16_value(x); }

void round_to_fp16(std::int64_t n, const float* x, float* y) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = fp16_value(x[i]);
}

}  // namespace towerflow
