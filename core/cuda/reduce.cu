// Reductions: column sums (the bias gradient), sum and sum of squares. Every reduction runs in a
// fixed shape (fixed grid, partials summed in order), so results are bit-for-bit repeatable from
// run to run — atomics would make gradients differ between identical steps.

#include "core/cuda/context_impl.h"
#include "core/cuda/kernels_impl.h"
#include "core/cuda/ops.h"

namespace towerflow::gpu {

namespace {

constexpr int kColumns = 32;     // columns per block (one per lane)
constexpr int kRowLanes = 8;     // threads walking rows per column
constexpr int kRowsPerChunk = 512;
constexpr int kMaxChunks = 1024;
constexpr int kSumBlocks = 256;
constexpr int kSumThreads = 256;

// partial[chunk, col] = sum of x[r, col] over the chunk's rows.
__global__ void column_partials(std::int64_t rows, int c, std::int64_t rows_per_chunk,
                                const float* x, double* partial) {
  __shared__ double acc[kRowLanes][kColumns];
  const int col = blockIdx.x * kColumns + threadIdx.x;
  const std::int64_t begin = blockIdx.y * rows_per_chunk;
  const std::int64_t end = begin + rows_per_chunk < rows ? begin + rows_per_chunk : rows;
  double s = 0.0;
  if (col < c)
    for (std::int64_t r = begin + threadIdx.y; r < end; r += kRowLanes) s += x[r * c + col];
  acc[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < c) {
    for (int k = 1; k < kRowLanes; ++k) s += acc[k][threadIdx.x];
    partial[static_cast<std::int64_t>(blockIdx.y) * c + col] = s;
  }
}

__global__ void column_finish(int chunks, int c, const double* partial, float* out) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= c) return;
  double s = 0.0;
  for (int k = 0; k < chunks; ++k) s += partial[static_cast<std::int64_t>(k) * c + col];
  out[col] = static_cast<float>(s);
}

template <bool kSquares>
__global__ void sum_partials(std::int64_t n, const float* x, double* partial) {
  __shared__ double acc[kSumThreads];
  double s = 0.0;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(blockDim.x) * gridDim.x) {
    const double v = x[i];
    s += kSquares ? v * v : v;
  }
  acc[threadIdx.x] = s;
  __syncthreads();
  for (int stride = kSumThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) acc[threadIdx.x] += acc[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = acc[0];
}

__global__ void sum_finish(int parts, const double* partial, float multiplier, float* out) {
  __shared__ double acc[kSumThreads];
  double s = 0.0;
  for (int i = threadIdx.x; i < parts; i += blockDim.x) s += partial[i];
  acc[threadIdx.x] = s;
  __syncthreads();
  for (int stride = kSumThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) acc[threadIdx.x] += acc[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = static_cast<float>(acc[0] * multiplier);
}

template <bool kSquares>
void sum_impl(const GpuContext& ctx, std::int64_t n, const float* x, float multiplier,
              float* out, const char* what) {
  if (n < 0) raise<InvalidArgument>(what, ": element count ", n, " is negative");
  auto scope = ctx.impl().scope();
  DeviceBuffer partial(ctx, kSumBlocks * sizeof(double));
  sum_partials<kSquares><<<kSumBlocks, kSumThreads, 0, stream_of(ctx)>>>(n, x,
                                                                         partial.as<double>());
  TW_CUDA_CHECK_LAUNCH("sum_partials");
  sum_finish<<<1, kSumThreads, 0, stream_of(ctx)>>>(kSumBlocks, partial.as<double>(), multiplier,
                                                    out);
  TW_CUDA_CHECK_LAUNCH("sum_finish");
}

}  // namespace

void sum_rows(const GpuContext& ctx, std::int64_t rows, int c, const float* x, float* out) {
  if (rows < 0 || c < 1)
    raise<InvalidArgument>("sum_rows: rows ", rows, " must be >= 0 and c ", c, " >= 1");
  auto scope = ctx.impl().scope();
  std::int64_t chunks = (rows + kRowsPerChunk - 1) / kRowsPerChunk;
  if (chunks < 1) chunks = 1;
  if (chunks > kMaxChunks) chunks = kMaxChunks;
  const std::int64_t rows_per_chunk = rows == 0 ? 1 : (rows + chunks - 1) / chunks;
  DeviceBuffer partial(ctx, static_cast<std::size_t>(chunks) * c * sizeof(double));
  const dim3 grid(static_cast<unsigned>((c + kColumns - 1) / kColumns),
                  static_cast<unsigned>(chunks));
  column_partials<<<grid, dim3(kColumns, kRowLanes), 0, stream_of(ctx)>>>(
      rows, c, rows_per_chunk, x, partial.as<double>());
  TW_CUDA_CHECK_LAUNCH("column_partials");
  column_finish<<<(c + 255) / 256, 256, 0, stream_of(ctx)>>>(static_cast<int>(chunks), c,
                                                             partial.as<double>(), out);
  TW_CUDA_CHECK_LAUNCH("column_finish");
}

void sum(const GpuContext& ctx, std::int64_t n, const float* x, float* out) {
  sum_impl<false>(ctx, n, x, 1.0f, out, "sum");
}

void sum_squares(const GpuContext& ctx, std::int64_t n, const float* x, float* out) {
  sum_impl<true>(ctx, n, x, 1.0f, out, "sum_squares");
}

namespace detail {
void sum_scaled(const GpuContext& ctx, std::int64_t n, const float* x, float multiplier,
                float* out) {
  sum_impl<false>(ctx, n, x, multiplier, out, "sum");
}
}  // namespace detail

}  // namespace towerflow::gpu
