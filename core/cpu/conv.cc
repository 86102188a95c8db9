#include "core/cpu/conv.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <limits>
#include <utility>
#include <vector>

#include "core/cpu/conv_impl.h"
#include "core/cpu/simd_impl.h"
#include "core/cpu/winograd_impl.h"
#include "core/error.h"

// Note [Channels-last on the CPU]
// With NHWC activations the kw*c_in values that one kernel row touches for one output pixel are
// contiguous in memory, so a convolution is an implicit GEMM with no im2col buffer: for a tile of
// P neighbouring output pixels and B = L*V output channels (V vectors of L lanes), the inner
// loop walks q over those kw*c_in contiguous inputs, broadcasts x[pixel p, q] and multiplies it
// by the V packed weight vectors w[q, B channels]. The accumulators (P x V vectors) stay in
// registers for the whole reduction; every loaded weight vector is used P times and every
// broadcast V times (Note [Register tiles for 8 and 16 lanes]). The working
// set is one (padded) image and one block of packed weights, which stay in L1/L2 -- the reason a
// whole-batch im2col GEMM is memory-bound at 16 channels and this is not. With NCHW the same
// reduction would gather kw values from kw different cache lines per channel.
//
// The three convolutions map onto two register kernels:
//   forward                  direct_conv over x with weights packed [c_out/B][kh][kw*c_in][B]
//   backward input, stride 1 direct_conv over dy with the kernel flipped and its channels
//                            swapped, padding kh-1-pad_h: the transposed convolution
//   backward input, stride>1 direct_conv's register kernel per stride phase
//                            (Note [Backward input by stride phases])
//   backward weight          weight_grad: accumulators are a tile of Q inputs q x B channels,
//                            summed over every output pixel, the same register shape as forward
// The three passes of a 3x3 stride-1 convolution can also run as Winograd's F(2x2, 3x3), whose
// matrix products run on these register kernels (Note [Winograd convolution]); the kernel choice
// takes it where it measures faster.
//
// Note [Register tiles for 8 and 16 lanes]
// The kernels are written once for vectors of L lanes (Vec<L> in simd_impl.h) and instantiated
// for L = 8 (AVX2, or SSE pairs on a portable build) and, where the build targets AVX-512
// (kWideLanes == 16), for L = 16. with_block picks (L, V) from the channel count:
//   channels    AVX2      AVX-512
//   1..8        8 x 1     8 x 1
//   9..16       8 x 2     8 x 2 (16 x 1 measured slower, below)
//   17..32      8 x 2     16 x 2
//   33..        8 x 2     16 x 4 when 64-channel blocks waste no more lanes than 32, else 16 x 2
// Tile sizes come from the register files: AVX-512 has 32 vector registers (ymm0-31 too), so up
// to 24 accumulators (P*V or Q*V), plus V weight vectors and a broadcast; AVX2 has 16, so 12. The
// forward tile also holds P input pointers in general registers: P <= 12 with an index that
// counts up to zero keeps them all there (a 24-pixel tile spilled half of them, and each spill
// was one more load per FMA). Measured on Ice Lake (2 FMA units per core): a 512-bit FMA with an
// embedded broadcast issues about one broadcast load per cycle, half the FMA rate, so a block
// of one 16-lane vector (P FMAs per P broadcasts) is no faster in isolation than the 8-lane
// 8 x 2 block, and in a whole layer it was 10-25% slower (the core also clocks lower while it
// runs 512-bit FMAs). 16 x 2 and 16 x 4 reuse each broadcast two or four times and reach about
// 1.5 times the 8-lane speed in isolation. So 16 channels keep 8 x 2, and 48 channels get two
// 16 x 2 blocks (25% of the lanes idle) rather than three 16 x 1.
// On AVX-512 a forward tile of 2 vectors stops at 9 pixels: with 10 to 12 pixels, GCC 12 keeps
// one or both weight vectors of the inner loop on the stack (a spilled general register lands in
// a vector register, and the allocator gives a weight vector's register up), so half or all of
// the FMAs read memory (10 pixels spill too). On the Ice Lake Xeon, 9 pixels run ResNet-20's
// 32->32 forward at 276 GFLOP/s where 12 ran it at 134 (re-measure with
// `towerflow_bench_ops --threads 2 --filter "32->32"`). One-vector tiles (up to 8 channels) keep
// 12 pixels: 9 measure 2% slower on tfcnn's first layer.
// The forward and stride-1 backward-input convolutions of 16-channel layers with 3-wide kernels
// go further with the row kernel, which reuses each broadcast across kernel columns
// (Note [Row kernel for 16 channels]).
//
// Note [Deterministic reductions]
// Every output element is computed by one thread in a fixed order (forward and backward input
// split output rows over threads; backward weight sums fixed image groups or splits dw tiles,
// Note [Weight gradient: image groups or tiles]), so results are bitwise identical for any
// thread count.

