// Row-major GEMM through cuBLAS (column-major): C = op(A) op(B) is computed as
// C^T = op(B)^T op(A)^T, which cuBLAS sees as its own column-major product with A and B swapped.
// gemm_half converts the operands to bf16 or fp16 and multiplies them with cublasGemmEx on
// tensor cores, accumulating and writing C in float32 (CUBLAS_COMPUTE_32F).

#include <algorithm>

#include "core/cuda/context_impl.h"
#include "core/cuda/ops.h"

namespace towerflow::gpu {

namespace {

void check_gemm(const char* what, bool trans_a, bool trans_b, int m, int n, int k, int lda,
                int ldb, int ldc) {
  if (m < 0 || n < 0 || k < 0)
    raise<InvalidArgument>(what, ": sizes must not be negative (m ", m, ", n ", n, ", k ", k, ")");
  const int a_row = trans_a ? m : k, b_row = trans_b ? k : n;
  if (lda < std::max(1, a_row))
    raise<InvalidArgument>(what, ": lda ", lda, " is smaller than a's row length ", a_row);
  if (ldb < std::max(1, b_row))
    raise<InvalidArgument>(what, ": ldb ", ldb, " is smaller than b's row length ", b_row);
  if (ldc < std::max(1, n))
    raise<InvalidArgument>(what, ": ldc ", ldc, " is smaller than c's row length ", n);
}

// The elements a row-major operand of `rows` rows of `row_length` with leading dimension ld spans.
std::int64_t span_of(int rows, int row_length, int ld) {
  if (rows == 0 || row_length == 0) return 0;
  return static_cast<std::int64_t>(rows - 1) * ld + row_length;
}

}  // namespace

void gemm(const GpuContext& ctx, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
          const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  check_gemm("gemm", trans_a, trans_b, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  GpuContext::Impl& mm = ctx.impl();
  auto scope = mm.scope();
  TW_CUBLAS_CHECK(cublasSgemm(mm.cublas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                              trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b, ldb, a, lda,
                              &beta, c, ldc));
}

const char* to_string(Half t) { return t == Half::Bf16 ? "bf16" : "fp16"; }

bool half_products_supported(const GpuContext& ctx, Half t) {
  auto scope = ctx.impl().scope();
  int major = 0;
  TW_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ctx.ordinal()));
  // bf16 tensor cores arrived with Ampere (8.0), fp16 ones with Volta (7.0).
  return major >= (t == Half::Bf16 ? 8 : 7);
}

void gemm_half(const GpuContext& ctx, Half t, bool trans_a, bool trans_b, int m, int n, int k,
               const float* a, int lda, const float* b, int ldb, float* c, int ldc) {
  check_gemm("gemm_half", trans_a, trans_b, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  GpuContext::Impl& mm = ctx.impl();
  auto scope = mm.scope();
  const std::int64_t a_count = span_of(trans_a ? k : m, trans_a ? m : k, lda);
  const std::int64_t b_count = span_of(trans_b ? n : k, trans_b ? k : n, ldb);
  DeviceBuffer ah(ctx, static_cast<std::size_t>(std::max<std::int64_t>(a_count, 1)) * 2);
  DeviceBuffer bh(ctx, static_cast<std::size_t>(std::max<std::int64_t>(b_count, 1)) * 2);
  float_to_half(ctx, t, a_count, a, ah.data());
  float_to_half(ctx, t, b_count, b, bh.data());
  const cudaDataType type = t == Half::Bf16 ? CUDA_R_16BF : CUDA_R_16F;
  const float one = 1.0f, zero = 0.0f;
  TW_CUBLAS_CHECK(cublasGemmEx(mm.cublas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                               trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &one, bh.data(), type,
                               ldb, ah.data(), type, lda, &zero, c, CUDA_R_32F, ldc,
                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace towerflow::gpu
