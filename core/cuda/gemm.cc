// Row-major GEMM through cuBLAS (column-major): C = op(A) op(B) is computed as
// C^T = op(B)^T op(A)^T, which cuBLAS sees as its own column-major product with A and B swapped.

#include <algorithm>

#include "core/cuda/context_impl.h"
#include "core/cuda/ops.h"

namespace towerflow::gpu {

void gemm(const GpuContext& ctx, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
          const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  if (m < 0 || n < 0 || k < 0)
    raise<InvalidArgument>("gemm: sizes must not be negative (m ", m, ", n ", n, ", k ", k, ")");
  const int a_row = trans_a ? m : k, b_row = trans_b ? k : n;
  if (lda < std::max(1, a_row))
    raise<InvalidArgument>("gemm: lda ", lda, " is smaller than a's row length ", a_row);
  if (ldb < std::max(1, b_row))
    raise<InvalidArgument>("gemm: ldb ", ldb, " is smaller than b's row length ", b_row);
  if (ldc < std::max(1, n))
    raise<InvalidArgument>("gemm: ldc ", ldc, " is smaller than c's row length ", n);
  if (m == 0 || n == 0) return;
  GpuContext::Impl& mm = ctx.impl();
  auto scope = mm.scope();
  TW_CUBLAS_CHECK(cublasSgemm(mm.cublas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                              trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b, ldb, a, lda,
                              &beta, c, ldc));
}

}  // namespace towerflow::gpu