namespace towerflow::cpu::TW_ISA {

using detail::embed_image;
using detail::for_each_tile;
using detail::for_image_rows;
using detail::kernel_table;
using detail::kWideLanes;
using detail::pad_rows;
using detail::padded_bias;
using detail::padded_image;
using detail::padded_image_buffer;
using detail::padded_rows;
using detail::parallel_rows;
using detail::pixel_offsets;
using detail::prefetch_floats;
using detail::sum_weight_grad;
using detail::round_up;
using detail::Scratch;
using detail::scratch;
using detail::unpack_weight_grad;
using detail::WeightTiles;
using detail::winograd_applies;
using detail::winograd_forward_group;
using detail::winograd_input;
using detail::winograd_output;
using detail::winograd_output_adjoint;
using detail::winograd_weights;
using detail::winograd_weight_grad_out;
using detail::WinogradTiles;
using detail::WinogradWeightGradPlan;
using detail::zeroed_scratch;
using detail::StridePhases;
using detail::Store;
using detail::Vec;
using detail::Vec8;
using detail::load8;
using detail::splat8;
using detail::store8;

namespace {

// Largest tiles (Note [Register tiles for 8 and 16 lanes]). Forward: P pixels x V vectors of
// accumulators, P <= 12 so that the P input pointers stay in general registers, and P <= 9 for
// two vectors on AVX-512, where more keeps weight vectors on the stack. Weight gradient: Q
// inputs x V vectors, read through one pointer, so Q is bounded by the vector registers only.
// With AVX2 (16 registers) both are 12 / V; with AVX-512 (32) 24 / V.
constexpr int kAccumulators = kWideLanes == 16 ? 24 : 12;
template <int V>
constexpr int kMaxPixels = std::min(kWideLanes == 16 && V == 2 ? 9 : 12, kAccumulators / V);
template <int V>
constexpr int kMaxInputs = kAccumulators / V;

// Calls fn.template operator()<L, V>() with the vector width L and the vectors per channel
// block V to use for `channels` output channels (Note [Register tiles for 8 and 16 lanes]).
template <typename Fn>
void with_block(int channels, Fn&& fn) {
  if (channels <= 8) return fn.template operator()<8, 1>();
  if constexpr (kWideLanes == 16) {
    // Never one 16-lane vector per block: it is bound by the broadcasts. 64-channel blocks
    // where they waste no more lanes than 32: 32 -> 16x2, 48 -> 16x2 (two blocks),
    // 64 -> 16x4, 96 -> 16x2, 128 -> 16x4.
    if (channels <= 16) return fn.template operator()<8, 2>();
    if (channels > 32 && round_up(channels, 64) == round_up(channels, 32))
      return fn.template operator()<16, 4>();
    return fn.template operator()<16, 2>();
  } else {
    return fn.template operator()<8, 2>();
  }
}

// ---- the forward register kernel -----------------------------------------------------------

// out[k] = src[k] for k < lanes, or out[k] += src[k] (Store::kAdd).
inline void store_lanes(const float* src, int lanes, Store store, float* out) {
  if (store == Store::kAdd) {
    for (int k = 0; k < lanes; ++k) out[k] += src[k];
  } else {
    std::copy(src, src + lanes, out);
  }
}

// Computes P output pixels x L*V channels with vectors of L lanes. Pixel p reads its inputs for
// kernel row 0 at img + offs[p] (the q-th at + q); kernel row i is row_step floats further. wp
// is the block's packed weights [kh][q_len][L*V]. bias (nullable) holds L*V values. Output
// pixel p is written (or added, Store::kAdd) at out + out_offs[p].
template <int L, int P, int V>
void conv_tile(const float* __restrict img, const std::int64_t* offs, std::int64_t row_step,
               int kh, int q_len, const float* __restrict wp, const float* bias,
               float* __restrict out, const std::int64_t* out_offs, int lanes, Store store) {
  using W = Vec<L>;
  if (store == Store::kAdd) {  // Note [Prefetching what a tile adds to]
#pragma GCC unroll 32
    for (int p = 0; p < P; ++p) prefetch_floats(out + out_offs[p], lanes);
  }
  typename W::type acc[P][V];
#pragma GCC unroll 32
  for (int p = 0; p < P; ++p)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[p][v] = bias ? W::load(bias + L * v) : W::splat(0.0f);
  // xe[p] points one past the inputs of kernel row i, indexed by q - q_len in [-q_len, 0): the
  // loop then ends on its index reaching zero, which leaves one more general register for the
  // P input pointers (a 12-pixel tile otherwise spills two of them).
  const float* xe[P];
#pragma GCC unroll 32
  for (int p = 0; p < P; ++p) xe[p] = img + offs[p] + q_len;
  const float* wr = wp;
  for (int i = 0; i < kh; ++i) {
    for (std::ptrdiff_t q = -q_len; q != 0; ++q, wr += L * V) {
      typename W::type wv[V];
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) wv[v] = W::load(wr + L * v);
#pragma GCC unroll 32
      for (int p = 0; p < P; ++p) {
        const typename W::type b = W::splat(xe[p][q]);
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) acc[p][v] += b * wv[v];
      }
    }
#pragma GCC unroll 32
    for (int p = 0; p < P; ++p) xe[p] += row_step;
  }
  if (lanes == L * V) {
    if (store == Store::kAdd) {
#pragma GCC unroll 32
      for (int p = 0; p < P; ++p)
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) acc[p][v] += W::load(out + out_offs[p] + L * v);
    }
#pragma GCC unroll 32
    for (int p = 0; p < P; ++p)
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) W::store(out + out_offs[p] + L * v, acc[p][v]);
  } else {
    for (int p = 0; p < P; ++p) {
      float tmp[L * V];
      for (int v = 0; v < V; ++v) W::store(tmp + L * v, acc[p][v]);
      store_lanes(tmp, lanes, store, out + out_offs[p]);
    }
  }
}

// conv_tile<L, P, V> for P = 1 .. kMaxPixels<V>, indexed by P - 1.
template <int L, int V>
constexpr auto kConvTiles = kernel_table<kMaxPixels<V>>([]<int P>() { return &conv_tile<L, P, V>; });

// Packs weights for direct_conv: dst[cob][i][j*c_in + ci][b] = get(co = cob*B + b, ci, i, j),
// zero where co >= c_out.
template <typename Get>
void pack_weights(int c_out, int c_in, int kh, int kw, int block, float* dst, Get get) {
  const int blocks = (c_out + block - 1) / block;
  std::int64_t o = 0;
  for (int cb = 0; cb < blocks; ++cb)
    for (int i = 0; i < kh; ++i)
      for (int j = 0; j < kw; ++j)
        for (int ci = 0; ci < c_in; ++ci)
          for (int b = 0; b < block; ++b, ++o) {
            const int co = cb * block + b;
            dst[o] = co < c_out ? get(co, ci, i, j) : 0.0f;
          }
}

// y = conv(x, w) (+ bias) for shape s, with w already packed by pack_weights in blocks of L*V.
// Threads split the output rows; within an image a thread tiles its output pixels in row-major
// order, so a tile may span rows (small 8x8 outputs still get full tiles). Each output element
// is written once, by one thread.
template <int L, int V>
void direct_conv(const CpuContext& ctx, const Conv2dShape& s, const float* x, const float* wp,
                 const float* bias_padded, Store store, float* y) {
  constexpr int kBlock = L * V;
  constexpr int kP = kMaxPixels<V>;
  const int oh = s.out_h(), ow = s.out_w();
  const int q_len = s.kw * s.c_in;
  const std::int64_t wblock = static_cast<std::int64_t>(s.kh) * q_len * kBlock;
  const std::int64_t row_step = std::int64_t{s.w + 2 * s.pad_w} * s.c_in;
  const std::int64_t pix_step = std::int64_t{s.stride_w} * s.c_in;
  const std::int64_t image_in = std::int64_t{s.h} * s.w * s.c_in;

  parallel_rows(ctx, s.n, oh, std::int64_t{ow} * s.c_out * s.kh * q_len, [&](std::int64_t r0, std::int64_t r1) {
    float* buf = padded_image_buffer(s);
    for_image_rows(r0, r1, oh, [&](std::int64_t n, int row_begin, int row_end) {
      const float* img = padded_rows(s, x + n * image_in, row_begin, row_end, buf);
      const std::int64_t pix_begin = std::int64_t{row_begin} * ow;
      float* ybase = y + (n * oh * ow + pix_begin) * s.c_out;
      for_each_tile<kP>(std::int64_t{row_end - row_begin} * ow, s.c_out, kBlock, [&](std::int64_t p0, int p, int cb, int lanes) {
        std::int64_t offs[kP], out_offs[kP];
        pixel_offsets(pix_begin + p0, p, ow, s.stride_h * row_step, pix_step, s.c_out, offs, out_offs);
        kConvTiles<L, V>[p - 1](img, offs, row_step, s.kh, q_len, wp + cb * wblock,
                                bias_padded ? bias_padded + cb * kBlock : nullptr,
                                ybase + p0 * s.c_out + cb * kBlock, out_offs, lanes, store);
      });
    });
  });
}

