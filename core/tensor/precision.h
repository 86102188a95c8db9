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
// - Fp16: the same with operands rounded to IEEE half precision (to nearest even; beyond 65504
//   they become infinite, below 2^-24 zero). Its narrow range needs loss scaling, which
//   tower::Trainer applies under fp16 (tower/loss_scale.h).
// - How: where the device's backend has kernels that read bf16 or fp16 themselves
//   (supports(OpKind::kBf16Products / kFp16Products): oneDNN's bf16 kernels on CPUs with
//   AVX512-BF16 or AMX, core/cpu/bf16.h; cuDNN and cuBLAS on GPU tensor cores, core/cuda/ops.h),
//   they run on the fp32 tensors. Elsewhere the operands are rounded by the backend
//   (Backend::round_to_bf16 / round_to_fp16) and the float32 kernels run on them, which gives
//   exactly the same products with float32 accumulation: the emulated path, correct and slower
//   than fp32 (the rounding is an extra pass over the operands). fp16 on CPUs is always emulated.

#include <cstdint>
#include <string>
#include <string_view>

namespace towerflow {

enum class Precision { Fp32, Bf16, Fp16 };

// "fp32" | "bf16" | "fp16". InvalidArgument naming the value and the choices.
Precision parse_precision(std::string_view text);
// Inline, so that backends (core/tensor/backend_impl.h) name a precision without linking this
// library.
inline std::string to_string(Precision p) {
  switch (p) {
    case Precision::Bf16: return "bf16";
    case Precision::Fp16: return "fp16";
    default: return "fp32";
  }
}

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
// x rounded to the nearest IEEE binary16 value (ties to even, subnormals kept, beyond the largest
// finite half infinity), as a float; NaN stays NaN.
float round_to_fp16(float x);
// y[i] = round_to_bf16(x[i]) / round_to_fp16(x[i]) for i < n (y == x allowed), without branches
// so that the loops vectorise: what the CPU backend's Backend::round_to_* run on each thread's part.
void round_to_bf16(std::int64_t n, const float* x, float* y);
void round_to_fp16(std::int64_t n, const float* x, float* y);

}  // namespace towerflow
