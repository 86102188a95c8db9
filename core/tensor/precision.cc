#include "core/tensor/precision.h"

#include <cmath>
#include <cstring>

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

float round_to_fp16(float x) {
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const std::uint32_t sign = bits & 0x80000000u;
  std::uint32_t abs = bits & 0x7fffffffu;
  if (abs >= 0x7f800000u) return x;  // infinity, NaN
  if (abs < 0x38800000u) {
    // Below 2^-14 halves are subnormal, multiples of 2^-24: the float sum with 0.5 (whose ulp is
    // 2^-24) rounds to that grid, to nearest even, and subtracting 0.5 again is exact.
    const float r = (std::fabs(x) + 0.5f) - 0.5f;
    return std::copysign(r, x);
  }
  // Normal halves keep 10 of the float's 23 fraction bits: round the other 13 away, to nearest
  // even (a carry into the exponent is right). From 65520 up the result is 2^16: infinity.
  abs += 0xfffu + ((abs >> 13) & 1u);
  abs &= 0xffffe000u;
  if (abs >= 0x47800000u) abs = 0x7f800000u;
  bits = sign | abs;
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

}  // namespace towerflow
