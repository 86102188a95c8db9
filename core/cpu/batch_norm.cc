#include "core/cpu/batch_norm.h"

#include <algorithm>
#include <cmath>

#include "core/cpu/simd_impl.h"
#include "core/error.h"

// Batch norm is memory-bound: each kernel makes two passes over [rows, c] (statistics, then the
// elementwise transform), and the fused variants fold ReLU, the residual add and the ReLU mask
// into those passes instead of adding passes of their own.
//
// Note [Batch norm reductions]
// Per-channel sums are taken over fixed blocks of kRowsPerBlock rows (in float, vectorised), each
// block's sums widened to a double partial, then the partials are added in block order. The blocks do not depend on the thread
// count, so neither do the results. Sums of squares are taken around a per-channel shift (the
// first row), which keeps E[x^2] - E[x]^2 accurate when |mean| is large against the spread.

namespace towerflow::cpu::TW_ISA {

using detail::kLanes;
using detail::load8;
using detail::Scratch;
using detail::scratch;
using detail::splat8;
using detail::store8;
using detail::Vec8;

namespace {

// The ReLU's gradient with both values loaded first, so that the select compiles to a blend
// rather than a branch that mispredicts on about half of a ReLU's outputs.
inline float relu_grad(float y, float dy) { return y > 0.0f ? dy : 0.0f; }


constexpr std::int64_t kRowsPerBlock = 512;

void check_args(const char* kernel, std::int64_t rows, int c, float eps) {
  if (rows < 1)
    raise<InvalidArgument>(kernel, ": rows = ", rows,
                           " must be at least 1; rows is n*h*w of the NHWC input");
  if (c < 1) raise<InvalidArgument>(kernel, ": channels c = ", c, " must be at least 1");
  if (!(eps >= 0.0f))
    raise<InvalidArgument>(kernel, ": eps = ", eps, " must be non-negative (PyTorch uses 1e-5)");
}

// Runs fn(row_begin, row_end, acc) for every block of rows, acc pointing at `width` zeroed
// floats; each block's float sums are then widened into a double partial, and the partials are
// added in block order into out[width]. Float accumulation within a block keeps the loops
// vectorised (kRowsPerBlock terms bound its rounding); double across blocks keeps large row
// counts accurate.
template <typename Fn>
void blocked_sums(const CpuContext& ctx, std::int64_t rows, int width, double* out, Fn fn) {
  const std::int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  double* partial = reinterpret_cast<double*>(
      scratch(Scratch::kAux, static_cast<std::size_t>(2 * blocks * width)));
  const std::int64_t min_blocks = std::max<std::int64_t>(1, 64 * 1024 / (kRowsPerBlock * width));
  ctx.parallel_for(blocks, min_blocks, [&](std::int64_t b0, std::int64_t b1) {
    float* acc = scratch(Scratch::kInput, static_cast<std::size_t>(width));
    for (std::int64_t b = b0; b < b1; ++b) {
      std::fill(acc, acc + width, 0.0f);
      fn(b * kRowsPerBlock, std::min(rows, (b + 1) * kRowsPerBlock), acc);
      double* p = partial + b * width;
      for (int i = 0; i < width; ++i) p[i] = acc[i];
    }
  });
  std::fill(out, out + width, 0.0);
  for (std::int64_t b = 0; b < blocks; ++b)
    for (int i = 0; i < width; ++i) out[i] += partial[b * width + i];
}

template <typename Fn>
void rows_parallel(const CpuContext& ctx, std::int64_t rows, int c, Fn fn) {
  ctx.parallel_for(rows, std::max<std::int64_t>(1, 32 * 1024 / c), fn);
}

// sums[0..c) = sum(x - k), sums[c..2c) = sum((x - k)^2), k = the first row.
void shifted_sums(const CpuContext& ctx, std::int64_t rows, int c, const float* x, double* sums) {
  const float* k = x;
  blocked_sums(ctx, rows, 2 * c, sums, [&](std::int64_t r0, std::int64_t r1, float* acc) {
    float* __restrict s1 = acc;
    float* __restrict s2 = acc + c;
    const float* __restrict kr = k;
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* __restrict row = x + r * c;
      for (int ch = 0; ch < c; ++ch) {
        const float d = row[ch] - kr[ch];
        s1[ch] += d;
        s2[ch] += d * d;
      }
    }
  });
}

// Per-channel scale and shift of the training forward: y = (x - mean) * scale + shift. Centring
// first (rather than folding the mean into the shift) keeps y accurate when |mean| >> std.
void training_stats(const CpuContext& ctx, std::int64_t rows, int c, const float* x,
                    const float* gamma, const float* beta, float eps, float* save_mean,
                    float* save_invstd, float* scale, float* shift) {
  double* sums = reinterpret_cast<double*>(scratch(Scratch::kWeights, 2 * 2 * std::size_t(c)));
  const float* k = x;
  shifted_sums(ctx, rows, c, x, sums);
  for (int ch = 0; ch < c; ++ch) {
    const double m = sums[ch] / rows;
    const double var = std::max(0.0, sums[c + ch] / rows - m * m);
    const double mean = m + k[ch];
    const double invstd = 1.0 / std::sqrt(var + eps);
    save_mean[ch] = static_cast<float>(mean);
    save_invstd[ch] = static_cast<float>(invstd);
    scale[ch] = static_cast<float>(gamma[ch] * invstd);
    shift[ch] = beta[ch];
  }
}

// The scale/shift arrays live in the caller's scratch and are read by every thread.
float* affine_scratch(int c) { return scratch(Scratch::kOutput, 2 * std::size_t(c)); }

}  // namespace

