// Batched 2-D transpose through shared-memory tiles: y[b, j, i] = x[b, i, j]. Used for NHWC <->
// NCHW and for the OIHW <-> OHWI weight layouts cuDNN's NHWC convolutions need.

#include "core/cuda/context_impl.h"
#include "core/cuda/ops.h"

namespace towerflow::gpu {

namespace {

constexpr int kTile = 32;
constexpr int kRowsPerPass = 8;

// One block per 32x32 tile of one matrix of the batch; blockIdx.z walks the batch (grid-stride
// over z for batches beyond the grid limit). The +1 column avoids shared-memory bank conflicts.
__global__ void transpose_kernel(std::int64_t batch, std::int64_t rows, std::int64_t cols,
                                 const float* x, float* y) {
  __shared__ float tile[kTile][kTile + 1];
  const std::int64_t col0 = static_cast<std::int64_t>(blockIdx.x) * kTile;
  const std::int64_t row0 = static_cast<std::int64_t>(blockIdx.y) * kTile;
  for (std::int64_t b = blockIdx.z; b < batch; b += gridDim.z) {
    const float* xb = x + b * rows * cols;
    float* yb = y + b * rows * cols;
    for (int k = threadIdx.y; k < kTile; k += kRowsPerPass) {
      const std::int64_t r = row0 + k, c = col0 + threadIdx.x;
      if (r < rows && c < cols) tile[k][threadIdx.x] = xb[r * cols + c];
    }
    __syncthreads();
    for (int k = threadIdx.y; k < kTile; k += kRowsPerPass) {
      const std::int64_t c = col0 + k, r = row0 + threadIdx.x;  // y is [cols, rows]
      if (r < rows && c < cols) yb[c * rows + r] = tile[threadIdx.x][k];
    }
    __syncthreads();
  }
}

}  // namespace

void transpose_batched(const GpuContext& ctx, std::int64_t batch, std::int64_t rows,
                       std::int64_t cols, const float* x, float* y) {
  if (batch < 0 || rows < 0 || cols < 0)
    raise<InvalidArgument>("transpose_batched: sizes must not be negative (batch ", batch,
                           ", rows ", rows, ", cols ", cols, ")");
  if (batch == 0 || rows == 0 || cols == 0) return;
  const std::int64_t tiles_x = (cols + kTile - 1) / kTile, tiles_y = (rows + kTile - 1) / kTile;
  if (tiles_x > 2147483647LL || tiles_y > 65535)
    raise<InvalidArgument>("transpose_batched: a ", rows, " x ", cols,
                           " matrix is too large for one launch (at most 65535*32 rows)");
  auto scope = ctx.impl().scope();
  const dim3 grid(static_cast<unsigned>(tiles_x), static_cast<unsigned>(tiles_y),
                  static_cast<unsigned>(batch < 65535 ? batch : 65535));
  transpose_kernel<<<grid, dim3(kTile, kRowsPerPass), 0, stream_of(ctx)>>>(batch, rows, cols, x,
                                                                           y);
  TW_CUDA_CHECK_LAUNCH("transpose_kernel");
}

}  // namespace towerflow::gpu
