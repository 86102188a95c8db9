#pragma once
// The bf16 kernels of bf16.h through oneDNN (private to core/cpu): onednn.cc, or onednn_stub.cc in
// a build without oneDNN (built() false; the kernels are never called there).
//
// Contract: each kernel returns false, having written nothing, where oneDNN has only a reference
// implementation for the problem (or none); the caller then runs it emulated. Primitives are
// created once per problem, thread and thread count, and kept for the thread's life.

#include <string>

#include "core/cpu/context.h"
#include "core/cpu/conv.h"

namespace towerflow::cpu::onednn {

bool built();
std::string version();  // "2.6.3"
std::string isa();      // oneDNN's effective instruction set here, e.g. "avx512_core_bf16"
bool native_bf16();     // that set multiplies bf16 in hardware (AVX512-BF16, AMX)
bool jit_bf16();        // oneDNN has JIT bf16 kernels for it (AVX-512 and up, emulated below BF16)

bool conv2d_forward(const CpuContext& ctx, const Conv2dShape& s, const float* x, const float* w,
                    const float* bias_or_null, float* y);
bool conv2d_backward_input(const CpuContext& ctx, const Conv2dShape& s, const float* dy,
                           const float* w, float* dx);
bool conv2d_backward_weight(const CpuContext& ctx, const Conv2dShape& s, const float* x,
                            const float* dy, float* dw);
bool gemm(const CpuContext& ctx, bool trans_a, bool trans_b, int m, int n, int k, const float* a,
          int lda, const float* b, int ldb, float* c, int ldc);

}  // namespace towerflow::cpu::onednn