void batch_norm_forward_training(const CpuContext& ctx, std::int64_t rows, int c, const float* x,
                                 const float* gamma, const float* beta, float eps, float* y,
                                 float* save_mean, float* save_invstd) {
  check_args("batch_norm_forward_training", rows, c, eps);
  float* scale = affine_scratch(c);
  float* shift = scale + c;
  training_stats(ctx, rows, c, x, gamma, beta, eps, save_mean, save_invstd, scale, shift);
  rows_parallel(ctx, rows, c, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r)
      for (int ch = 0; ch < c; ++ch)
        y[r * c + ch] = (x[r * c + ch] - save_mean[ch]) * scale[ch] + shift[ch];
  });
}

void batch_norm_relu_forward_training(const CpuContext& ctx, std::int64_t rows, int c,
                                      const float* x, const float* gamma, const float* beta,
                                      float eps, float* y, float* save_mean, float* save_invstd) {
  check_args("batch_norm_relu_forward_training", rows, c, eps);
  float* scale = affine_scratch(c);
  float* shift = scale + c;
  training_stats(ctx, rows, c, x, gamma, beta, eps, save_mean, save_invstd, scale, shift);
  rows_parallel(ctx, rows, c, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r)
      for (int ch = 0; ch < c; ++ch)
        y[r * c + ch] = std::max(0.0f, (x[r * c + ch] - save_mean[ch]) * scale[ch] + shift[ch]);
  });
}

void batch_norm_add_relu_forward_training(const CpuContext& ctx, std::int64_t rows, int c,
                                          const float* x, const float* residual,
                                          const float* gamma, const float* beta, float eps,
                                          float* y, float* save_mean, float* save_invstd) {
  check_args("batch_norm_add_relu_forward_training", rows, c, eps);
  float* scale = affine_scratch(c);
  float* shift = scale + c;
  training_stats(ctx, rows, c, x, gamma, beta, eps, save_mean, save_invstd, scale, shift);
  rows_parallel(ctx, rows, c, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r)
      for (int ch = 0; ch < c; ++ch)
        y[r * c + ch] =
            std::max(0.0f, (x[r * c + ch] - save_mean[ch]) * scale[ch] + shift[ch] +
                               residual[r * c + ch]);
  });
}

