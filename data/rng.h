#pragma once
// Counter-based random numbers: every random decision in data/ is a pure function of
// (seed, stream, epoch, index), so results never depend on which thread draws them, on how many
// threads there are, or on the order in which samples are produced.

#include <cstdint>

namespace towerflow::data {

// SplitMix64's finaliser: a bijective 64-bit mix with full avalanche.
constexpr std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Streams keep the independent uses of one seed apart (shuffling, augmentation, generation).
enum class RngStream : std::uint64_t { Shuffle = 1, Augment = 2, BuiltinTrain = 3, BuiltinTest = 4, Holdout = 5, Mix = 6 };

// A small generator (SplitMix64 sequence) keyed by (seed, stream, a, b). Not for cryptography.
class SampleRng {
 public:
  constexpr SampleRng(std::uint64_t seed, RngStream stream, std::uint64_t a, std::uint64_t b = 0)
      : state_(mix64(mix64(mix64(seed ^ (static_cast<std::uint64_t>(stream) << 56)) + a) + b)) {}

  constexpr std::uint64_t next() {
    state_ += 0x9E3779B97F4A7C15ull;
    std::uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform integer in [0, n), n > 0 (Lemire's multiply-shift; the bias is below 2^-32 for the
  // small ranges used here).
  constexpr std::uint32_t below(std::uint32_t n) {
    return static_cast<std::uint32_t>(((next() >> 32) * static_cast<std::uint64_t>(n)) >> 32);
  }
  // Uniform in [0, 1).
  constexpr float uniform() { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }
  constexpr bool coin() { return (next() >> 63) != 0; }

 private:
  std::uint64_t state_;
};

}  // namespace towerflow::data
