#include "core/cpu/pool.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/cpu/simd_impl.h"
#include "core/error.h"

// In NHWC every window position is a contiguous run of c channels, so each kernel below works on
// whole channel rows: the inner loops run over c and vectorise; windows are clipped to the image
// once per output pixel instead of testing every element. Forward kernels split output rows over
// threads. Max pooling's backward, which scatters into overlapping windows, splits images;
// average pooling's gathers, by rows of input pixels. Either way every dx element is written by
// one thread in a fixed order, and results do not depend on the thread count.

namespace towerflow::cpu::TW_ISA {

using detail::kLanes;
using detail::load8;
using detail::splat8;
using detail::splat8i;
using detail::store8;
using detail::store8i;
using detail::Vec8;
using detail::Vec8i;

namespace {

// The part of a window inside the image: rows [h0, h1), columns [w0, w1).
struct Window {
  int h0, h1, w0, w1;
};

inline Window clip(const Pool2dShape& s, int oh, int ow) {
  const int hs = oh * s.stride_h - s.pad_h, ws = ow * s.stride_w - s.pad_w;
  return {std::max(hs, 0), std::min(hs + s.kh, s.h), std::max(ws, 0), std::min(ws + s.kw, s.w)};
}

std::int64_t min_rows(const Pool2dShape& s) {
  const std::int64_t work = std::int64_t{s.out_w()} * s.c * s.kh * s.kw;
  return std::max<std::int64_t>(1, 20000 / std::max<std::int64_t>(1, work));
}

}  // namespace

void max_pool_forward(const CpuContext& ctx, const Pool2dShape& s, const float* x, float* y,
                      std::int32_t* argmax) {
  s.validate();
  const int oh = s.out_h(), ow = s.out_w(), c = s.c;
  ctx.parallel_for(std::int64_t{s.n} * oh, min_rows(s), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const std::int64_t n = r / oh;
      const int row = static_cast<int>(r % oh);
      const float* img = x + n * s.h * s.w * c;
      for (int col = 0; col < ow; ++col) {
        const Window win = clip(s, row, col);
        const std::int64_t o = (r * ow + col) * c;
        float* best = y + o;
        std::int32_t* idx = argmax ? argmax + o : nullptr;
        const float* first = img + (std::int64_t{win.h0} * s.w + win.w0) * c;
        const std::int32_t first_pos = win.h0 * s.w + win.w0;
        // Start from the first element of the window, then take strictly greater values (the
        // first maximum wins) or NaN (NaN propagates), as PyTorch does. Eight channels at a
        // time in registers, the window innermost.
        int ch = 0;
        for (; ch + kLanes <= c; ch += kLanes) {
          Vec8 b = load8(first + ch);
          Vec8i at = splat8i(first_pos);
          for (int ih = win.h0; ih < win.h1; ++ih)
            for (int iw = win.w0; iw < win.w1; ++iw) {
              const Vec8 v = load8(img + (std::int64_t{ih} * s.w + iw) * c + ch);
              const Vec8i take = (v > b) | (v != v);
              b = take ? v : b;
              at = take ? splat8i(ih * s.w + iw) : at;
            }
          store8(best + ch, b);
          if (idx) store8i(idx + ch, at);
        }
        for (; ch < c; ++ch) {
          float b = first[ch];
          std::int32_t at = first_pos;
          for (int ih = win.h0; ih < win.h1; ++ih)
            for (int iw = win.w0; iw < win.w1; ++iw) {
              const float v = img[(std::int64_t{ih} * s.w + iw) * c + ch];
              if (v > b || std::isnan(v)) {
                b = v;
                at = ih * s.w + iw;
              }
            }
          best[ch] = b;
          if (idx) idx[ch] = at;
        }
      }
    }
  });
}

void max_pool_backward(const CpuContext& ctx, const Pool2dShape& s, const float* dy,
                       const std::int32_t* argmax, float* dx) {
  s.validate();
  TW_CHECK(argmax != nullptr, "max_pool_backward needs the argmax of max_pool_forward");
  const int oh = s.out_h(), ow = s.out_w(), c = s.c;
  const std::int64_t image_in = std::int64_t{s.h} * s.w * c;
  const std::int64_t image_out = std::int64_t{oh} * ow * c;
  ctx.parallel_for(s.n, std::max<std::int64_t>(1, 20000 / image_out), [&](std::int64_t n0, std::int64_t n1) {
    for (std::int64_t n = n0; n < n1; ++n) {
      float* img = dx + n * image_in;
      std::fill(img, img + image_in, 0.0f);
      const float* g = dy + n * image_out;
      const std::int32_t* idx = argmax + n * image_out;
      for (std::int64_t p = 0; p < image_out; p += c)
        for (int ch = 0; ch < c; ++ch) img[std::int64_t{idx[p + ch]} * c + ch] += g[p + ch];
    }
  });
}

