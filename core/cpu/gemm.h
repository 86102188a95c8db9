#pragma once
// Single-precision GEMM on the CPU, row-major.
//
// c[m, n] = alpha * op(a) * op(b) + beta * c, op(x) = x^T when trans_x.
// a is [m, k] (or [k, m] when trans_a) with leading dimension lda (the distance between rows);
// b is [k, n] (or [n, k] when trans_b) with ldb; c is [m, n] with ldc.
//
// Contract:
// - beta == 0 overwrites c without reading it (NaNs in c do not propagate), as BLAS does.
// - c must not overlap a or b. Work runs on ctx's threads; the call returns when it is done.
//   Results are bitwise identical for any number of threads.
// - m, n or k == 0 is allowed (c is scaled by beta, or left alone when m or n is 0).
// - Negative sizes, or a leading dimension smaller than its row length, throw
//   towerflow::InvalidArgument naming the argument.

#include "core/cpu/context.h"

namespace towerflow::cpu {

void gemm(const CpuContext& ctx, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
          const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc);

}  // namespace towerflow::cpu
