#pragma once
// The skeleton shared by the convolution drivers of conv.cc (fp32), bf16_pairs.cc (vdpbf16ps)
// and bf16_amx.cc (AMX tiles), which keep only their packing and register kernels: output rows
// over threads, balanced tiles, padding, the weight gradient's tiles and fixed summation, the
// plan of a backward input by stride phases, and the tables of a kernel's instantiations.
// Compiled into each instruction set's namespace, as simd_impl.h is.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/cpu/context.h"
#include "core/cpu/conv.h"
#include "core/cpu/simd_impl.h"

namespace towerflow::cpu::TW_ISA::detail {

// How a kernel writes its result: over what dst held, or added to it (conv2d_backward_input_add:
// dst + result, one rounding, the same bits as the result added afterwards).
enum class Store { kOverwrite, kAdd };

// Note [Prefetching what a tile adds to]
// A kernel that adds its result to dx (Store::kAdd: the backward input added to the gradient
// another consumer gave) loads dx's lines as it stores, at the end of a tile's long chain of
// products: the loads miss (other passes have run since dx was written) and their latency is not
// hidden behind work, the out-of-order window having moved past the products by then. So the
// register tiles ask for the lines they will add to as they start, and the Winograd kernels for
// a group's outputs as they transform its inputs. On a 2-core Zen 4 EPYC (`towerflow_bench_train
// --model resnet20 --precision bf16 --trace`, alternating runs with the add in place and apart),
// unprefetched, the add in place cost about what the separate pass did: layer1 conv1's gradient
// took 3.38-3.54 ms against 3.39-3.46 plus a pass of 0.33-0.38, layer2.1 conv1's Winograd one
// 2.73-2.81 against 2.51-2.62 plus 0.11-0.13. Prefetched: 3.49-3.52 against 3.60-3.65 plus
// 0.34-0.41, and 2.66-2.82 against 2.61-2.72 plus 0.14; the step 1201-1246 img/s against
// 1167-1208 (six rounds).

// Asks for the cache lines of n floats from p.
inline void prefetch_floats(const float* p, std::int64_t n) {
  for (std::int64_t i = 0; i < n; i += 16) __builtin_prefetch(p + i);
}

// {make.template operator()<1>(), ..., make.template operator()<N>()}: the table of a kernel
// instantiated for every size from 1 to N of one of its tile dimensions, indexed by size - 1.
template <int N, typename Make>
constexpr auto kernel_table(Make make) {
  return [&]<std::size_t... I>(std::index_sequence<I...>) {
    return std::array{make.template operator()<static_cast<int>(I) + 1>()...};
  }(std::make_index_sequence<N>{});
}

// This thread's scratch slot as n zeroed floats.
inline float* zeroed_scratch(Scratch slot, std::int64_t n) {
  float* p = scratch(slot, static_cast<std::size_t>(n));
  std::fill(p, p + n, 0.0f);
  return p;
}

// bias (c_out values) padded with zeros to n in this thread's kAux slot; null for a null bias.
inline float* padded_bias(const float* bias, int c_out, std::int64_t n) {
  if (!bias) return nullptr;
  float* b = zeroed_scratch(Scratch::kAux, n);
  std::copy(bias, bias + c_out, b);
  return b;
}

// Note [Output rows over threads]
// The forward and backward-input drivers split the batch's output rows (images x rows) over the
// context's threads, each chunk at least about 100k multiply-adds so that small layers stay on
// one thread, and walk a chunk image by image. Every output element is written by one thread.

// Runs chunk(r0, r1) over the rows [0, images * rows) on ctx's threads.
template <typename Chunk>
void parallel_rows(const CpuContext& ctx, std::int64_t images, int rows, std::int64_t macs_per_row,
                   Chunk&& chunk) {
  const std::int64_t min_rows = std::max<std::int64_t>(1, 100000 / std::max<std::int64_t>(1, macs_per_row));
  ctx.parallel_for(images * rows, min_rows, chunk);
}

// Calls span(n, row_begin, row_end) for image n's part [row_begin, row_end) of the rows [r0, r1),
// images of `rows` rows, image by image.
template <typename Span>
void for_image_rows(std::int64_t r0, std::int64_t r1, int rows, Span&& span) {
  for (std::int64_t r = r0; r < r1;) {
    const std::int64_t n = r / rows;
    const int row_begin = static_cast<int>(r % rows);
    const int row_end = static_cast<int>(std::min<std::int64_t>(r1 - n * rows, rows));
    r = n * rows + row_end;
    span(n, row_begin, row_end);
  }
}

// Cuts `pixels` into balanced tiles of at most P (32 pixels at P = 6: six tiles of 5 or 6 rather
// than 6, 6, 6, 6, 6, 2, whose narrow last tile would use each weight vector twice) and calls
// tile(p0, p, cb, lanes) for tile [p0, p0 + p) and each block cb of `block` of `channels`
// channels, lanes of them real: groups of 8 tiles, every block over a group before the next, so
// that the group's outputs stay in L1 while the blocks fill them in.
template <int P, typename Tile>
void for_each_tile(std::int64_t pixels, int channels, int block, Tile&& tile) {
  const int blocks = (channels + block - 1) / block;
  const std::int64_t tiles = (pixels + P - 1) / P;
  for (std::int64_t g0 = 0; g0 < tiles; g0 += 8)
    for (int cb = 0; cb < blocks; ++cb) {
      const int lanes = std::min(block, channels - cb * block);
      for (std::int64_t t = g0; t < std::min(tiles, g0 + 8); ++t) {
        const std::int64_t p0 = pixels * t / tiles;
        tile(p0, static_cast<int>(pixels * (t + 1) / tiles - p0), cb, lanes);
      }
    }
}

// The p output pixels from pixel `first` of images ow pixels wide (rows running on): offs[k] the
// input of pixel k, in_row per output row and in_col per pixel; out_offs[k] its output, ld_y
// apart.
inline void pixel_offsets(std::int64_t first, int p, int ow, std::int64_t in_row, std::int64_t in_col,
                          std::int64_t ld_y, std::int64_t* offs, std::int64_t* out_offs) {
  std::int64_t row = first / ow, col = first % ow;
  for (int k = 0; k < p; ++k) {
    offs[k] = row * in_row + col * in_col;
    out_offs[k] = k * ld_y;
    if (++col == ow) col = 0, ++row;
  }
}

// Copies image rows [row_begin, row_end) of the padded image (padded coordinates) into dst,
// which is laid out [h + 2*pad_h][w + 2*pad_w][c], zeroing the border.
// T: float, or the bf16 bits of bf16.h's bf16 inputs (std::uint16_t).
template <typename T>
void pad_rows(const T* img, int h, int w, int c, int pad_h, int pad_w, int row_begin, int row_end,
              T* dst) {
  const std::int64_t wp = w + 2 * pad_w;
  for (int r = row_begin; r < row_end; ++r) {
    T* d = dst + r * wp * c;
    const int src_row = r - pad_h;
    if (src_row < 0 || src_row >= h) {
      std::fill(d, d + wp * c, T{0});
      continue;
    }
    std::fill(d, d + std::int64_t{pad_w} * c, T{0});
    std::copy(img + std::int64_t{src_row} * w * c, img + std::int64_t{src_row + 1} * w * c,
              d + std::int64_t{pad_w} * c);
    std::fill(d + (std::int64_t{pad_w} + w) * c, d + wp * c, T{0});
  }
}

// The rows [first, end) of the padded input (padded coordinates) that output rows [row_begin,
// row_end) of s read.
struct InputRows {
  int first, end;
};
inline InputRows input_rows(const Conv2dShape& s, int row_begin, int row_end) {
  return {row_begin * s.stride_h, std::min(s.h + 2 * s.pad_h, (row_end - 1) * s.stride_h + s.kh)};
}

// One image of s's input padded into buf: this thread's kInput slot, null where s does not pad.
inline float* padded_image_buffer(const Conv2dShape& s) {
  if (s.pad_h == 0 && s.pad_w == 0) return nullptr;
  return scratch(Scratch::kInput, static_cast<std::size_t>(s.h + 2 * s.pad_h) * (s.w + 2 * s.pad_w) * s.c_in);
}
// The image img as the weight gradients read it: padded into buf (padded_image_buffer, or the
// same memory as T), or in place where s does not pad.
template <typename T>
const T* padded_image(const Conv2dShape& s, const T* img, T* buf) {
  if (!buf) return img;
  pad_rows(img, s.h, s.w, s.c_in, s.pad_h, s.pad_w, 0, s.h + 2 * s.pad_h, buf);
  return buf;
}
// The same for the forward drivers: only the input rows that output rows [row_begin, row_end)
// read are padded.
inline const float* padded_rows(const Conv2dShape& s, const float* img, int row_begin, int row_end, float* buf) {
  if (!buf) return img;
  const InputRows r = input_rows(s, row_begin, row_end);
  pad_rows(img, s.h, s.w, s.c_in, s.pad_h, s.pad_w, r.first, r.end, buf);
  return buf;
}

// Note [Weight gradient: image groups or tiles]
// Large batches split the images into kGroups fixed groups, each summed into its own partial
// dw by one thread, and the partials are added in group order: every thread pads and reads only
// its own images, and each image's x and dy stay in cache for all tiles. Small batches (fewer
// than 2*kGroups images) split the dw tiles over threads instead, each summing all images.
// Either way the choice and the summation order depend on the shape only, never on the thread
// count (Note [Deterministic reductions]).
//
// sum_weight_grad runs that schedule for a kernel whose accumulate(n0, n1, t0, t1, dst) adds
// images [n0, n1) into tiles [t0, t1) of dst (dw_size floats); the sum lands in dwp, zeroed by
// the caller. Tiles are split over threads at least min_tiles at a time.
template <typename Accumulate>
inline void sum_weight_grad(const CpuContext& ctx, int n, std::int64_t tiles,
                            std::int64_t min_tiles, std::int64_t dw_size, float* dwp,
                            Accumulate& accumulate) {
  constexpr int kGroups = 8;
  if (n < 2 * kGroups) {
    ctx.parallel_for(tiles, min_tiles,
                     [&](std::int64_t t0, std::int64_t t1) { accumulate(0, n, t0, t1, dwp); });
    return;
  }
  float* partial = scratch(Scratch::kAux, static_cast<std::size_t>(kGroups * dw_size));
  ctx.parallel_for(kGroups, 1, [&](std::int64_t g0, std::int64_t g1) {
    for (std::int64_t g = g0; g < g1; ++g) {
      float* dst = partial + g * dw_size;
      std::fill(dst, dst + dw_size, 0.0f);
      accumulate(static_cast<int>(n * g / kGroups), static_cast<int>(n * (g + 1) / kGroups), 0, tiles, dst);
    }
  });
  // The partials added in group order, the elements split over the threads (the same sums).
  ctx.parallel_for(dw_size, 4096, [&](std::int64_t e0, std::int64_t e1) {
    std::copy(partial + e0, partial + e1, dwp + e0);
    for (int g = 1; g < kGroups; ++g) {
      const float* src = partial + g * dw_size;
      for (std::int64_t e = e0; e < e1; ++e) dwp[e] += src[e];
    }
  });
}

// The tiles of a weight gradient summed as dwp [kh][q_len][ld_acc], q = (kernel column, input
// channel): tile t is (block cb of output channels, kernel row i, q tile) in block-major order, so
// that consecutive tiles read one slice of dy, with q tiles of at most max_q, balanced (15 at 6:
// 5, 5, 5 rather than 6, 6, 3). They are listed once per gradient: decoding t takes five integer
// divisions, which cost 7% of ResNet-20's 64->64 weight gradient (384 tiles of 64 pixels an
// image) on a 2-core Zen 3 EPYC (AVX2) when each tile call did them. The list lives in a vector
// of the calling thread's, reused from one gradient to the next, so that a training step does not
// allocate it.
struct WeightTiles {
  struct Tile {
    int cb, i, q0, q;
  };
  int kh, q_len, q_tiles;
  const std::vector<Tile>& list;
  WeightTiles(int kh, int q_len, int max_q, int blocks)
      : kh(kh), q_len(q_len), q_tiles((q_len + max_q - 1) / max_q), list(storage()) {
    std::vector<Tile>& l = storage();
    l.clear();
    for (int cb = 0; cb < blocks; ++cb)
      for (int i = 0; i < kh; ++i)
        for (int qt = 0; qt < q_tiles; ++qt) {
          const int q0 = q_len * qt / q_tiles;
          l.push_back({.cb = cb, .i = i, .q0 = q0, .q = q_len * (qt + 1) / q_tiles - q0});
        }
  }
  std::int64_t count() const { return static_cast<std::int64_t>(list.size()); }
  const Tile& operator[](std::int64_t t) const { return list[static_cast<std::size_t>(t)]; }