// ---- the row kernel for 16 output channels (AVX-512) ---------------------------------------

// Note [Row kernel for 16 channels]
// The tiles above reuse a broadcast input once per vector of the channel block, so a block of
// one 16-lane vector is bound by the broadcasts (Note [Register tiles for 8 and 16 lanes]).
// Along an output row, though, a stride-1 convolution reads the same input pixel for KW
// neighbouring outputs: input column c, kernel column j feeds output c - j. The row kernel
// keeps T outputs of one row (one 16-lane vector each) and the KW weight vectors of one
// (kernel row, input channel) in registers, and multiplies every broadcast input by all KW of
// them: KW FMAs per broadcast, 16 lanes each, with no broadcast bound. Input pixels are c_in
// floats apart; c_in is a template parameter (3 for an RGB input, 16 inside the stage) so that
// every broadcast's address is a constant offset from one pointer. Weights are packed
// [kh][c_in][KW][16], zero past c_out. Each output is summed in a fixed order (kernel row,
// input channel, kernel column) by one thread, as everywhere else.

constexpr int kRowTile = 16;  // T <= 16: T accumulators + KW weights + a broadcast < 32 registers

template <int T, int KW, int CIN>
void conv_row_tile(const float* __restrict in, std::int64_t row_step, int kh,
                   const float* __restrict wp, const float* bias, float* __restrict out,
                   int c_out, Store store) {
  using W = Vec<16>;
  if (store == Store::kAdd) {  // Note [Prefetching what a tile adds to]
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) prefetch_floats(out + std::int64_t{t} * c_out, c_out);
  }
  typename W::type acc[T];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) acc[t] = bias ? W::load(bias) : W::splat(0.0f);
  for (int i = 0; i < kh; ++i, in += row_step) {
    const float* xr = in;
    for (int ci = 0; ci < CIN; ++ci, ++xr, wp += KW * 16) {
      typename W::type w[KW];
#pragma GCC unroll 8
      for (int j = 0; j < KW; ++j) w[j] = W::load(wp + 16 * j);
#pragma GCC unroll 32
      for (int c = 0; c < T + KW - 1; ++c) {
        const typename W::type b = W::splat(xr[c * CIN]);
#pragma GCC unroll 8
        for (int j = 0; j < KW; ++j)
          if (c - j >= 0 && c - j < T) acc[c - j] += b * w[j];
      }
    }
  }
  if (c_out == 16) {
    if (store == Store::kAdd) {
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) acc[t] += W::load(out + 16 * t);
    }
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) W::store(out + 16 * t, acc[t]);
  } else {
    for (int t = 0; t < T; ++t) {
      float tmp[16];
      W::store(tmp, acc[t]);
      store_lanes(tmp, c_out, store, out + std::int64_t{t} * c_out);
    }
  }
}

// Whether row_conv handles this convolution: 9..16 output channels on an AVX-512 build, a 3-wide
// kernel at horizontal stride 1, and an input channel count it is instantiated for.
bool row_kernel_applies(const Conv2dShape& s) {
  return kWideLanes == 16 && s.c_out > 8 && s.c_out <= 16 && s.kw == 3 && s.stride_w == 1 &&
         (s.c_in == 3 || s.c_in == 16);
}

// y = conv(x, w) (+ bias) with the row kernel (y += with Store::kAdd); get(co, ci, i, j) gives
// the weights. Threads split the output rows, as in direct_conv; each row is cut into balanced
// tiles of <= 16 pixels.
template <int CIN, typename Get>
void row_conv(const CpuContext& ctx, const Conv2dShape& s, const float* x, const float* bias,
              Store store, float* y, Get get) {
  constexpr int kKW = 3;
  static constexpr auto kTiles = kernel_table<kRowTile>([]<int T>() { return &conv_row_tile<T, kKW, CIN>; });
  float* wp = scratch(Scratch::kWeights, static_cast<std::size_t>(s.kh) * CIN * kKW * 16);
  for (int i = 0, o = 0; i < s.kh; ++i)
    for (int ci = 0; ci < CIN; ++ci)
      for (int j = 0; j < kKW; ++j)
        for (int co = 0; co < 16; ++co, ++o) wp[o] = co < s.c_out ? get(co, ci, i, j) : 0.0f;
  const float* bias16 = padded_bias(bias, s.c_out, 16);
  const int oh = s.out_h(), ow = s.out_w();
  const std::int64_t row_step = std::int64_t{s.w + 2 * s.pad_w} * CIN;  // s.c_in == CIN
  const std::int64_t image_in = std::int64_t{s.h} * s.w * CIN;
  const int tiles = (ow + kRowTile - 1) / kRowTile;
  parallel_rows(ctx, s.n, oh, std::int64_t{ow} * s.c_out * s.kh * kKW * CIN, [&](std::int64_t r0, std::int64_t r1) {
    float* buf = padded_image_buffer(s);
    for_image_rows(r0, r1, oh, [&](std::int64_t n, int row_begin, int row_end) {
      const float* img = padded_rows(s, x + n * image_in, row_begin, row_end, buf);
      for (int oy = row_begin; oy < row_end; ++oy) {
        const float* in = img + std::int64_t{oy} * s.stride_h * row_step;
        float* yrow = y + (n * oh + oy) * std::int64_t{ow} * s.c_out;
        for (int t = 0; t < tiles; ++t) {
          const int x0 = ow * t / tiles, width = ow * (t + 1) / tiles - x0;
          kTiles[width - 1](in + std::int64_t{x0} * CIN, row_step, s.kh, wp, bias16,
                            yrow + std::int64_t{x0} * s.c_out, s.c_out, store);
        }
      }
    });
  });
}