void batch_norm_forward_inference(const CpuContext& ctx, std::int64_t rows, int c, const float* x,
                                  const float* gamma, const float* beta,
                                  const float* running_mean, const float* running_var, float eps,
                                  float* y) {
  check_args("batch_norm_forward_inference", rows, c, eps);
  float* scale = affine_scratch(c);
  for (int ch = 0; ch < c; ++ch) {
    if (!(running_var[ch] + eps > 0.0f))
      raise<InvalidArgument>("batch_norm_forward_inference: running_var[", ch, "] + eps = ",
                             running_var[ch] + eps,
                             " must be positive; the running statistics are corrupt or eps is 0");
    scale[ch] = static_cast<float>(gamma[ch] / std::sqrt(static_cast<double>(running_var[ch]) + eps));
  }
  rows_parallel(ctx, rows, c, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r)
      for (int ch = 0; ch < c; ++ch)
        y[r * c + ch] = (x[r * c + ch] - running_mean[ch]) * scale[ch] + beta[ch];
  });
}

namespace {

// backward_sums over rows [r0, r1) for c a multiple of kLanes: acc[0..c) += g,
// acc[c..2c) += g * (x - mean), g = dy masked by y > 0 when kMask (and stored in dr when
// kStore; dr may be dy). The same per-channel order of operations as the scalar loop.
template <bool kMask, bool kStore>
void backward_sums_rows(std::int64_t r0, std::int64_t r1, int c, const float* x, const float* y,
                        const float* dy, const float* mean, float* acc, float* dr) {
  const Vec8 zero = splat8(0.0f);
  for (std::int64_t r = r0; r < r1; ++r) {
    const std::int64_t o = r * c;
    for (int ch = 0; ch < c; ch += kLanes) {
      Vec8 g = load8(dy + o + ch);
      if constexpr (kMask) g = load8(y + o + ch) > zero ? g : zero;
      if constexpr (kStore) store8(dr + o + ch, g);
      const Vec8 d = load8(x + o + ch) - load8(mean + ch);
      store8(acc + ch, load8(acc + ch) + g);
      store8(acc + c + ch, load8(acc + c + ch) + g * d);
    }
  }
}

// The backward's reduction: sums[0..c) = sum(g), sums[c..2c) = sum(g * (x - mean)), g the
// gradient, masked by y > 0 when y != nullptr (and then stored in d_pre_relu when that is not
// null).
void backward_sums(const CpuContext& ctx, std::int64_t rows, int c, const float* x,
                   const float* y, const float* dy, const float* save_mean, double* sums,
                   float* d_pre_relu) {
  blocked_sums(ctx, rows, 2 * c, sums, [&](std::int64_t r0, std::int64_t r1, float* acc) {
    if (c % kLanes == 0) {
      // Written with vectors rather than left to the auto-vectoriser: d_pre_relu may be dy
      // itself, and the run-time overlap checks GCC emits for that case chose its scalar loop.
      if (!y) return backward_sums_rows<false, false>(r0, r1, c, x, y, dy, save_mean, acc, nullptr);
      if (!d_pre_relu) return backward_sums_rows<true, false>(r0, r1, c, x, y, dy, save_mean, acc, nullptr);
      return backward_sums_rows<true, true>(r0, r1, c, x, y, dy, save_mean, acc, d_pre_relu);
    }
    float* __restrict s1 = acc;
    float* __restrict s2 = acc + c;
    const float* __restrict mean = save_mean;
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* __restrict xr = x + r * c;
      const float* gr = dy + r * c;
      if (!y) {
        for (int ch = 0; ch < c; ++ch) {
          s1[ch] += gr[ch];
          s2[ch] += gr[ch] * (xr[ch] - mean[ch]);
        }
        continue;
      }
      const float* __restrict yr = y + r * c;
      if (d_pre_relu) {
        float* dr = d_pre_relu + r * c;  // may be dy itself: read before write, element-wise
        for (int ch = 0; ch < c; ++ch) {
          const float g = relu_grad(yr[ch], gr[ch]);
          dr[ch] = g;
          s1[ch] += g;
          s2[ch] += g * (xr[ch] - mean[ch]);
        }
      } else {
        for (int ch = 0; ch < c; ++ch) {
          const float g = relu_grad(yr[ch], gr[ch]);
          s1[ch] += g;
          s2[ch] += g * (xr[ch] - mean[ch]);
        }
      }
    }
  });
}