 private:
  // One list per thread: a weight gradient's workers only read the list of the thread that
  // called it, which waits for them.
  static std::vector<Tile>& storage() {
    thread_local std::vector<Tile> tiles;
    return tiles;
  }
};

// dw (OIHW) from a weight gradient summed as dwp [kh][kw][c_in][ld_acc]: dw[co][ci][i][j] =
// dwp[((i * kw + j) * c_in + ci) * ld_acc + co].
inline void unpack_weight_grad(const Conv2dShape& s, const float* dwp, std::int64_t ld_acc,
                               float* dw) {
  for (int co = 0; co < s.c_out; ++co)
    for (int ci = 0; ci < s.c_in; ++ci)
      for (int i = 0; i < s.kh; ++i)
        for (int j = 0; j < s.kw; ++j)
          dw[((std::int64_t{co} * s.c_in + ci) * s.kh + i) * s.kw + j] =
              dwp[((std::int64_t{i} * s.kw + j) * s.c_in + ci) * ld_acc + co];
}

// Note [Phases into zeroed rows]
// The phases of an image row range write its dx pixels in a strided order (every sh-th row,
// every sw-th pixel of it), so into memory the caches do not hold, a training step's fresh
// output, each line arrives by a read for ownership that the prefetchers do not see coming. On a
// 2-core Zen 4 EPYC, ResNet-20's 16->32 stride-2 bf16 backward input took 1.72-1.78 ms in a
// training step against 1.02 ms on an output in cache (`towerflow_bench_train --model resnet20
// --precision bf16 --trace`, the kernel alone). So an output to be overwritten has its rows
// zeroed first, in order, which the prefetchers follow, and the phases add into them: 1.13-1.29
// ms; the gradients of ResNet-20's two stride-2 3x3 layers took 4.2-4.8 ms a step against
// 4.8-5.3 in bf16 and 7.1-7.4 against 8.0-8.2 in fp32. A value is then 0 plus its sum: the sum's
// bits, but for the sign of a zero.

// The plan of a backward input by stride phases (Note [Backward input by stride phases] in
// conv.cc), shared by the fp32 and the bf16 pair kernels: the zero frame of the embedded dy, and
// where each phase's packed sub-kernel starts.
struct StridePhases {
  int oh, ow, sh, sw;
  int top, left;  // the zero frame: dy sits at (top, left) of the embedded [hp][wp] image
  int hp, wp;
  // phase_offset[a * sw + b]: the start of phase (a, b)'s packed sub-kernel, in weight elements;
  // phase_offset[sh * sw]: the total.
  std::vector<std::int64_t> phase_offset;