void avg_pool_forward(const CpuContext& ctx, const Pool2dShape& s, const float* x, float* y) {
  s.validate();
  const int oh = s.out_h(), ow = s.out_w(), c = s.c;
  const float scale = 1.0f / static_cast<float>(s.kh * s.kw);  // count_include_pad
  ctx.parallel_for(std::int64_t{s.n} * oh, min_rows(s), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const std::int64_t n = r / oh;
      const int row = static_cast<int>(r % oh);
      const float* img = x + n * s.h * s.w * c;
      for (int col = 0; col < ow; ++col) {
        const Window win = clip(s, row, col);
        float* out = y + (r * ow + col) * c;
        // Eight channels at a time summed in a register over the window (as max pooling), in
        // the window's order; then the rest of the channels one by one in the same order.
        int ch = 0;
        for (; ch + kLanes <= c; ch += kLanes) {
          Vec8 sum = splat8(0.0f);
          for (int ih = win.h0; ih < win.h1; ++ih)
            for (int iw = win.w0; iw < win.w1; ++iw)
              sum += load8(img + (std::int64_t{ih} * s.w + iw) * c + ch);
          store8(out + ch, sum * scale);
        }
        for (; ch < c; ++ch) {
          float sum = 0.0f;
          for (int ih = win.h0; ih < win.h1; ++ih)
            for (int iw = win.w0; iw < win.w1; ++iw) sum += img[(std::int64_t{ih} * s.w + iw) * c + ch];
          out[ch] = sum * scale;
        }
      }
    }
  });
}

// Each dx pixel gathers g * scale from the windows that hold it, in the order of the output
// pixels (row, then column), so dx is written once, without a pass to zero it first, and every
// element is summed in the same order whatever the threads. Rows of input pixels are split over
// threads.
void avg_pool_backward(const CpuContext& ctx, const Pool2dShape& s, const float* dy, float* dx) {
  s.validate();
  const int oh = s.out_h(), ow = s.out_w(), c = s.c;
  const float scale = 1.0f / static_cast<float>(s.kh * s.kw);
  // Output rows (columns) whose window holds input row (column) i: [first, last].
  auto first = [](int i, int pad, int k, int stride) {
    const int lo = i + pad - k + 1;
    return lo <= 0 ? 0 : (lo + stride - 1) / stride;
  };
  auto last = [](int i, int pad, int stride, int out) { return std::min(out - 1, (i + pad) / stride); };
  const std::int64_t min_rows = std::max<std::int64_t>(1, 20000 / (std::int64_t{s.w} * c));
  ctx.parallel_for(std::int64_t{s.n} * s.h, min_rows, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const std::int64_t n = r / s.h;
      const int ih = static_cast<int>(r % s.h);
      const float* g_img = dy + n * oh * ow * c;
      const int row0 = first(ih, s.pad_h, s.kh, s.stride_h), row1 = last(ih, s.pad_h, s.stride_h, oh);
      for (int iw = 0; iw < s.w; ++iw) {
        const int col0 = first(iw, s.pad_w, s.kw, s.stride_w), col1 = last(iw, s.pad_w, s.stride_w, ow);
        float* d = dx + (r * s.w + iw) * c;
        int ch = 0;
        for (; ch + kLanes <= c; ch += kLanes) {
          Vec8 sum = splat8(0.0f);
          for (int row = row0; row <= row1; ++row)
            for (int col = col0; col <= col1; ++col)
              sum += load8(g_img + (std::int64_t{row} * ow + col) * c + ch) * scale;
          store8(d + ch, sum);
        }
        for (; ch < c; ++ch) {
          float sum = 0.0f;
          for (int row = row0; row <= row1; ++row)
            for (int col = col0; col <= col1; ++col) sum += g_img[(std::int64_t{row} * ow + col) * c + ch] * scale;
          d[ch] = sum;
        }
      }
    }
  });
}

}  // namespace towerflow::cpu::TW_ISA
