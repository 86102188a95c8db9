#pragma once
// Convolutions and GEMM through oneDNN (private to core/cpu): onednn.cc, or onednn_stub.cc in a
// build without oneDNN (built() false; the kernels are never called there). Operands are fp32 in
// memory, read as bf16 (bf16.h's kernels) or as fp32 (a candidate of kernel_choice.h); outputs and
// accumulation are fp32.
//
// Contract: each kernel runs on `threads` OpenMP threads (the calling one among them), or on a
// context's threads, and returns
// false, having written nothing, where oneDNN has only a reference implementation for the
// problem (or none); the caller then runs another kernel. Primitives are
// created once per problem, operand type, thread and thread count, and kept for the thread's life.

#include <cstdint>
#include <string>

#include "core/cpu/context.h"
#include "core/cpu/conv.h"

namespace towerflow::cpu::onednn {

bool built();
std::string version();  // "2.6.3"
std::string isa();      // oneDNN's effective instruction set here, e.g. "avx512_core_bf16"
bool native_bf16();     // that set multiplies bf16 in hardware (AVX512-BF16, AMX)
bool jit_bf16();        // oneDNN has JIT bf16 kernels for it (AVX-512 and up, emulated below BF16)

// How the kernels read their operands.
enum class Operands { kBf16, kFp32 };

bool conv2d_forward(int threads, const Conv2dShape& s, const float* x, const float* w,
                    const float* bias_or_null, float* y, Operands op = Operands::kBf16);
bool conv2d_backward_input(int threads, const Conv2dShape& s, const float* dy,
                           const float* w, float* dx, Operands op = Operands::kBf16);
bool conv2d_backward_weight(int threads, const Conv2dShape& s, const float* x,
                            const float* dy, float* dw, Operands op = Operands::kBf16);
// c[m, n] = op(a) op(b) (alpha 1, beta 0), row-major.
bool gemm(int threads, bool trans_a, bool trans_b, int m, int n, int k, const float* a,
          int lda, const float* b, int ldb, float* c, int ldc, Operands op = Operands::kBf16);

// The bf16 forward and weight gradient with x stored as bf16 bits (bf16.h's bf16 inputs), read
// as they are: the problems of the calls above with an fp32 x, less its conversion.
bool conv2d_forward(int threads, const Conv2dShape& s, const std::uint16_t* x, const float* w,
                    const float* bias_or_null, float* y);
bool conv2d_backward_weight(int threads, const Conv2dShape& s, const std::uint16_t* x,
                            const float* dy, float* dw);
// The bf16 forward with y stored as bf16 bits (bf16.h's bf16 outputs), rounded by oneDNN from
// its fp32 sums as it stores them, x as floats or bf16 bits.
bool conv2d_forward(int threads, const Conv2dShape& s, const float* x, const float* w,
                    const float* bias_or_null, std::uint16_t* y);
bool conv2d_forward(int threads, const Conv2dShape& s, const std::uint16_t* x, const float* w,
                    const float* bias_or_null, std::uint16_t* y);

// The same kernels on ctx's threads (onednn_context.cc): each thread runs the kernel above on one
// OpenMP thread, itself, over a slice of the problem (Note [oneDNN on the context's threads]).
// False, as above, where oneDNN declines the problem.
bool conv2d_forward(const CpuContext& ctx, const Conv2dShape& s, const float* x, const float* w,
                    const float* bias_or_null, float* y, Operands op = Operands::kBf16);
bool conv2d_backward_input(const CpuContext& ctx, const Conv2dShape& s, const float* dy,
                           const float* w, float* dx, Operands op = Operands::kBf16);
bool conv2d_backward_weight(const CpuContext& ctx, const Conv2dShape& s, const float* x,
                            const float* dy, float* dw, Operands op = Operands::kBf16);
bool gemm(const CpuContext& ctx, bool trans_a, bool trans_b, int m, int n, int k, const float* a,
          int lda, const float* b, int ldb, float* c, int ldc, Operands op = Operands::kBf16);
bool conv2d_forward(const CpuContext& ctx, const Conv2dShape& s, const std::uint16_t* x,
                    const float* w, const float* bias_or_null, float* y);
bool conv2d_backward_weight(const CpuContext& ctx, const Conv2dShape& s, const std::uint16_t* x,
                            const float* dy, float* dw);
bool conv2d_forward(const CpuContext& ctx, const Conv2dShape& s, const float* x, const float* w,
                    const float* bias_or_null, std::uint16_t* y);
bool conv2d_forward(const CpuContext& ctx, const Conv2dShape& s, const std::uint16_t* x,
                    const float* w, const float* bias_or_null, std::uint16_t* y);

}  // namespace towerflow::cpu::onednn
