// oneDNN's kernels on a CPU context's threads (onednn_impl.h): each thread runs oneDNN on itself
// over a slice of the problem.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "core/cpu/context.h"
#include "core/cpu/onednn_impl.h"

// Note [oneDNN on the context's threads]
// oneDNN runs on OpenMP (Debian's build, and Intel's -gomp wheels). Called with the context's
// thread count, its OpenMP workers spin after each call while the context's own pool wants the
// same cores for the kernels that run next. On a 2-core Sapphire Rapids-class Xeon, ResNet-20's
// bf16 step (oneDNN's AMX kernels on most layers) ran at 652 img/s with an OpenMP team and 982
// with its workers made to wait passively (OMP_WAIT_POLICY=passive; `towerflow_bench_train
// --model resnet20 --precision bf16`): the towerflow kernels after each oneDNN call ran about
// 1.5x slower. libgomp reads that policy once, as the process starts, so the program cannot
// set it. Instead oneDNN runs on one OpenMP thread, the calling one (no team), on each of the
// context's threads, each over a slice of the problem: forward and backward input over images,
// backward weight over images with the slices' gradients summed in slice order (the same result
// for the same thread count), matrix products over rows of the product.

namespace towerflow::cpu::onednn {
namespace {

// The slices [0, n) is cut into: as many as threads, each at least min_rows long.
int slices(const CpuContext& ctx, std::int64_t n, std::int64_t min_rows) {
  return static_cast<int>(std::clamp<std::int64_t>(n / std::max<std::int64_t>(1, min_rows), 1, ctx.threads()));
}

// Runs f(slice, begin, end) for each slice on the context's threads; false if any returns false.
template <typename F>
bool on_slices(const CpuContext& ctx, int count, std::int64_t n, F f) {
  std::atomic<bool> ok{true};
  ctx.parallel_for(count, 1, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i)
      if (!f(static_cast<int>(i), i * n / count, (i + 1) * n / count)) ok = false;
  });
  return ok;
}

Conv2dShape with_images(const Conv2dShape& s, std::int64_t images) {
  Conv2dShape t = s;
  t.n = static_cast<int>(images);
  return t;
}

std::int64_t image_in(const Conv2dShape& s) { return std::int64_t{s.h} * s.w * s.c_in; }
std::int64_t image_out(const Conv2dShape& s) { return std::int64_t{s.out_h()} * s.out_w() * s.c_out; }

}  // namespace

namespace {

// x and y: float, or bf16 bits.
template <typename T, typename Out, typename... Op>
bool forward_on_slices(const CpuContext& ctx, const Conv2dShape& s, const T* x, const float* w,
                       const float* bias_or_null, Out* y, Op... op) {
  const std::int64_t in = image_in(s), out = image_out(s);
  return on_slices(ctx, slices(ctx, s.n, 1), s.n, [&](int, std::int64_t b, std::int64_t e) {
    return conv2d_forward(1, with_images(s, e - b), x + b * in, w, bias_or_null, y + b * out, op...);
  });
}

template <typename T, typename... Op>
bool backward_weight_on_slices(const CpuContext& ctx, const Conv2dShape& s, const T* x,
                               const float* dy, float* dw, Op... op) {
  const std::int64_t in = image_in(s), out = image_out(s);
  const std::int64_t wn = std::int64_t{s.c_out} * s.c_in * s.kh * s.kw;
  const int count = slices(ctx, s.n, 1);
  thread_local std::vector<float> partial;  // the caller's: slices 1.. write here
  if (static_cast<std::int64_t>(partial.size()) < (count - 1) * wn)
    partial.resize(static_cast<std::size_t>((count - 1) * wn));
  float* const part = partial.data();
  if (!on_slices(ctx, count, s.n, [&](int i, std::int64_t b, std::int64_t e) {
        return conv2d_backward_weight(1, with_images(s, e - b), x + b * in, dy + b * out,
                                      i == 0 ? dw : part + (i - 1) * wn, op...);
      }))
    return false;
  for (int i = 1; i < count; ++i) {
    const float* p = part + (i - 1) * wn;
    for (std::int64_t j = 0; j < wn; ++j) dw[j] += p[j];
  }
  return true;
}

}  // namespace

bool conv2d_forward(const CpuContext& ctx, const Conv2dShape& s, const float* x, const float* w,
                    const float* bias_or_null, float* y, Operands op) {
  return forward_on_slices(ctx, s, x, w, bias_or_null, y, op);
}

bool conv2d_forward(const CpuContext& ctx, const Conv2dShape& s, const std::uint16_t* x,
                    const float* w, const float* bias_or_null, float* y) {
  return forward_on_slices(ctx, s, x, w, bias_or_null, y);
}

bool conv2d_forward(const CpuContext& ctx, const Conv2dShape& s, const float* x, const float* w,
                    const float* bias_or_null, std::uint16_t* y) {
  return forward_on_slices(ctx, s, x, w, bias_or_null, y);
}

bool conv2d_forward(const CpuContext& ctx, const Conv2dShape& s, const std::uint16_t* x,
                    const float* w, const float* bias_or_null, std::uint16_t* y) {
  return forward_on_slices(ctx, s, x, w, bias_or_null, y);
}

bool conv2d_backward_input(const CpuContext& ctx, const Conv2dShape& s, const float* dy,
                           const float* w, float* dx, Operands op) {
  const std::int64_t in = image_in(s), out = image_out(s);
  return on_slices(ctx, slices(ctx, s.n, 1), s.n, [&](int, std::int64_t b, std::int64_t e) {
    return conv2d_backward_input(1, with_images(s, e - b), dy + b * out, w, dx + b * in, op);
  });
}

bool conv2d_backward_weight(const CpuContext& ctx, const Conv2dShape& s, const float* x,
                            const float* dy, float* dw, Operands op) {
  return backward_weight_on_slices(ctx, s, x, dy, dw, op);
}

bool conv2d_backward_weight(const CpuContext& ctx, const Conv2dShape& s, const std::uint16_t* x,
                            const float* dy, float* dw) {
  return backward_weight_on_slices(ctx, s, x, dy, dw);
}

bool gemm(const CpuContext& ctx, bool trans_a, bool trans_b, int m, int n, int k, const float* a,
          int lda, const float* b, int ldb, float* c, int ldc, Operands op) {
  return on_slices(ctx, slices(ctx, m, 16), m, [&](int, std::int64_t r0, std::int64_t r1) {
    const float* a0 = trans_a ? a + r0 : a + r0 * lda;  // rows r0.. of op(a)
    return gemm(1, trans_a, trans_b, static_cast<int>(r1 - r0), n, k, a0, lda, b, ldb, c + r0 * ldc, ldc, op);
  });
}

}  // namespace towerflow::cpu::onednn
