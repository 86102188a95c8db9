#pragma once
// Private to core/cuda: the counter-based hash behind dropout masks, the same on host and device.
// No CUDA header needed; under nvcc the functions are also device functions.

#include <cstdint>

#if defined(__CUDACC__)
#define TW_HOST_DEVICE __host__ __device__
#else
#define TW_HOST_DEVICE
#endif

namespace towerflow::gpu::detail {

// SplitMix64's finaliser over (seed, index): statistically sound for masks, stateless, so any
// element's decision can be recomputed anywhere (backward, tests, a CPU twin).
TW_HOST_DEVICE inline std::uint64_t mix64(std::uint64_t seed, std::uint64_t index) {
  std::uint64_t z = seed + 0x9E3779B97F4A7C15ULL * (index + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Keep with probability 1 - p: compare 24 uniform bits with p scaled to 2^24 (exact in float).
TW_HOST_DEVICE inline bool dropout_keep(std::uint64_t seed, std::uint64_t index, float p) {
  const std::uint32_t u = static_cast<std::uint32_t>(mix64(seed, index) >> 40);  // 24 bits
  return static_cast<float>(u) >= p * 16777216.0f;
}

}  // namespace towerflow::gpu::detail