// The backward's elementwise pass: dx = a * ((g - mean_g) - (x - mean) * b), g as in
// backward_sums.
void backward_dx(const CpuContext& ctx, std::int64_t rows, int c, const float* x, const float* y,
                 const float* dy, const float* save_mean, const float* a, const float* mean_g,
                 const float* b, float* dx) {
  rows_parallel(ctx, rows, c, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * c;
      const float* gr = dy + r * c;
      float* dr = dx + r * c;
      if (y) {
        const float* yr = y + r * c;
        for (int ch = 0; ch < c; ++ch) {
          const float g = relu_grad(yr[ch], gr[ch]);
          dr[ch] = a[ch] * ((g - mean_g[ch]) - (xr[ch] - save_mean[ch]) * b[ch]);
        }
      } else {
        for (int ch = 0; ch < c; ++ch)
          dr[ch] = a[ch] * ((gr[ch] - mean_g[ch]) - (xr[ch] - save_mean[ch]) * b[ch]);
      }
    }
  });
}

// Shared by the plain and the ReLU backward. With y != nullptr the incoming gradient is masked
// by y > 0 (and stored in d_pre_relu when that is not null) before batch norm's own backward.
void backward_impl(const CpuContext& ctx, std::int64_t rows, int c, const float* x,
                   const float* y, const float* dy, const float* gamma, const float* save_mean,
                   const float* save_invstd, float* dx, float* dgamma, float* dbeta,
                   float* d_pre_relu) {
  double* sums = reinterpret_cast<double*>(scratch(Scratch::kWeights, 2 * 2 * std::size_t(c)));
  backward_sums(ctx, rows, c, x, y, dy, save_mean, sums, d_pre_relu);
  // dx = gamma*invstd * ((g - mean(g)) - (x - mean) * invstd * mean(g * xhat)), kept in this
  // centred form: folding it into one a*g + b*x + k cancels catastrophically when dx is small.
  float* coef = scratch(Scratch::kOutput, 3 * std::size_t(c));
  float* a = coef;
  float* mean_g = coef + c;
  float* b = coef + 2 * c;
  for (int ch = 0; ch < c; ++ch) {
    const double invstd = save_invstd[ch];
    const double sum_g = sums[ch], sum_gx = sums[c + ch];
    dbeta[ch] = static_cast<float>(sum_g);
    dgamma[ch] = static_cast<float>(sum_gx * invstd);
    a[ch] = static_cast<float>(gamma[ch] * invstd);
    mean_g[ch] = static_cast<float>(sum_g / rows);
    b[ch] = static_cast<float>(invstd * invstd * sum_gx / rows);
  }
  // With d_pre_relu the masked gradient is already in memory: read it instead of y and dy.
  if (d_pre_relu) return backward_dx(ctx, rows, c, x, nullptr, d_pre_relu, save_mean, a, mean_g, b, dx);
  backward_dx(ctx, rows, c, x, y, dy, save_mean, a, mean_g, b, dx);
}

}  // namespace

void batch_norm_backward(const CpuContext& ctx, std::int64_t rows, int c, const float* x,
                         const float* dy, const float* gamma, const float* save_mean,
                         const float* save_invstd, float* dx, float* dgamma, float* dbeta) {
  check_args("batch_norm_backward", rows, c, 0.0f);
  backward_impl(ctx, rows, c, x, nullptr, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta,
                nullptr);
}

