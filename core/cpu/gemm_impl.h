#pragma once
// Private: the single-threaded GEMM that the parallel gemm() and the convolution kernels share.

namespace towerflow::cpu::detail {

// Same contract as towerflow::cpu::gemm, on the calling thread only, without argument checks.
void gemm_serial(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                 int lda, const float* b, int ldb, float beta, float* c, int ldc);

}  // namespace towerflow::cpu::detail
