#pragma once
// Helpers shared by the CPU kernel tests: random data and error measures against double
// references.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace towerflow::cpu::testing {

inline std::vector<float> random_vector(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// max |got - want| / (|want| + rms(want)): relative error that does not blow up near zero.
struct Comparison {
  double max_error = 0.0;
  std::size_t worst = 0;
  double got = 0.0, want = 0.0;
  std::string describe() const {
    std::ostringstream os;
    os << "max relative error " << max_error << " at index " << worst << " (got " << got
       << ", want " << want << ")";
    return os.str();
  }
};

template <typename Got, typename Want>
Comparison compare(const std::vector<Got>& got, const std::vector<Want>& want) {
  Comparison c;
  if (got.size() != want.size()) {
    c.max_error = INFINITY;
    return c;
  }
  double sq = 0.0;
  for (auto w : want) sq += static_cast<double>(w) * w;
  const double rms = want.empty() ? 0.0 : std::sqrt(sq / want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    const double err = std::abs(g - w) / (std::abs(w) + rms + 1e-30);
    if (!(err <= c.max_error)) {  // also catches NaN
      c.max_error = std::isnan(err) ? INFINITY : err;
      c.worst = i;
      c.got = g;
      c.want = w;
      if (std::isnan(err)) break;
    }
  }
  return c;
}

inline double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

}  // namespace towerflow::cpu::testing
