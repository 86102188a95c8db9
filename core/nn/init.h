#pragma once
// Deterministic initialisation: a seeded generator whose output is the same on every platform
// (splitmix64, and Box-Muller for normals; std::normal_distribution is implementation-defined),
// and the initialisers the models use. Values are generated on the host and copied to the
// parameter's device, so a model built from one seed is identical on every device.

#include <cstdint>

#include "core/tensor/tensor.h"

namespace towerflow::nn {

class InitRng {
 public:
  explicit InitRng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next_u64();
  double uniform();  // [0, 1)
  double normal();   // standard normal

 private:
  std::uint64_t state_;
};

// w ~ N(0, 2 / fan_out), fan_out = w.dim(0) * (receptive field): Kaiming-normal, ReLU gain,
// mode fan_out (torchvision's ResNet convolutions).
void kaiming_normal_fan_out(const Tensor& w, InitRng& rng);
// t ~ U(-bound, bound).
void uniform_init(const Tensor& t, double bound, InitRng& rng);

}  // namespace towerflow::nn