// Runs direct_conv with the channel block that with_block picks for c_out, writing y or adding
// to it (store). get(co, ci, i, j) gives the weight of the convolution described by s.
template <typename Get>
void run_direct(const CpuContext& ctx, const Conv2dShape& s, const float* x, const float* bias,
                Store store, float* y, Get get) {
  if (row_kernel_applies(s)) {
    if (s.c_in == 3) return row_conv<3>(ctx, s, x, bias, store, y, get);
    return row_conv<16>(ctx, s, x, bias, store, y, get);
  }
  with_block(s.c_out, [&]<int L, int V>() {
    constexpr int kBlock = L * V;
    const std::int64_t blocks = (s.c_out + kBlock - 1) / kBlock;
    float* wp = scratch(Scratch::kWeights,
                        static_cast<std::size_t>(blocks * kBlock * s.c_in * s.kh * s.kw));
    pack_weights(s.c_out, s.c_in, s.kh, s.kw, kBlock, wp, get);
    direct_conv<L, V>(ctx, s, x, wp, padded_bias(bias, s.c_out, blocks * kBlock), store, y);
  });
}

// ---- the weight-gradient register kernel ---------------------------------------------------

// acc[q][v] += sum over `rows` output rows and `ow` pixels of x[pixel, q0 + q] * dy[pixel, Lv..],
// with vectors of L lanes. xp points at x for (row 0, pixel 0, kernel row i, q0); dyp at dy for
// (row 0, pixel 0, block).
template <int L, int Q, int V>
void weight_tile(const float* __restrict xp, std::int64_t pix_step, std::int64_t x_row_step,
                 const float* __restrict dyp, std::int64_t ld_dy, std::int64_t dy_row_step,
                 int rows, int ow, float* __restrict acc_mem, std::int64_t ld_acc) {
  using W = Vec<L>;
  typename W::type acc[Q][V];
#pragma GCC unroll 32
  for (int q = 0; q < Q; ++q)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[q][v] = W::load(acc_mem + q * ld_acc + L * v);
  for (int r = 0; r < rows; ++r) {
    const float* xr = xp + r * x_row_step;
    const float* dr = dyp + r * dy_row_step;
    for (int c = 0; c < ow; ++c, xr += pix_step, dr += ld_dy) {
      typename W::type d[V];
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) d[v] = W::load(dr + L * v);
#pragma GCC unroll 32
      for (int q = 0; q < Q; ++q) {
        const typename W::type b = W::splat(xr[q]);
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) acc[q][v] += b * d[v];
      }
    }
  }
#pragma GCC unroll 32
  for (int q = 0; q < Q; ++q)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) W::store(acc_mem + q * ld_acc + L * v, acc[q][v]);
}

// dw = correlate(x, dy). The result is built in dwp [kh][kw*c_in][blocks*B] (rows of q, columns
// of output channels) from tiles of Q q-values x B channels, each tile's accumulators held in
// registers over a pass of output pixels.
template <int L, int V>
void weight_grad(const CpuContext& ctx, const Conv2dShape& s, const float* x, const float* dy,
                 float* dw) {
  constexpr int kBlock = L * V;
  constexpr int kQ = kMaxInputs<V>;
  static constexpr auto kTiles = kernel_table<kQ>([]<int Q>() { return &weight_tile<L, Q, V>; });
  const int oh = s.out_h(), ow = s.out_w();
  const int blocks = (s.c_out + kBlock - 1) / kBlock;
  const WeightTiles tiles(s.kh, s.kw * s.c_in, kQ, blocks);
  const std::int64_t ld_acc = std::int64_t{blocks} * kBlock;
  const std::int64_t dw_size = std::int64_t{s.kh} * tiles.q_len * ld_acc;
  float* dwp = zeroed_scratch(Scratch::kWeights, dw_size);

  const std::int64_t row_step = std::int64_t{s.w + 2 * s.pad_w} * s.c_in;
  const std::int64_t pix_step = std::int64_t{s.stride_w} * s.c_in;
  const std::int64_t image_in = std::int64_t{s.h} * s.w * s.c_in;
  const bool dy_dense = s.c_out % kBlock == 0;
  const std::int64_t ld_dy = dy_dense ? s.c_out : ld_acc;
  const std::int64_t image_out = std::int64_t{oh} * ow;
  // Rows per pass: about 96 pixels, so the dy slice and x rows of a pass stay in L1 across the
  // tiles that share them. Where a pixel's x and dy each take at most one 64-byte line (a pixel
  // step of at most 16 input floats, one block of at most 16 output channels), a tile reads both
  // as dense streams that the L2 prefetchers keep up with, and passes of about 1024 pixels (at
  // most 64 KiB of dy, a CIFAR image whole) make ten times fewer tile calls: ResNet-20's 16->16
  // weight gradient ran at 172-175 GFLOP/s that way against 162-164 in 96-pixel passes on a
  // 2-core Zen 3 EPYC (AVX2); its 16->32 stride-2 one, whose pixels take two lines, ran 10%
  // slower (`towerflow_bench_ops --threads 2 --filter resnet20`).
  const bool dense_pixels = pix_step <= 16 && ld_dy <= 16;
  const int rows_per_pass = std::max(1, std::min(oh, (dense_pixels ? 1024 : 96) / ow));

  // Adds images [n0, n1), tiles [t0, t1) into dst ([kh * q_len][ld_acc]), image by image.
  auto accumulate = [&](int n0, int n1, std::int64_t t0, std::int64_t t1, float* dst) {
    float* xbuf = padded_image_buffer(s);
    float* dybuf = dy_dense ? nullptr : scratch(Scratch::kOutput, static_cast<std::size_t>(image_out * ld_dy));
    for (int n = n0; n < n1; ++n) {
      const float* img = padded_image(s, x + n * image_in, xbuf);
      const float* dimg = dy + n * image_out * s.c_out;
      if (!dy_dense) {
        for (std::int64_t p = 0; p < image_out; ++p) {
          std::copy(dimg + p * s.c_out, dimg + (p + 1) * s.c_out, dybuf + p * ld_dy);
          std::fill(dybuf + p * ld_dy + s.c_out, dybuf + (p + 1) * ld_dy, 0.0f);
        }
        dimg = dybuf;
      }
      for (int r0 = 0; r0 < oh; r0 += rows_per_pass) {
        const int rows = std::min(rows_per_pass, oh - r0);
        for (std::int64_t t = t0; t < t1; ++t) {
          const WeightTiles::Tile& w = tiles[t];
          kTiles[w.q - 1](img + (std::int64_t{r0} * s.stride_h + w.i) * row_step + w.q0, pix_step,
                          s.stride_h * row_step, dimg + std::int64_t{r0} * ow * ld_dy + w.cb * kBlock,
                          ld_dy, ow * ld_dy, rows, ow,
                          dst + (std::int64_t{w.i} * tiles.q_len + w.q0) * ld_acc + w.cb * kBlock, ld_acc);
        }
      }
    }
  };

  const std::int64_t macs_per_tile = std::int64_t{s.n} * image_out * kQ * kBlock;
  sum_weight_grad(ctx, s.n, tiles.count(), std::max<std::int64_t>(1, 200000 / macs_per_tile), dw_size,
                  dwp, accumulate);

  unpack_weight_grad(s, dwp, ld_acc, dw);
}

