#pragma once
// Helpers shared by the op benchmarks.

#include <cstddef>
#include <random>
#include <vector>

namespace towerflow::bench {

// n standard-normal floats from a fixed seed: the same inputs on every run and machine.
inline std::vector<float> random_vector(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

}  // namespace towerflow::bench