  // `per_tap`: weight elements of one tap of the sub-kernel (the packed blocks times the
  // channels of dy, in the packing's units).
  StridePhases(const Conv2dShape& s, std::int64_t per_tap)
      : oh(s.out_h()), ow(s.out_w()), sh(s.stride_h), sw(s.stride_w),
        top(taps(s.kh, sh, 0) - 1), left(taps(s.kw, sw, 0) - 1),
        hp(top + std::max(oh, (s.h - 1 + s.pad_h) / sh + 1)),
        wp(left + std::max(ow, (s.w - 1 + s.pad_w) / sw + 1)),
        phase_offset(static_cast<std::size_t>(sh * sw) + 1, 0) {
    for (int a = 0; a < sh; ++a)
      for (int b = 0; b < sw; ++b)
        phase_offset[a * sw + b + 1] =
            phase_offset[a * sw + b] + per_tap * taps(s.kh, sh, a) * taps(s.kw, sw, b);
  }
  // The taps of a kernel of size k at this stride in phase `phase` (0 when phase >= k).
  static int taps(int k, int stride, int phase) { return phase < k ? (k - phase + stride - 1) / stride : 0; }
  // w[co][ci][ki][kj] of OIHW weights for tap (i, j) of phase (a, b)'s flipped sub-kernel of
  // ma x mb taps.
  static float tap(const Conv2dShape& s, const float* w, int a, int b, int ma, int mb, int ci, int co,
                   int i, int j) {
    const int ki = a + (ma - 1 - i) * s.stride_h, kj = b + (mb - 1 - j) * s.stride_w;
    return w[((std::int64_t{co} * s.c_in + ci) * s.kh + ki) * s.kw + kj];
  }