// ---- the weight-gradient row kernel for 16 output channels (AVX-512) -------------------------

// Note [Weight-gradient row kernel]
// The weight gradient's tiles broadcast one input per output pixel and multiply it by the dy
// vectors of the block, so with a single 16-lane vector of output channels they are broadcast
// bound, like the forward tiles. At stride 1, though, an input pixel (r, c) meets dy at
// (r - i, c - j) for every tap: this kernel holds dw[i][0..KW)[G input channels] (KW*G 16-lane
// accumulators) for one kernel row i and walks the input row by row, loading the KW dy vectors
// of (c - j) once per input column and multiplying each by the G broadcast inputs. dy is copied
// into a frame two columns wider on each side, zero outside the image, so every tap reads inside
// it; the zero products are the KW-1 extra columns per row. Each dw element is still summed by
// one thread in a fixed order (images in order, then rows, then columns).

template <int G>
void weight_row_pass(const float* __restrict x, std::int64_t x_row_step, int c_in,
                     const float* __restrict dyp, std::int64_t dy_row_step, int rows, int cols,
                     float* __restrict acc_mem, std::int64_t ld_j) {
  constexpr int kKW = 3;
  using W = Vec<16>;
  typename W::type acc[kKW][G];
#pragma GCC unroll 4
  for (int j = 0; j < kKW; ++j)
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) acc[j][g] = W::load(acc_mem + j * ld_j + 16 * g);
  for (int r = 0; r < rows; ++r) {
    const float* xc = x + r * x_row_step;
    const float* dc = dyp + r * dy_row_step + 16 * (kKW - 1);
    for (int c = 0; c < cols; ++c, xc += c_in, dc += 16) {
      typename W::type d[kKW];
#pragma GCC unroll 4
      for (int j = 0; j < kKW; ++j) d[j] = W::load(dc - 16 * j);
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) {
        const typename W::type b = W::splat(xc[g]);
#pragma GCC unroll 4
        for (int j = 0; j < kKW; ++j) acc[j][g] += b * d[j];
      }
    }
  }
#pragma GCC unroll 4
  for (int j = 0; j < kKW; ++j)
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) W::store(acc_mem + j * ld_j + 16 * g, acc[j][g]);
}

// Whether weight_grad_rows handles this convolution: 9..16 output channels on an AVX-512 build,
// a 3-wide kernel, stride 1.
bool weight_row_kernel_applies(const Conv2dShape& s) {
  return kWideLanes == 16 && s.c_out > 8 && s.c_out <= 16 && s.kw == 3 && s.stride_h == 1 &&
         s.stride_w == 1;
}

void weight_grad_rows(const CpuContext& ctx, const Conv2dShape& s, const float* x, const float* dy,
                      float* dw) {
  constexpr int kKW = 3, kG = 8;
  static constexpr auto kPasses = kernel_table<kG>([]<int G>() { return &weight_row_pass<G>; });
  const int oh = s.out_h(), ow = s.out_w();
  const int wpad = s.w + 2 * s.pad_w;
  const std::int64_t row_step = std::int64_t{wpad} * s.c_in;
  const std::int64_t image_in = std::int64_t{s.h} * s.w * s.c_in;
  const std::int64_t image_out = std::int64_t{oh} * ow * s.c_out;
  // dy framed: [oh][ow + 2*(KW-1)][16], dy at column k - (KW-1).
  const int dy_cols = ow + 2 * (kKW - 1);
  const std::int64_t dy_row_step = std::int64_t{dy_cols} * 16;
  const int ci_groups = (s.c_in + kG - 1) / kG;
  const std::int64_t tasks = std::int64_t{s.kh} * ci_groups;
  const std::int64_t ld_j = std::int64_t{s.c_in} * 16;
  const std::int64_t dw_size = std::int64_t{s.kh} * kKW * ld_j;  // [i][j][ci][16]
  float* dwp = zeroed_scratch(Scratch::kWeights, dw_size);

  // Adds images [n0, n1), tasks [t0, t1) (task = kernel row, input-channel group) into dst.
  auto accumulate = [&](int n0, int n1, std::int64_t t0, std::int64_t t1, float* dst) {
    float* xbuf = padded_image_buffer(s);
    float* dybuf = zeroed_scratch(Scratch::kOutput, oh * dy_row_step);
    for (int n = n0; n < n1; ++n) {
      const float* img = padded_image(s, x + n * image_in, xbuf);
      const float* dimg = dy + n * image_out;
      for (int r = 0; r < oh; ++r) {
        const float* src = dimg + std::int64_t{r} * ow * s.c_out;
        float* dst_row = dybuf + r * dy_row_step + (kKW - 1) * 16;
        if (s.c_out == 16) {
          for (int c = 0; c < ow; ++c) Vec<16>::store(dst_row + 16 * c, Vec<16>::load(src + 16 * c));
        } else {
          for (int c = 0; c < ow; ++c) std::copy(src + c * s.c_out, src + (c + 1) * s.c_out, dst_row + 16 * c);
        }
      }
      for (std::int64_t t = t0; t < t1; ++t) {
        const int i = static_cast<int>(t / ci_groups);
        const int ci0 = static_cast<int>(t % ci_groups) * kG;
        const int g = std::min(kG, s.c_in - ci0);
        kPasses[g - 1](img + i * row_step + ci0, row_step, s.c_in, dybuf, dy_row_step, oh, wpad,
                       dst + (std::int64_t{i} * kKW * s.c_in + ci0) * 16, ld_j);
      }
    }
  };
  sum_weight_grad(ctx, s.n, tasks, 1, dw_size, dwp, accumulate);
  unpack_weight_grad(s, dwp, 16, dw);  // s.kw == kKW (weight_row_kernel_applies)
}

// ---- backward input by stride phases ---------------------------------------------------------

// Note [Backward input by stride phases]
// dx[ih, iw] sums dy[oh, ow] * w[i, j] over oh*s - p + i = ih. For a given ih only the kernel
// rows i = a, a + s, a + 2s, ... with a = (ih + p) mod s contribute, from dy rows
// u, u - 1, u - 2, ... with u = (ih + p - a) / s. So the dx pixels of one phase (a, b) form a
// stride-1 correlation of dy with a sub-kernel of ceil((kh - a) / s) x ceil((kw - b) / s) taps
// (flipped, channels swapped): the same register kernel as forward, fed with per-pixel input and
// output offsets. No zeros are multiplied, nothing is scattered, and each dx element is added
// once into its zeroed row (Note [Phases into zeroed rows] in conv_impl.h). dy is embedded in a
// zero frame (top = ceil(kh / s) - 1 rows, likewise left) so that every tap reads inside the
// buffer; phases with no taps (a 1x1 kernel at stride 2) are zero.

