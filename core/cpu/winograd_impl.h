#pragma once
// The transforms of Winograd's F(2x2, 3x3) (Note [Winograd convolution] in conv.cc), shared by
// conv.cc's fp32 Winograd kernels and bf16_pairs.cc's bf16 weight gradient. Compiled into each
// instruction set's namespace, as conv_impl.h is.

#include <algorithm>
#include <cstdint>

#include "core/cpu/conv.h"
#include "core/cpu/conv_impl.h"
#include "core/cpu/simd_impl.h"

namespace towerflow::cpu::TW_ISA::detail {

// Copies img [h][w][c] into dst [hp][wp][c] at (top, left), zeroing the rest.
inline void embed_image(const float* img, int h, int w, int c, int top, int left, int hp, int wp,
                 float* dst) {
  const std::int64_t row = std::int64_t{wp} * c;
  for (int r = 0; r < hp; ++r) {
    float* d = dst + r * row;
    const int src = r - top;
    if (src < 0 || src >= h) {
      std::fill(d, d + row, 0.0f);
      continue;
    }
    std::fill(d, d + std::int64_t{left} * c, 0.0f);
    std::copy(img + std::int64_t{src} * w * c, img + std::int64_t{src + 1} * w * c,
              d + std::int64_t{left} * c);
    std::fill(d + std::int64_t{left + w} * c, d + row, 0.0f);
  }
}

// Whether winograd_conv computes the convolution s.
inline bool winograd_applies(const Conv2dShape& s) {
  return s.kh == 3 && s.kw == 3 && s.stride_h == 1 && s.stride_w == 1 && s.pad_h <= 2 &&
         s.pad_w <= 2 && s.c_in % 8 == 0 && s.c_out % 8 == 0;
}

// u = G g G^T for 8 (output channel, input channel) pairs, one a lane: g[i][j] = get(i, j),
// u[xi], xi = 4 r + c.
template <typename Get>
void winograd_weight(Get get, Vec8* u) {
  Vec8 gg[4][3];  // G g
  for (int j = 0; j < 3; ++j) {
    const Vec8 a = get(0, j), b = get(1, j), c = get(2, j);
    gg[0][j] = a;
    gg[1][j] = 0.5f * (a + b + c);
    gg[2][j] = 0.5f * (a - b + c);
    gg[3][j] = c;
  }
  for (int r = 0; r < 4; ++r) {
    const Vec8 a = gg[r][0], b = gg[r][1], c = gg[r][2];
    u[4 * r + 0] = a;
    u[4 * r + 1] = 0.5f * (a + b + c);
    u[4 * r + 2] = 0.5f * (a - b + c);
    u[4 * r + 3] = c;
  }
}

// Note [Winograd weight transforms]
// The weights are transformed at every call (they change at every step, and the backward input
// runs on the flipped kernel): c_out * c_in transforms, which one at a time on the calling
// thread, the other threads waiting, took about a sixth of the bf16 forward on ResNet-20's
// 64->64 8x8 layer. They run 8 output channels to a vector, the output channels split over the
// threads; so does the weight gradient's last step, dw = G^T dU G. On a 2-core Zen 4 EPYC
// (`towerflow_bench_ops --threads 2 --precision both --filter 64->64`, three runs alternating
// with the transforms one at a time) that layer's bf16 forward went from 1.07-1.14 ms to
// 0.89-1.00, its bf16 weight gradient from 1.31-1.33 to 1.15 (in two runs of three), its fp32
// forward from 1.60-1.75 to 1.49 and its fp32 weight gradient from 1.89-1.93 to 1.73-1.74.

// Calls put(co, ci, u) with u[16] = G g G^T of output channels [co, co + 8) and input channel ci,
// lane l for output channel co + l, for every co a multiple of 8 below c_out (a multiple of 8,
// as winograd_applies has it) and ci below c_in; g[i][j] = get(co, ci, i, j). Output channels
// split over ctx's threads (Note [Winograd weight transforms]).
template <typename Get, typename Put>
void winograd_weights(const CpuContext& ctx, int c_out, int c_in, Get get, Put put) {
  ctx.parallel_for(c_out / 8, 1, [&](std::int64_t b0, std::int64_t b1) {
    for (std::int64_t b = b0; b < b1; ++b) {
      const int co = static_cast<int>(8 * b);
      for (int ci = 0; ci < c_in; ++ci) {
        Vec8 u[16];
        winograd_weight(
            [&](int i, int j) {
              Vec8 g;
              for (int l = 0; l < 8; ++l) g[l] = get(co + l, ci, i, j);
              return g;
            },
            u);
        put(co, ci, u);
      }
    }
  });
}

// The input transforms V = B^T d B of one tile, c_in channels: d the 4x4 patch at p (rows
// `row` floats apart, pixels c_in), V[xi] written at v + xi * plane.
inline void winograd_input(const float* __restrict p, std::int64_t row, int c_in,
                           float* __restrict v, std::int64_t plane) {
  for (int c0 = 0; c0 < c_in; c0 += 8) {
    Vec8 e[4][4];  // d B
    for (int r = 0; r < 4; ++r) {
      const float* q = p + r * row + c0;
      const Vec8 d0 = load8(q), d1 = load8(q + c_in), d2 = load8(q + 2 * c_in), d3 = load8(q + 3 * c_in);
      e[r][0] = d0 - d2;
      e[r][1] = d1 + d2;
      e[r][2] = d2 - d1;
      e[r][3] = d1 - d3;
    }
    for (int j = 0; j < 4; ++j) {
      store8(v + (0 + j) * plane + c0, e[0][j] - e[2][j]);
      store8(v + (4 + j) * plane + c0, e[1][j] + e[2][j]);
      store8(v + (8 + j) * plane + c0, e[2][j] - e[1][j]);
      store8(v + (12 + j) * plane + c0, e[1][j] - e[3][j]);
    }
  }
}

// The output transform Y = A^T m A of one tile, c_out channels: m[xi] at m + xi * plane, the
// 2x2 outputs (rows x cols of them inside the image) at y (rows `row` floats apart, pixels c_out
// apart), plus bias (nullable), written or added (store).
inline void winograd_output(const float* __restrict m, std::int64_t plane, int c_out,
                            const float* bias, Store store, float* __restrict y, std::int64_t row,
                            int rows, int cols) {
  for (int c0 = 0; c0 < c_out; c0 += 8) {
    Vec8 s0[4], s1[4];  // A^T m
    for (int j = 0; j < 4; ++j) {
      const Vec8 m0 = load8(m + (0 + j) * plane + c0), m1 = load8(m + (4 + j) * plane + c0),
                 m2 = load8(m + (8 + j) * plane + c0), m3 = load8(m + (12 + j) * plane + c0);
      s0[j] = m0 + m1 + m2;
      s1[j] = m1 - m2 - m3;
    }
    Vec8 out[2][2] = {{s0[0] + s0[1] + s0[2], s0[1] - s0[2] - s0[3]},
                      {s1[0] + s1[1] + s1[2], s1[1] - s1[2] - s1[3]}};
    if (bias) {
      const Vec8 b = load8(bias + c0);
      for (auto& r : out)
        for (Vec8& o : r) o += b;
    }
    for (int a = 0; a < rows; ++a)
      for (int b = 0; b < cols; ++b) {
        float* o = y + a * row + b * c_out + c0;
        store8(o, store == Store::kAdd ? load8(o) + out[a][b] : out[a][b]);
      }
  }
}

// The 2x2 output tiles of one image of s for Winograd, in balanced groups of at most `most`
// tiles, and the buffers of a group: [16][group][c_in] transformed inputs and [16][group][ld_m]
// products or transformed dy, whose 16 planes (one per xi) are 64 bytes more than a whole number
// of 4 KiB apart, so that the transforms' 16 streams fall in different sets of L1 rather than in
// one. The input is read from a copy with its padding and an even number of rows and columns
// (pad_image), so that every tile's 4x4 patch is inside it.
struct WinogradTiles {
  int c_in, c_out, oh, ow, th, tw, hp, wp;
  std::int64_t image_tiles, per_image, group, v_plane, m_plane, pad_row, y_row;
  WinogradTiles(const Conv2dShape& s, std::int64_t ld_m, std::int64_t most)
      : c_in(s.c_in), c_out(s.c_out), oh(s.out_h()), ow(s.out_w()), th((oh + 1) / 2),
        tw((ow + 1) / 2), hp(2 * th + 2), wp(2 * tw + 2), image_tiles(std::int64_t{th} * tw),
        per_image((image_tiles + most - 1) / most), group((image_tiles + per_image - 1) / per_image),
        v_plane(group * c_in + 16), m_plane(group * ld_m + 16), pad_row(std::int64_t{wp} * c_in),
        y_row(std::int64_t{ow} * c_out) {}
  // Image `image` of s's input ([h][w][c_in]) into dst ([hp][wp][c_in]) at (pad_h, pad_w).
  void pad_image(const Conv2dShape& s, const float* image, float* dst) const {
    embed_image(image, s.h, s.w, c_in, s.pad_h, s.pad_w, hp, wp, dst);
  }
  // Calls tile(t, patch, out, rows, cols) for the tiles t = 0, 1, ... of group k of an image:
  // patch its 4x4 input in the padded image img, out the offset of its first output pixel in the
  // image's y (or dy), rows x cols of its 2x2 outputs inside the image. Returns the tile count.
  template <typename Tile>
  int for_each_tile(std::int64_t k, const float* img, Tile&& tile) const {
    const std::int64_t t0 = image_tiles * k / per_image;
    const int count = static_cast<int>(image_tiles * (k + 1) / per_image - t0);
    // The tile's row and column stepped along, not divided out per tile: a division costs more
    // than a small tile's transform.
    int ty = static_cast<int>(t0 / tw), tx = static_cast<int>(t0 % tw);
    for (int t = 0; t < count; ++t) {
      tile(t, img + 2 * ty * pad_row + std::int64_t{2 * tx} * c_in,
           2 * ty * y_row + std::int64_t{2 * tx} * c_out, std::min(2, oh - 2 * ty),
           std::min(2, ow - 2 * tx));
      if (++tx == tw) tx = 0, ++ty;
    }
    return count;
  }
};

// dM = A dY A^T of one tile, c_out channels: the adjoint of winograd_output, from the tile's 2x2
// dy at y (rows x cols of them inside the image, the rest zero), dM[xi] written at m + xi * plane.
inline void winograd_output_adjoint(const float* __restrict y, std::int64_t row, int c_out,
                                    int rows, int cols, float* __restrict m, std::int64_t plane) {
  for (int c0 = 0; c0 < c_out; c0 += 8) {
    Vec8 d[2][2];
    for (int a = 0; a < 2; ++a)
      for (int b = 0; b < 2; ++b)
        d[a][b] = a < rows && b < cols ? load8(y + a * row + b * c_out + c0) : splat8(0.0f);
    const Vec8 z[4][2] = {{d[0][0], d[0][1]},  // A dY
                          {d[0][0] + d[1][0], d[0][1] + d[1][1]},
                          {d[0][0] - d[1][0], d[0][1] - d[1][1]},
                          {-d[1][0], -d[1][1]}};
    for (int r = 0; r < 4; ++r) {
      store8(m + (4 * r + 0) * plane + c0, z[r][0]);
      store8(m + (4 * r + 1) * plane + c0, z[r][0] + z[r][1]);
      store8(m + (4 * r + 2) * plane + c0, z[r][0] - z[r][1]);
      store8(m + (4 * r + 3) * plane + c0, -z[r][1]);
    }
  }
}

// dw = G^T dU G for 8 (output channel, input channel) pairs, one a lane: dU[xi] = du(xi), dw[i][j]
// written by set(i, j, value). The adjoint of winograd_weight.
template <typename Get, typename Set>
void winograd_weight_adjoint(Get du, Set set) {
  Vec8 t[3][4];  // G^T dU
  for (int c = 0; c < 4; ++c) {
    const Vec8 d0 = du(c), d1 = du(4 + c), d2 = du(8 + c), d3 = du(12 + c);
    t[0][c] = d0 + 0.5f * (d1 + d2);
    t[1][c] = 0.5f * (d1 - d2);
    t[2][c] = 0.5f * (d1 + d2) + d3;
  }
  for (int i = 0; i < 3; ++i) {
    set(i, 0, t[i][0] + 0.5f * (t[i][1] + t[i][2]));
    set(i, 1, 0.5f * (t[i][1] - t[i][2]));
    set(i, 2, 0.5f * (t[i][1] + t[i][2]) + t[i][3]);
  }
}

// dw (OIHW, 3x3) = G^T dU G for every (output channel, input channel) of s, dU [16][c_in][ld_m]:
// 8 output channels to a vector, the input channels split over ctx's threads (Note [Winograd
// weight transforms]; s.c_out a multiple of 8, as winograd_applies has it).
inline void winograd_weight_grad_out(const CpuContext& ctx, const Conv2dShape& s, const float* du,
                                     std::int64_t ld_m, float* dw) {
  const std::int64_t co_step = std::int64_t{s.c_in} * 9;
  ctx.parallel_for(s.c_in, 1, [&](std::int64_t ci0, std::int64_t ci1) {
    for (std::int64_t ci = ci0; ci < ci1; ++ci)
      for (int co = 0; co < s.c_out; co += 8) {
        float* out = dw + co * co_step + ci * 9;
        winograd_weight_adjoint(
            [&](int xi) { return load8(du + (xi * s.c_in + ci) * ld_m + co); },
            [&](int i, int j, Vec8 v) {
              for (int l = 0; l < 8; ++l) out[l * co_step + i * 3 + j] = v[l];
            });
      }
  });
}

// The tiles per group of a Winograd forward: groups whose two buffers ([16][group][c_in] inputs,
// [16][group][ld_m] products) take at most about 48 KiB (24 tiles at 16 channels, 6 at 64;
// groups of 48 to 128 tiles measured no faster on a 2-core Zen 3 EPYC), so that a group's
// products read and write L1 and L2 rather than memory; at least `min_tiles`, the register
// kernel's pixels.
inline std::int64_t winograd_forward_group(int c_in, std::int64_t ld_m, int min_tiles) {
  return std::clamp<std::int64_t>(768 / (c_in + ld_m), min_tiles, 96);
}

// The plan of a Winograd weight gradient on blocks of `block` output channels and register tiles
// of up to `max_q` input channels, its transforms `value_bytes` a value (4 for fp32, 2 for bf16
// pairs): dU [16][c_in][ld_m], its tiles (WeightTiles with xi as the kernel row), and the image's
// groups of Winograd tiles. Larger groups than the forward's (buffers of at most about 256 KiB,
// in L2): each register tile sums a group's tiles between loading and storing its accumulators.
// In fp32, groups of a quarter of that size measured slower, a quadruple no faster (2-core Zen 3
// EPYC). Where an image has fewer tiles than a group holds, a pass takes the tiles of several
// images (`images`, all of one image group's), one image after the other: the register tiles
// then load and store their accumulators once per pass rather than once per image, and sum the
// same tiles in the same order (the same bits). On ResNet-20's 64->64 8x8 layer (16 tiles an
// image; two images a pass in fp32, four in bf16) the bf16 weight gradient went from 1.12-1.15
// ms to 0.92-1.02 on a 2-core Zen 4 EPYC (`towerflow_bench_ops --threads 2 --precision bf16
// --filter resnet20`, its winograd_bwd_weight_bf16 row, three runs alternating with one image
// a pass).
struct WinogradWeightGradPlan {
  std::int64_t ld_m, du_size;
  WeightTiles tiles;
  WinogradTiles g;
  int images;                     // images per pass
  std::int64_t v_plane, m_plane;  // a pass's [16][tiles][c_in] and [16][tiles][ld_m] buffers
  WinogradWeightGradPlan(const Conv2dShape& s, int block, int max_q, int value_bytes)
      : ld_m(std::int64_t{(s.c_out + block - 1) / block} * block), du_size(16 * s.c_in * ld_m),
        tiles(16, s.c_in, max_q, static_cast<int>(ld_m / block)),
        g(s, ld_m, most_tiles(s.c_in, ld_m, value_bytes)),
        images(g.per_image > 1 ? 1
                               : static_cast<int>(std::max<std::int64_t>(
                                     1, most_tiles(s.c_in, ld_m, value_bytes) / g.image_tiles))),
        v_plane(images * g.group * s.c_in + 16), m_plane(images * g.group * ld_m + 16) {}
  // The tiles whose transforms take about 256 KiB.
  static std::int64_t most_tiles(int c_in, std::int64_t ld_m, int value_bytes) {
    return std::clamp<std::int64_t>(16384 / (value_bytes * (c_in + ld_m)), 6, 1024 / value_bytes);
  }
};

}  // namespace towerflow::cpu::TW_ISA::detail
