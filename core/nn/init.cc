#include "core/nn/init.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "core/error.h"

namespace towerflow::nn {

std::uint64_t InitRng::next_u64() {
  std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double InitRng::uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

double InitRng::normal() {
  // Box-Muller with one value per call: simple, and the stream stays one draw pair per value.
  const double u1 = 1.0 - uniform();  // (0, 1]
  const double u2 = uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

void kaiming_normal_fan_out(const Tensor& w, InitRng& rng) {
  const std::int64_t fan_out = w.numel() / (w.ndim() > 1 ? w.dim(1) : 1);
  const double std = std::sqrt(2.0 / static_cast<double>(fan_out));
  std::vector<float> v(static_cast<std::size_t>(w.numel()));
  for (auto& x : v) x = static_cast<float>(std * rng.normal());
  Tensor(w).copy_from_host(std::span<const float>(v));
}

void uniform_init(const Tensor& t, double bound, InitRng& rng) {
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  for (auto& x : v) x = static_cast<float>((2.0 * rng.uniform() - 1.0) * bound);
  Tensor(t).copy_from_host(std::span<const float>(v));
}

void dirac_init(const Tensor& w, int filters) {
  if (w.ndim() != 4 || filters < 0 || filters > std::min(w.dim(0), w.dim(1)))
    raise<InvalidArgument>("dirac_init: ", filters, " filters of a weight of shape ",
                           shape_str(w.shape()),
                           "; the weight must be [out, in, kh, kw] and filters at most min(out, in)");
  std::vector<float> v = w.to_host();
  const std::int64_t in = w.dim(1), kh = w.dim(2), kw = w.dim(3);
  const std::int64_t per_filter = in * kh * kw;
  for (std::int64_t o = 0; o < filters; ++o) {
    std::fill_n(v.begin() + o * per_filter, per_filter, 0.0f);
    v[static_cast<std::size_t>(o * per_filter + (o * kh + kh / 2) * kw + kw / 2)] = 1.0f;
  }
  Tensor(w).copy_from_host(std::span<const float>(v));
}

}  // namespace towerflow::nn