  // Phase (a, b)'s share of dx rows [row_begin, row_end): its flipped sub-kernel of ma x mb
  // taps, and its rows x cols dx pixels from (ih0, iw0), stepping dx by the stride and the
  // embedded dy by one; tap (0, 0) of pixel (y, x) reads the embedded dy at (dy_row + y,
  // dy_col + x). Empty (rows or cols 0) where the phase has no pixel in those rows.
  struct Region {
    int ma, mb;
    int ih0, iw0, rows, cols;
    std::int64_t dy_row, dy_col;
  };
  Region region(const Conv2dShape& s, int a, int b, int row_begin, int row_end) const {
    Region r{.ma = taps(s.kh, sh, a), .mb = taps(s.kw, sw, b)};
    // This phase's dx rows and columns: (ih + pad) mod stride == phase.
    r.ih0 = row_begin + ((a - (row_begin + s.pad_h) % sh) % sh + sh) % sh;
    r.iw0 = ((b - s.pad_w % sw) % sw + sw) % sw;
    if (r.ih0 >= row_end || r.iw0 >= s.w) return r;
    r.rows = (row_end - 1 - r.ih0) / sh + 1, r.cols = (s.w - 1 - r.iw0) / sw + 1;
    r.dy_row = (r.ih0 + s.pad_h - a) / sh - (r.ma - 1) + top;
    r.dy_col = (r.iw0 + s.pad_w - b) / sw - (r.mb - 1) + left;
    return r;
  }
  // Zeroes the dx pixels of a region whose phase has no taps.
  static void zero_region(const Conv2dShape& s, const Region& r, int sh, int sw, float* img_dx) {
    for (int y = 0; y < r.rows; ++y)
      for (int x = 0; x < r.cols; ++x) {
        float* d = img_dx + (std::int64_t{r.ih0 + y * sh} * s.w + r.iw0 + x * sw) * s.c_in;
        std::fill(d, d + s.c_in, 0.0f);
      }
  }

