#include "core/cpu/gemm.h"

#include <Eigen/Core>
#include <algorithm>

#include "core/cpu/kernel_table.h"
#include "core/error.h"

namespace towerflow::cpu::TW_ISA {
namespace {

using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMap = Eigen::Map<const RowMajor, 0, Eigen::OuterStride<>>;
using MutMap = Eigen::Map<RowMajor, 0, Eigen::OuterStride<>>;

void check_ld(const char* name, int ld, int row_length, const char* rows_name) {
  if (ld < std::max(1, row_length))
    raise<InvalidArgument>("gemm: ", name, " = ", ld, " is smaller than the row length ",
                           row_length, " of ", rows_name,
                           "; pass the distance between consecutive rows in floats");
}

// c = alpha * op(a) op(b) + beta * c on the calling thread, arguments already checked.
void gemm_serial(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                 int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  if (m == 0 || n == 0) return;
  MutMap cm(c, m, n, Eigen::OuterStride<>(ldc));
  if (k == 0 || alpha == 0.0f) {
    if (beta == 0.0f)
      cm.setZero();
    else if (beta != 1.0f)
      cm *= beta;
    return;
  }
  // op(a) is [m, k]: stored [m, k] or, transposed, [k, m]; likewise op(b) [k, n].
  ConstMap am(a, trans_a ? k : m, trans_a ? m : k, Eigen::OuterStride<>(lda));
  ConstMap bm(b, trans_b ? n : k, trans_b ? k : n, Eigen::OuterStride<>(ldb));
  // beta == 0 must not read c (BLAS semantics: NaNs already in c do not propagate).
  auto run = [&](const auto& ao, const auto& bo) {
    if (beta == 0.0f) {
      cm.noalias() = alpha * (ao * bo);
    } else {
      if (beta != 1.0f) cm *= beta;
      cm.noalias() += alpha * (ao * bo);
    }
  };
  if (trans_a && trans_b)
    run(am.transpose(), bm.transpose());
  else if (trans_a)
    run(am.transpose(), bm);
  else if (trans_b)
    run(am, bm.transpose());
  else
    run(am, bm);
}

}  // namespace

void gemm(const CpuContext& ctx, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
          const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  if (m < 0 || n < 0 || k < 0)
    raise<InvalidArgument>("gemm: sizes must be non-negative, got m = ", m, ", n = ", n,
                           ", k = ", k);
  check_ld("lda", lda, trans_a ? m : k, trans_a ? "a^T (stored [k, m])" : "a (stored [m, k])");
  check_ld("ldb", ldb, trans_b ? k : n, trans_b ? "b^T (stored [n, k])" : "b (stored [k, n])");
  check_ld("ldc", ldc, n, "c ([m, n])");
  if (m == 0 || n == 0) return;

  // Split c into row blocks (or column blocks when it is wide and short), one per thread; each
  // block is an independent serial GEMM. The result must not depend on the thread count, so
  // block edges fall where Eigen's own tiling has an edge anyway and every element goes through
  // the same micro-kernel path as without the split: c's rows are Eigen's internal columns
  // (row-major c is computed as c^T = b^T a^T), tiled by 4, so row blocks are multiples of 32;
  // c's columns are Eigen's internal rows, tiled by 3 SIMD packets (12, 24 or 48 floats for SSE,
  // AVX, AVX-512), so column blocks are multiples of 48. The tests check the equality. Each
  // block does at least ~1 MFLOP so that small products stay on the calling thread.
  const double flops = 2.0 * m * n * std::max(k, 1);
  const std::int64_t max_parts = std::max<std::int64_t>(1, static_cast<std::int64_t>(flops / 1e6));
  const bool split_rows = m >= n || n < 96;
  const int extent = split_rows ? m : n;
  const int unit = split_rows ? 32 : 48;
  const std::int64_t units = (extent + unit - 1) / unit;
  const std::int64_t parts = std::min<std::int64_t>({units, max_parts, ctx.threads()});
  if (parts <= 1) {
    gemm_serial(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  ctx.parallel_for(parts, 1, [&](std::int64_t p0, std::int64_t p1) {
    for (std::int64_t p = p0; p < p1; ++p) {
      const int begin = static_cast<int>(units * p / parts * unit);
      const int end = static_cast<int>(std::min<std::int64_t>(extent, units * (p + 1) / parts * unit));
      if (begin >= end) continue;
      if (split_rows) {
        const float* ab = trans_a ? a + begin : a + static_cast<std::int64_t>(begin) * lda;
        gemm_serial(trans_a, trans_b, end - begin, n, k, alpha, ab, lda, b, ldb, beta,
                            c + static_cast<std::int64_t>(begin) * ldc, ldc);
      } else {
        const float* bb = trans_b ? b + static_cast<std::int64_t>(begin) * ldb : b + begin;
        gemm_serial(trans_a, trans_b, m, end - begin, k, alpha, a, lda, bb, ldb, beta,
                            c + begin, ldc);
      }
    }
  });
}

}  // namespace towerflow::cpu::TW_ISA
