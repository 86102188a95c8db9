#include "core/tensor/precision.h"

#include <cstring>

#include "core/error.h"

namespace towerflow {

namespace {
thread_local Precision t_precision = Precision::Fp32;
}  // namespace

Precision parse_precision(std::string_view text) {
  if (text == "fp32") return Precision::Fp32;
  if (text == "bf16") return Precision::Bf16;
  raise<InvalidArgument>("precision '", text, "' is not known; use fp32 or bf16");
}

std::string to_string(Precision p) { return p == Precision::Bf16 ? "bf16" : "fp32"; }

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

}  // namespace towerflow