void batch_norm_relu_backward(const CpuContext& ctx, std::int64_t rows, int c, const float* x,
                              const float* y, const float* dy, const float* gamma,
                              const float* save_mean, const float* save_invstd, float* dx,
                              float* dgamma, float* dbeta, float* d_pre_relu) {
  check_args("batch_norm_relu_backward", rows, c, 0.0f);
  backward_impl(ctx, rows, c, x, y, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta,
                d_pre_relu);
}

// ---- phases ------------------------------------------------------------------------------------

void batch_norm_moments(const CpuContext& ctx, std::int64_t rows, int c, const float* x,
                        double* mean, double* m2) {
  check_args("batch_norm_moments", rows, c, 0.0f);
  double* sums = reinterpret_cast<double*>(scratch(Scratch::kWeights, 2 * 2 * std::size_t(c)));
  shifted_sums(ctx, rows, c, x, sums);
  for (int ch = 0; ch < c; ++ch) {
    const double s1 = sums[ch], s2 = sums[c + ch];
    mean[ch] = x[ch] + s1 / rows;
    m2[ch] = std::max(0.0, s2 - s1 * s1 / rows);
  }
}

void batch_norm_forward_apply(const CpuContext& ctx, std::int64_t rows, int c, const float* x,
                              const float* residual, bool relu, const float* gamma,
                              const float* beta, const float* mean, const float* invstd,
                              float* y) {
  check_args("batch_norm_forward_apply", rows, c, 0.0f);
  float* scale = affine_scratch(c);
  for (int ch = 0; ch < c; ++ch)
    scale[ch] = static_cast<float>(gamma[ch] * static_cast<double>(invstd[ch]));
  rows_parallel(ctx, rows, c, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * c;
      float* yr = y + r * c;
      if (residual) {
        const float* rr = residual + r * c;
        for (int ch = 0; ch < c; ++ch) {
          const float v = (xr[ch] - mean[ch]) * scale[ch] + beta[ch] + rr[ch];
          yr[ch] = relu ? std::max(0.0f, v) : v;
        }
      } else if (relu) {
        for (int ch = 0; ch < c; ++ch)
          yr[ch] = std::max(0.0f, (xr[ch] - mean[ch]) * scale[ch] + beta[ch]);
      } else {
        for (int ch = 0; ch < c; ++ch) yr[ch] = (xr[ch] - mean[ch]) * scale[ch] + beta[ch];
      }
    }
  });
}

void batch_norm_backward_reduce(const CpuContext& ctx, std::int64_t rows, int c, const float* x,
                                const float* y, const float* dy, const float* mean, double* sum_g,
                                double* sum_gxc, float* d_pre_relu) {
  check_args("batch_norm_backward_reduce", rows, c, 0.0f);
  double* sums = reinterpret_cast<double*>(scratch(Scratch::kWeights, 2 * 2 * std::size_t(c)));
  backward_sums(ctx, rows, c, x, y, dy, mean, sums, y ? d_pre_relu : nullptr);
  std::copy(sums, sums + c, sum_g);
  std::copy(sums + c, sums + 2 * c, sum_gxc);
}

void batch_norm_backward_apply(const CpuContext& ctx, std::int64_t rows, int c, const float* x,
                               const float* y, const float* dy, const float* gamma,
                               const float* mean, const float* invstd, const float* mean_g,
                               const float* mean_gxhat, float* dx) {
  check_args("batch_norm_backward_apply", rows, c, 0.0f);
  float* coef = scratch(Scratch::kOutput, 2 * std::size_t(c));
  float* a = coef;
  float* b = coef + c;
  for (int ch = 0; ch < c; ++ch) {
    const double is = invstd[ch];
    a[ch] = static_cast<float>(gamma[ch] * is);
    b[ch] = static_cast<float>(is * mean_gxhat[ch]);
  }
  backward_dx(ctx, rows, c, x, y, dy, mean, a, mean_g, b, dx);
}

}  // namespace towerflow::cpu::TW_ISA
