// A build without oneDNN (-DTOWERFLOW_ONEDNN=OFF, or libdnnl-dev not installed): bf16 runs
// emulated and fp32 on towerflow's kernels (nothing calls these kernels, since built() is false).
#include "core/cpu/onednn_impl.h"

namespace towerflow::cpu::onednn {

bool built() { return false; }
std::string version() { return ""; }
std::string isa() { return ""; }
bool native_bf16() { return false; }
bool jit_bf16() { return false; }

bool conv2d_forward(int, const Conv2dShape&, const float*, const float*, const float*,
                    float*, Operands) {
  return false;
}
bool conv2d_backward_input(int, const Conv2dShape&, const float*, const float*,
                           float*, Operands) {
  return false;
}
bool conv2d_backward_weight(int, const Conv2dShape&, const float*, const float*,
                            float*, Operands) {
  return false;
}
bool conv2d_forward(int, const Conv2dShape&, const std::uint16_t*, const float*, const float*,
                    float*) {
  return false;
}
bool conv2d_forward(int, const Conv2dShape&, const float*, const float*, const float*,
                    std::uint16_t*) {
  return false;
}
bool conv2d_forward(int, const Conv2dShape&, const std::uint16_t*, const float*, const float*,
                    std::uint16_t*) {
  return false;
}
bool conv2d_backward_weight(int, const Conv2dShape&, const std::uint16_t*, const float*, float*) {
  return false;
}
bool gemm(int, bool, bool, int, int, int, const float*, int, const float*, int,
          float*, int, Operands) {
  return false;
}

}  // namespace towerflow::cpu::onednn
