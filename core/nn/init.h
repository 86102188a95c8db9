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
// Dirac initialisation of a convolution's first `filters` output channels (w [out, in, kh, kw],
// OIHW): filter o passes input channel o through unchanged, w[o, o, kh/2, kw/2] = 1 and every other
// weight of those filters 0 (torch.nn.init.dirac_ applied to w[:filters]); the other filters keep
// their values. InvalidArgument unless w is 4-D and 0 <= filters <= min(out, in).
void dirac_init(const Tensor& w, int filters);

}  // namespace towerflow::nn
