#include "core/tensor/precision.h"

#include <cmath>
#include <cstring>

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

std::string to_string(Precision p) {
  switch (p) {
    case Precision::Bf16: return "bf16";
    case Precision::Fp16: return "fp16";
    default: return "fp32";
  }
}

Precision current_precision() { return t_precision; }

PrecisionScope::PrecisionScope(Precision p) : previous_(t_precision) { t_precision = p; }
PrecisionScope::~PrecisionScope() { t_precision = previous_; }

float round_to_bf16(float x) {
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  if ((bits & 0x7f800000u) == 0x7f800000u) {
    // Infinity: its low bits are zero already. NaN: truncated, with the quiet bit set so that it
    // stays a NaN whatever payload it had.
    if (bits & 0x007fffffu) bits = (bits & 0xffff0000u) | 0x00400000u;
  } else {
    bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest, ties to even
    bits &= 0xffff0000u;
  }
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

float round_to_fp16(float x) {
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const std::uint32_t sign = bits & 0x80000000u;
  const std::uint32_t abs = bits & 0x7fffffffu;
  float out;
  if (abs >= 0x7f800000u) return x;  // infinity, NaN
  // The largest half is 65504; values from 65520 (halfway to 2^16) up round to infinity.
  if (abs >= 0x477ff000u) {
    bits = sign | 0x7f800000u;
    std::memcpy(&out, &bits, sizeof out);
    return out;
  }
  const int exponent = static_cast<int>(abs >> 23) - 127;
  // Halves keep 10 fraction bits down to 2^-14; below, subnormals have a fixed step of 2^-24.
  // Round to a multiple of that step: drop (13 + extra) low bits of the float's significand.
  int drop = 13;
  if (exponent < -14) drop += -14 - exponent;
  if (drop > 24) {  // below half of 2^-24: zero (with the sign)
    bits = sign;
    std::memcpy(&out, &bits, sizeof out);
    return out;
  }
  std::uint64_t significand = (abs & 0x007fffffu) | (exponent >= -126 ? 0x00800000u : 0u);
  const std::uint64_t half = 1ull << (drop - 1), mask = (1ull << drop) - 1;
  const std::uint64_t low = significand & mask;
  significand &= ~mask;
  if (low > half || (low == half && (significand >> drop) & 1u)) significand += 1ull << drop;
  // Back to a float: significand * 2^(exponent - 23), exact (it has at most 11 significant bits).
  out = std::ldexp(static_cast<float>(significand), exponent - 23);
  return sign ? -out : out;
}

}  // namespace towerflow