template <int L, int V>
void backward_input_phases(const CpuContext& ctx, const Conv2dShape& s, const float* dy,
                           const float* w, Store store, float* dx) {
  constexpr int kBlock = L * V;
  constexpr int kP = kMaxPixels<V>;
  const int blocks = (s.c_in + kBlock - 1) / kBlock;
  // Packed sub-kernels of every phase, one after the other: [a][b][block][i'][j'][co][lane].
  const StridePhases g(s, std::int64_t{blocks} * kBlock * s.c_out);
  const std::int64_t row_step = std::int64_t{g.wp} * s.c_out;
  float* wp = scratch(Scratch::kWeights, static_cast<std::size_t>(g.phase_offset.back()));
  g.pack_phases(s, w, [&](std::int64_t offset, int ma, int mb, auto get) {
    pack_weights(s.c_in, s.c_out, ma, mb, kBlock, wp + offset, get);
  });

  const std::int64_t image_in = std::int64_t{s.h} * s.w * s.c_in;
  const std::int64_t image_out = std::int64_t{g.oh} * g.ow * s.c_out;
  const std::int64_t macs_per_row = std::int64_t{s.w} * s.c_in * s.c_out * s.kh * s.kw / (g.sh * g.sw);
  parallel_rows(ctx, s.n, s.h, macs_per_row, [&](std::int64_t r0, std::int64_t r1) {
    float* buf = scratch(Scratch::kInput, static_cast<std::size_t>(g.hp) * row_step);
    for_image_rows(r0, r1, s.h, [&](std::int64_t n, int row_begin, int row_end) {
      embed_image(dy + n * image_out, g.oh, g.ow, s.c_out, g.top, g.left, g.hp, g.wp, buf);
      float* img_dx = dx + n * image_in;
      const Store st = g.zero_rows_to_add(s, row_begin, row_end, store, img_dx);  // Note [Phases into zeroed rows]
      g.for_each_phase_tile<kP>(s, row_begin, row_end, row_step, s.c_out, kBlock, st, img_dx,
                                [&](int phase, int ma, int mb, int p, const std::int64_t* offs,
                                    const std::int64_t* out_offs, int cb, int lanes) {
                                  const std::int64_t wblock = std::int64_t{ma} * mb * s.c_out * kBlock;
                                  kConvTiles<L, V>[p - 1](buf, offs, row_step, ma, mb * s.c_out,
                                                          wp + g.phase_offset[phase] + cb * wblock, nullptr,
                                                          img_dx + cb * kBlock, out_offs, lanes, st);
                                });
    });
  });
}

// ---- Winograd F(2x2, 3x3) --------------------------------------------------------------------

// Note [Winograd convolution]
// A 3x3 stride-1 convolution can make each 2x2 block of output pixels from the 4x4 patch of
// input under it with 16 multiplies per (input channel, output channel) instead of 36: Y =
// A^T [(G g G^T) . (B^T d B)] A (Lavin and Gray, "Fast Algorithms for Convolutional Neural
// Networks", CVPR 2016). Summed over input channels, the 16 elementwise products are 16 matrix
// products [tiles x c_in] x [c_in x c_out], one per position xi of the transformed patch, which
// run on the forward register kernel as 1x1 convolutions. An image's tiles go in fixed groups: a
// group's input transforms fill [16][tiles][c_in], its products [16][tiles][c_out] (together at
// most about 48 KiB), and the output transform writes its 2x2 blocks of y. The multiply-adds are
// 16/36 of the direct kernel's; in exchange each output pixel's channels take 4 transformed inputs
// and 4 products through the caches, and about 6 adds (two per transformed value), so the gain
// grows with the channels: on a 2-core Zen 3 EPYC (AVX2) ResNet-20's 32->32 and 64->64 layers
// run at 1.3-1.6x the direct kernels' speed in each of the three passes, its 16->16 layers within
// 7% of it either way (`towerflow_bench_ops --threads 2 --filter resnet20`, the winograd_* rows).
// The weight gradient is the adjoint: dU[xi] = sum over tiles of V[xi]^T (A dY A^T)[xi], a
// product whose reduction runs over the tiles, then dw = G^T dU G.
// The backward input at stride 1 is the same convolution of dy with the flipped kernel, so it
// runs here too. The values are rounded differently from the direct sum (the patch is combined
// before it is multiplied, the weights are halved and summed): within the fp32 tolerance of the
// direct kernels' tests, not the same bits. Each output is still summed by one thread in a fixed
// order whatever the thread count. It is one of the kernel choice's candidates ("winograd",
// core/cpu/kernel_choice.cc): a problem takes it where it measures faster.