  // Packs every phase's sub-kernel of the OIHW weights w: pack(offset, ma, mb, get) with the
  // phase's start in phase_offset, its ma x mb taps, and get(ci, co, i, j) its weights.
  template <typename Pack>
  void pack_phases(const Conv2dShape& s, const float* w, Pack&& pack) const {
    for (int a = 0; a < sh; ++a)
      for (int b = 0; b < sw; ++b) {
        const int ma = taps(s.kh, sh, a), mb = taps(s.kw, sw, b);
        pack(phase_offset[a * sw + b], ma, mb,
             [&](int ci, int co, int i, int j) { return tap(s, w, a, b, ma, mb, ci, co, i, j); });
      }
  }

  // For dx rows [row_begin, row_end) of one image (img_dx, NHWC): zeroes the pixels of phases
  // without taps (leaves them as they are where the kernel adds to dx), and calls region(phase,
  // r) for each other phase with pixels in those rows.
  template <typename Fn>
  void for_each_region(const Conv2dShape& s, int row_begin, int row_end, Store store, float* img_dx,
                       Fn&& fn) const {
    for (int a = 0; a < sh; ++a)
      for (int b = 0; b < sw; ++b) {
        const Region r = region(s, a, b, row_begin, row_end);
        if (r.rows == 0 || r.cols == 0) continue;
        if (r.ma == 0 || r.mb == 0) {
          if (store == Store::kOverwrite) zero_region(s, r, sh, sw, img_dx);
          continue;
        }
        fn(a * sw + b, r);
      }
  }

  // for_each_region's phases cut into tiles: tile(phase, ma, mb, p, offs, out_offs, cb, lanes)
  // for every tile of p <= P pixels and every block cb of `block` dx channels (for_each_tile).
  // offs are the tile's pixels in the embedded dy (row_step units per row, `unit` per pixel),
  // out_offs in img_dx.
  // For Store::kOverwrite: zeroes dx rows [row_begin, row_end) of img_dx and returns kAdd, the
  // store the phases then use (Note [Phases into zeroed rows]); any other store as it is.
  Store zero_rows_to_add(const Conv2dShape& s, int row_begin, int row_end, Store store, float* img_dx) const {
    if (store != Store::kOverwrite) return store;
    const std::int64_t row = std::int64_t{s.w} * s.c_in;
    std::fill(img_dx + row_begin * row, img_dx + row_end * row, 0.0f);
    return Store::kAdd;
  }

  template <int P, typename Tile>
  void for_each_phase_tile(const Conv2dShape& s, int row_begin, int row_end, std::int64_t row_step,
                           std::int64_t unit, int block, Store store, float* img_dx, Tile&& tile) const {
    for_each_region(s, row_begin, row_end, store, img_dx, [&](int phase, const Region& r) {
      for_each_tile<P>(std::int64_t{r.rows} * r.cols, s.c_in, block, [&](std::int64_t p0, int p, int cb, int lanes) {
        std::int64_t offs[P], out_offs[P];
        // Consecutive phase pixels step dx by the stride and dy by one.
        std::int64_t y = p0 / r.cols, x = p0 % r.cols;
        for (int k = 0; k < p; ++k) {
          offs[k] = (r.dy_row + y) * row_step + (r.dy_col + x) * unit;
          out_offs[k] = ((r.ih0 + y * sh) * s.w + r.iw0 + x * sw) * s.c_in;
          if (++x == r.cols) x = 0, ++y;
        }
        tile(phase, r.ma, r.mb, p, offs, out_offs, cb, lanes);
      });
    });
  }
};

}  // namespace towerflow::cpu::TW_ISA::detail
