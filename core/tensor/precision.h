#pragma once
// Precision: the arithmetic a training step's matrix work uses, as an autocast-style policy.
//
//   PrecisionScope bf16(Precision::Bf16);   // on this thread, until the scope ends
//   Tensor y = conv2d(x, w, b);             // on bf16 operands, accumulated in fp32
//
// Contract:
// - Fp32 (the default): every op in float32.
// - Bf16: convolutions and matrix products (conv2d, linear, matmul; forward and both backward
//   products) take their operands rounded to bfloat16 (round to nearest even; NaN and infinity
//   kept) and accumulate in float32; their outputs are float32. Everything else (bias, batch
//   norm and its statistics, softmax and the loss, the gradient reduction, the optimizer, the
//   master weights and so the checkpoints) stays float32. The operands kept for backward are the
//   rounded ones. The gradient passes a rounding unchanged (as through autocast's casts).
// - The policy is per thread and captured when an op records its backward, so backward uses the
//   forward's precision whatever thread runs it. tower::Trainer sets it on every tower thread
//   (TrainerOptions::precision).
// - How: the operands are rounded by the device's backend (Backend::round_to_bf16) and the
//   float32 kernels run on them, which gives exactly bf16 products with float32 accumulation.
//   On a CPU without bf16 instructions this is the emulated path: correct, and slower than fp32
//   (the rounding is an extra pass over the operands). Kernels that read bf16 directly
//   (AVX512-BF16, AMX, tensor cores) are not built yet.

#include <cstdint>
#include <string>
#include <string_view>

namespace towerflow {

enum class Precision { Fp32, Bf16 };

// "fp32" | "bf16". InvalidArgument naming the value and the choices.
Precision parse_precision(std::string_view text);
std::string to_string(Precision p);

// The calling thread's precision (Fp32 outside any scope).
Precision current_precision();

class PrecisionScope {
 public:
  explicit PrecisionScope(Precision p);
  ~PrecisionScope();
  PrecisionScope(const PrecisionScope&) = delete;
  PrecisionScope& operator=(const PrecisionScope&) = delete;

 private:
  Precision previous_;
};

// x rounded to the nearest bfloat16 (ties to even), as a float; NaN stays NaN, infinities stay.
float round_to_bf16(float x);

}  // namespace towerflow