// y = conv(x, w) + bias (or y += it, Store::kAdd) for s with winograd_applies(s), by Note
// [Winograd convolution]; get(co, ci, i, j) gives the weights, bias (nullable) c_out values.
template <int L, int V, typename Get>
void winograd_conv(const CpuContext& ctx, const Conv2dShape& s, const float* x, const float* bias,
                   Store store, float* y, Get get) {
  constexpr int kBlock = L * V;
  constexpr int kP = kMaxPixels<V>;
  constexpr int kXi = 16;
  const int c_in = s.c_in, c_out = s.c_out;
  const int blocks = (c_out + kBlock - 1) / kBlock;
  const std::int64_t ld_m = std::int64_t{blocks} * kBlock;
  // Transformed weights [xi][block][c_in][kBlock], zero past c_out: the register kernel's packing
  // of a 1x1 convolution, one per xi.
  const std::int64_t per_xi = ld_m * c_in;
  float* u = scratch(Scratch::kWeights, static_cast<std::size_t>(kXi * per_xi));
  if (ld_m != c_out) std::fill(u, u + kXi * per_xi, 0.0f);  // the lanes past c_out
  winograd_weights(ctx, c_out, c_in, get, [&](int co, int ci, const Vec8* t) {
    const std::int64_t at = (std::int64_t{co / kBlock} * c_in + ci) * kBlock + co % kBlock;
    for (int xi = 0; xi < kXi; ++xi) store8(u + xi * per_xi + at, t[xi]);
  });
  const WinogradTiles g(s, ld_m, winograd_forward_group(c_in, ld_m, kP));
  std::array<std::int64_t, kP> in_offs, out_offs;
  for (int k = 0; k < kP; ++k) in_offs[k] = k * c_in, out_offs[k] = k * ld_m;

  ctx.parallel_for(s.n * g.per_image, 1, [&](std::int64_t g0, std::int64_t g1) {
    float* vbuf = scratch(Scratch::kInput, static_cast<std::size_t>(kXi * g.v_plane));
    float* mbuf = scratch(Scratch::kOutput, static_cast<std::size_t>(kXi * g.m_plane));
    float* img = scratch(Scratch::kAux, static_cast<std::size_t>(g.hp * g.pad_row));
    std::int64_t padded = -1;
    for (std::int64_t gi = g0; gi < g1; ++gi) {
      const std::int64_t n = gi / g.per_image, k = gi % g.per_image;
      if (padded != n) {
        g.pad_image(s, x + n * s.h * s.w * c_in, img);
        padded = n;
      }
      float* out = y + n * g.oh * g.y_row;
      const int count = g.for_each_tile(k, img, [&](int t, const float* patch, std::int64_t at, int rows, int cols) {
        winograd_input(patch, g.pad_row, c_in, vbuf + t * c_in, g.v_plane);
        if (store == Store::kAdd)  // Note [Prefetching what a tile adds to]
          for (int a = 0; a < rows; ++a) prefetch_floats(out + at + a * g.y_row, std::int64_t{cols} * c_out);
      });
      // The products: mbuf[xi][t][ld_m] = vbuf[xi][t][c_in] x u[xi].
      for (int xi = 0; xi < kXi; ++xi) {
        const float* vx = vbuf + xi * g.v_plane;
        float* mx = mbuf + xi * g.m_plane;
        for_each_tile<kP>(count, static_cast<int>(ld_m), kBlock, [&](std::int64_t p0, int p, int cb, int) {
          kConvTiles<L, V>[p - 1](vx + p0 * c_in, in_offs.data(), 0, 1, c_in,
                                  u + xi * per_xi + std::int64_t{cb} * c_in * kBlock, nullptr,
                                  mx + p0 * ld_m + cb * kBlock, out_offs.data(), kBlock,
                                  Store::kOverwrite);
        });
      }
      g.for_each_tile(k, img, [&](int t, const float*, std::int64_t at, int rows, int cols) {
        winograd_output(mbuf + t * ld_m, g.m_plane, c_out, bias, store, out + at, g.y_row, rows, cols);
      });
    }
  });
}

// dw = correlate(x, dy) for s with winograd_applies(s), by Note [Winograd convolution]: dU[xi] =
// sum over tiles of V[xi]^T dM[xi] (V the input transforms, dM = A dY A^T), summed on the weight
// gradient's register kernel with the tiles as its pixels, then dw = G^T dU G. The images are
// summed in the fixed groups of Note [Weight gradient: image groups or tiles], whose tiles here
// are (block, xi, input channels) tiles of dU.
template <int L, int V>
void winograd_weight_grad(const CpuContext& ctx, const Conv2dShape& s, const float* x,
                          const float* dy, float* dw) {
  constexpr int kBlock = L * V;
  constexpr int kQ = kMaxInputs<V>;
  constexpr int kXi = 16;
  static constexpr auto kTiles = kernel_table<kQ>([]<int Q>() { return &weight_tile<L, Q, V>; });
  const int c_in = s.c_in, c_out = s.c_out;
  const WinogradWeightGradPlan plan(s, kBlock, kQ, 4);
  const std::int64_t ld_m = plan.ld_m;
  const WeightTiles& tiles = plan.tiles;
  const WinogradTiles& g = plan.g;
  float* dup = zeroed_scratch(Scratch::kWeights, plan.du_size);

  const std::int64_t v_plane = plan.v_plane, m_plane = plan.m_plane;

  auto accumulate = [&](int n0, int n1, std::int64_t u0, std::int64_t u1, float* dst) {
    float* vbuf = scratch(Scratch::kInput, static_cast<std::size_t>(kXi * v_plane));
    float* mbuf = scratch(Scratch::kOutput, static_cast<std::size_t>(kXi * m_plane));
    // Not kAux: sum_weight_grad keeps the image groups' partial sums there.
    float* img = scratch(Scratch::kPacked, static_cast<std::size_t>(g.hp * g.pad_row));
    // The lanes of a partial last block past c_out, which the transforms do not write, are zero
    // (their products land in columns of dU that nothing reads).
    if (c_out != ld_m) std::fill(mbuf, mbuf + kXi * m_plane, 0.0f);
    for (int n = n0; n < n1; n += plan.images) {
      const int last = std::min(n1, n + plan.images);
      for (std::int64_t k = 0; k < g.per_image; ++k) {
        int count = 0;  // the pass's tiles, image after image
        for (int m = n; m < last; ++m) {
          if (k == 0) g.pad_image(s, x + std::int64_t{m} * s.h * s.w * c_in, img);
          const float* dimg = dy + std::int64_t{m} * g.oh * g.y_row;
          float* v = vbuf + count * c_in;
          float* dm = mbuf + count * ld_m;
          count += g.for_each_tile(k, img, [&](int t, const float* patch, std::int64_t at, int rows, int cols) {
            winograd_input(patch, g.pad_row, c_in, v + t * c_in, v_plane);
            winograd_output_adjoint(dimg + at, g.y_row, c_out, rows, cols, dm + t * ld_m, m_plane);
          });
        }
        for (std::int64_t u = u0; u < u1; ++u) {
          const WeightTiles::Tile& w = tiles[u];
          kTiles[w.q - 1](vbuf + w.i * v_plane + w.q0, c_in, 0, mbuf + w.i * m_plane + w.cb * kBlock,
                          ld_m, 0, 1, count, dst + (std::int64_t{w.i} * c_in + w.q0) * ld_m + w.cb * kBlock,
                          ld_m);
        }
      }
    }
  };
  sum_weight_grad(ctx, s.n, tiles.count(), 1, plan.du_size, dup, accumulate);

  winograd_weight_grad_out(ctx, s, dup, ld_m, dw);
}

// winograd_conv with the channel block with_block picks for c_out; false where it does not apply.
template <typename Get>
bool run_winograd(const CpuContext& ctx, const Conv2dShape& s, const float* x, const float* bias,
                  Store store, float* y, Get get) {
  if (!winograd_applies(s)) return false;
  with_block(s.c_out, [&]<int L, int V>() { winograd_conv<L, V>(ctx, s, x, bias, store, y, get); });
  return true;
}

}  // namespace

// ---- public kernels ------------------------------------------------------------------------

void conv2d_forward(const CpuContext& ctx, const Conv2dShape& s, const float* x, const float* w,
                    float* y) {
  conv2d_forward_bias(ctx, s, x, w, nullptr, y);
}

