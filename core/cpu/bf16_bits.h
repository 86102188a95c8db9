#pragma once
// The rounding of a float to bfloat16 as bits (private to core/cpu): bf16.cc's rounding and the
// operand packing of bf16_pairs.cc share it, so that both round alike.

#include <cstdint>

namespace towerflow::cpu::detail {

// The bits of a float rounded to bf16 (in the top 16 bits, the low 16 zero): to nearest, ties to
// even (a carry into the exponent is right, and the largest floats round to infinity);
// infinities pass unchanged; a NaN is truncated with the quiet bit set, so that it stays a NaN
// whatever payload it had. Both results are computed and one is selected, so that loops over it
// vectorise.
inline std::uint32_t bf16_bits(std::uint32_t bits) {
  const std::uint32_t nearest = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
  const std::uint32_t quiet_nan = (bits & 0xffff0000u) | 0x00400000u;
  return (bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan : nearest;
}

}  // namespace towerflow::cpu::detail