void conv2d_forward_bias(const CpuContext& ctx, const Conv2dShape& s, const float* x,
                         const float* w, const float* bias, float* y) {
  s.validate();
  run_direct(ctx, s, x, bias, Store::kOverwrite, y, [&](int co, int ci, int i, int j) {
    return w[((std::int64_t{co} * s.c_in + ci) * s.kh + i) * s.kw + j];
  });
}

namespace {

// The backward input of s at stride 1, with padding below the kernel, is the forward
// convolution of dy with the flipped kernel (Note [Channels-last on the CPU]): where it applies,
// its shape, and its weights as the kernels read them, get(ci, co, i, j) with ci and co of the
// transposed shape.
bool transposes_to_forward(const Conv2dShape& s) {
  return s.stride_h == 1 && s.stride_w == 1 && s.pad_h < s.kh && s.pad_w < s.kw;
}
Conv2dShape transposed(const Conv2dShape& s) {
  return {.n = s.n, .h = s.out_h(), .w = s.out_w(), .c_in = s.c_out, .c_out = s.c_in, .kh = s.kh,
          .kw = s.kw, .stride_h = 1, .stride_w = 1, .pad_h = s.kh - 1 - s.pad_h,
          .pad_w = s.kw - 1 - s.pad_w};
}
auto flipped_weights(const Conv2dShape& s, const float* w) {
  return [&s, w](int ci, int co, int i, int j) {
    return w[((std::int64_t{co} * s.c_in + ci) * s.kh + (s.kh - 1 - i)) * s.kw + (s.kw - 1 - j)];
  };
}

void backward_input(const CpuContext& ctx, const Conv2dShape& s, const float* dy, const float* w,
                    Store store, float* dx) {
  s.validate();
  if (transposes_to_forward(s))
    return run_direct(ctx, transposed(s), dy, nullptr, store, dx, flipped_weights(s, w));
  // Strides > 1, or padding as large as the kernel (Note [Backward input by stride phases]).
  with_block(s.c_in, [&]<int L, int V>() { backward_input_phases<L, V>(ctx, s, dy, w, store, dx); });
}

}  // namespace

void conv2d_backward_input(const CpuContext& ctx, const Conv2dShape& s, const float* dy,
                           const float* w, float* dx) {
  backward_input(ctx, s, dy, w, Store::kOverwrite, dx);
}

void conv2d_backward_input_add(const CpuContext& ctx, const Conv2dShape& s, const float* dy,
                               const float* w, float* dx) {
  backward_input(ctx, s, dy, w, Store::kAdd, dx);
}

bool conv2d_forward_winograd(const CpuContext& ctx, const Conv2dShape& s, const float* x,
                             const float* w, const float* bias, float* y) {
  s.validate();
  return run_winograd(ctx, s, x, bias, Store::kOverwrite, y, [&](int co, int ci, int i, int j) {
    return w[((std::int64_t{co} * s.c_in + ci) * s.kh + i) * s.kw + j];
  });
}

namespace {

// The stride-1 backward input as the forward convolution of dy with the flipped kernel, by
// Note [Winograd convolution]; false where that does not apply.
bool backward_input_winograd(const CpuContext& ctx, const Conv2dShape& s, const float* dy,
                             const float* w, Store store, float* dx) {
  s.validate();
  return transposes_to_forward(s) &&
         run_winograd(ctx, transposed(s), dy, nullptr, store, dx, flipped_weights(s, w));
}

}  // namespace

bool conv2d_backward_weight_winograd(const CpuContext& ctx, const Conv2dShape& s, const float* x,
                                     const float* dy, float* dw) {
  s.validate();
  if (!winograd_applies(s)) return false;
  with_block(s.c_out, [&]<int L, int V>() { winograd_weight_grad<L, V>(ctx, s, x, dy, dw); });
  return true;
}

bool conv2d_backward_input_winograd(const CpuContext& ctx, const Conv2dShape& s, const float* dy,
                                    const float* w, float* dx) {
  return backward_input_winograd(ctx, s, dy, w, Store::kOverwrite, dx);
}

bool conv2d_backward_input_add_winograd(const CpuContext& ctx, const Conv2dShape& s,
                                        const float* dy, const float* w, float* dx) {
  return backward_input_winograd(ctx, s, dy, w, Store::kAdd, dx);
}

void conv2d_backward_weight(const CpuContext& ctx, const Conv2dShape& s, const float* x,
                            const float* dy, float* dw) {
  s.validate();
  if (weight_row_kernel_applies(s)) return weight_grad_rows(ctx, s, x, dy, dw);
  with_block(s.c_out, [&]<int L, int V>() { weight_grad<L, V>(ctx, s, x, dy, dw); });
}

void conv2d_backward_bias(const CpuContext& ctx, const Conv2dShape& s, const float* dy,
                          float* db) {
  s.validate();
  // Fixed blocks of rows summed in double, then added in block order: the result does not
  // depend on the thread count.
  constexpr std::int64_t kRowsPerBlock = 1024;
  const std::int64_t rows = std::int64_t{s.n} * s.out_h() * s.out_w();
  const std::int64_t nblocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  // Rows about 4 KiB ahead are asked for as the sum goes: dy is the gradient the step's previous
  // kernel has just written past the caches, and the hardware prefetchers alone left this pass
  // at 1.3-1.5x of its bandwidth bound in tfcnn's training step (1.12-1.18x with it, five
  // alternating rounds on a 2-core Zen 5 EPYC).
  const std::int64_t ahead = std::max<std::int64_t>(1, 1024 / s.c_out);
  double* partial = reinterpret_cast<double*>(
      scratch(Scratch::kAux, static_cast<std::size_t>(2 * nblocks * s.c_out)));
  ctx.parallel_for(nblocks, 8, [&](std::int64_t b0, std::int64_t b1) {
    for (std::int64_t b = b0; b < b1; ++b) {
      double* acc = partial + b * s.c_out;
      std::fill(acc, acc + s.c_out, 0.0);
      const std::int64_t r_end = std::min(rows, (b + 1) * kRowsPerBlock);
      for (std::int64_t r = b * kRowsPerBlock; r < r_end; ++r) {
        const float* row = dy + r * s.c_out;
        if (r + ahead < r_end)
          for (int c = 0; c < s.c_out; c += 16) __builtin_prefetch(row + ahead * s.c_out + c);
        for (int c = 0; c < s.c_out; ++c) acc[c] += row[c];
      }
    }
  });
  for (int c = 0; c < s.c_out; ++c) {
    double total = 0.0;
    for (std::int64_t b = 0; b < nblocks; ++b) total += partial[b * s.c_out + c];
    db[c] = static_cast<float>(total);
  }
}

}  // namespace towerflow::cpu::TW_ISA
