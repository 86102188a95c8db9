// bf16 convolutions and GEMM on products of bf16 pairs (bf16_pairs.h), compiled once with
// AVX512-BF16 and once for AVX-512F with the instruction emulated.
#include "core/cpu/bf16_pairs.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "core/cpu/bf16_packing.h"
#include "core/cpu/conv_impl.h"
#include "core/cpu/simd_impl.h"

// Note [bf16 pair kernels]
// vdpbf16ps (AVX512-BF16) takes 16 dwords of each operand, each dword a pair of bf16, and adds
// both products of each pair to an fp32 lane: 32 multiply-adds per instruction, twice an fp32
// FMA's. The two bf16 of a pair must belong to the same sum, so each kernel packs its reduction
// into pairs (bf16 rounding to nearest even, as bf16.h's, while packing):
//   forward, backward input  the reduction of a kernel row walks q = (kernel column, channel),
//                            contiguous in NHWC. The input is converted to bf16 rows with the
//                            channels padded to an even count, so every dword of a row is a pair
//                            of channels; the weights are packed [block][kh][kw][channel pair][B].
//                            The register tile is conv.cc's (P pixels x V vectors of 16 output
//                            channels, one broadcast dword per pixel and pair), and so is the
//                            driver: threads split the output rows; stride > 1 backward input runs
//                            per stride phase (Note [Backward input by stride phases]).
//   backward weight          the reduction is over output pixels, so the pairs are neighbouring
//                            pixels: per pass of about 96 pixels, x is packed [pixel pair][q] for
//                            each kernel row (once for all of them where they can share it: Note
//                            [Weight-gradient passes in pixel pairs] in bf16_packing.h) and dy
//                            [pixel pair][output channel]; the tile is
//                            conv.cc's weight tile (Q inputs x V vectors). Images and tiles follow
//                            Note [Weight gradient: image groups or tiles].
//   GEMM                     a 1x1 convolution over the rows of op(a) as pixels.
// Every output element is summed by one thread in a fixed order, so results do not depend on the
// thread count (Note [Deterministic reductions]); the order differs from the fp32 kernels' (pairs).
//
// Without AVX512-BF16 the instruction is emulated with two FMAs per lane in its own order (the
// high products, then the low). A product of two bf16 is exact in fp32, so each FMA rounds as
// the instruction's accumulation does and the emulation gives the same bits, except that the
// instruction treats denormal inputs as zero and flushes denormal results. The emulation exists
// so that every packing and tiling path runs on any AVX-512 CPU, in the tests. The timing object
// (TW_BF16_DOT_TIMING, linked only into towerflow_bench_ops_bf16_timing) computes each vdpbf16ps
// as one FMA on the raw pairs instead: wrong values, but the instruction's cost if it issues at
// the FMA's rate (the premise of its twice-fp32 throughput), so that the kernels can be timed and
// tuned on CPUs without it (docs/precision.md, which has the figures and their commands).

namespace towerflow::cpu::TW_ISA {

#if defined(TW_BF16_DOT_TIMING) && !defined(__AVX512BF16__)
// A pair read as a float is a denormal where its high bf16 is zero and its low one is not (ReLU
// zeros); denormals as zero keep those FMAs at the rate of the others. Set before main, so every
// thread the process starts inherits it.
static const int kDenormalsAreZero = (_mm_setcsr(_mm_getcsr() | 0x8040), 0);
#endif

using detail::AliasedPair;
using detail::bf16_rows;
using detail::conv_input;
using detail::ConvInput;
using detail::for_each_tile;
using detail::for_image_rows;
using detail::input_rows;
using detail::InputRows;
using detail::kernel_table;
using detail::pack_pass_pairs;
using detail::pack_column_pairs;
using detail::pack_weight_pairs;
using detail::padded_bias;
using detail::padded_image;
using detail::padded_image_buffer;
using detail::parallel_rows;
using detail::pass_pair_rows;
using detail::pixel_offsets;
using detail::Pair;
using detail::round_up;
using detail::Scratch;
using detail::scratch_pairs;
using detail::StridePhases;
using detail::sum_weight_grad;
using detail::to_pairs;
using detail::unpack_weight_grad;
using detail::WeightTiles;
using detail::zeroed_scratch;

namespace {

constexpr int kLanes = 16;
// As conv.cc's tiles on AVX-512: 24 accumulators, forward tiles of at most 12 pixels, and of 9
// for two vectors. With 10 to 12 pixels of two vectors GCC 12 keeps a weight vector on the stack
// (a store and a load per pair of the reduction), as it does for conv.cc's fp32 tiles (Note
// [Register tiles for 8 and 16 lanes]); 9 pixels ran ResNet-20's 32-channel layers up to 1.9x
// faster (towerflow_bench_ops, vdpbf16ps replaced by one FMA, on an Ice Lake Xeon).
constexpr int kAccumulators = 24;
template <int V>
constexpr int kMaxPixels = std::min(V == 2 ? 9 : 12, kAccumulators / V);
template <int V>
constexpr int kMaxInputs = kAccumulators / V;

// acc + a.high * b.high + a.low * b.low in each lane, as vdpbf16ps computes it.
inline __m512 dot(__m512 acc, __m512i a, __m512i b) {
#if defined(__AVX512BF16__)
  return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
#elif defined(TW_BF16_DOT_TIMING)
  return _mm512_fmadd_ps(_mm512_castsi512_ps(a), _mm512_castsi512_ps(b), acc);
#else
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  acc = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(a, high)),
                        _mm512_castsi512_ps(_mm512_and_si512(b, high)), acc);
  return _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(a, 16)),
                         _mm512_castsi512_ps(_mm512_slli_epi32(b, 16)), acc);
#endif
}

// The pair p in every lane. Clang 16 crashes folding a broadcast load into vdpbf16ps (as an
// embedded {1to16} operand); an empty asm keeps the broadcast in a register there.
inline __m512i broadcast(Pair p) {
  __m512i b = _mm512_set1_epi32(static_cast<int>(p));
#if defined(__clang__) && defined(__AVX512BF16__)
  __asm__("" : "+v"(b));
#endif
  return b;
}

// Calls fn.template operator()<V>() with the vectors of 16 output channels per block for
// `channels` channels: as conv.cc's with_block on AVX-512, 64-channel blocks where they waste no
// more lanes than 32-channel ones.
template <typename Fn>
void with_block(int channels, Fn&& fn) {
  if (channels <= kLanes) return fn.template operator()<1>();
  if (channels > 32 && round_up(channels, 64) == round_up(channels, 32)) return fn.template operator()<4>();
  return fn.template operator()<2>();
}

// ---- the forward register kernel -----------------------------------------------------------

// conv.cc's conv_tile on pairs: P output pixels x 16*V channels. Pixel p reads the q-th pair of
// kernel row 0 at img[offs[p] + q], kernel row i row_step pairs further; wp is the block's packed
// weights [kh][q_len][16*V]; bias (nullable) holds 16*V values. Pixel p is written at
// out + out_offs[p] (its first `lanes` channels).
template <int P, int V>
void pair_tile(const std::uint16_t* img16, const std::int64_t* offs, std::int64_t row_step,
               int kh, int q_len, const Pair* __restrict wp, const float* bias,
               float* __restrict out, const std::int64_t* out_offs, int lanes) {
  __m512 acc[P][V];
#pragma GCC unroll 32
  for (int p = 0; p < P; ++p)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[p][v] = bias ? _mm512_loadu_ps(bias + kLanes * v) : _mm512_setzero_ps();
  // Indexed from -q_len up to zero, as in conv_tile, so that the P pointers stay in registers.
  const auto* img = reinterpret_cast<const AliasedPair*>(img16);
  const AliasedPair* xe[P];
#pragma GCC unroll 32
  for (int p = 0; p < P; ++p) xe[p] = img + offs[p] + q_len;
  const Pair* wr = wp;
  for (int i = 0; i < kh; ++i) {
    for (std::ptrdiff_t q = -q_len; q != 0; ++q, wr += kLanes * V) {
      __m512i wv[V];
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) wv[v] = _mm512_loadu_si512(wr + kLanes * v);
#pragma GCC unroll 32
      for (int p = 0; p < P; ++p) {
        const __m512i b = broadcast(xe[p][q]);
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) acc[p][v] = dot(acc[p][v], b, wv[v]);
      }
    }
#pragma GCC unroll 32
    for (int p = 0; p < P; ++p) xe[p] += row_step;
  }
  if (lanes == kLanes * V) {
#pragma GCC unroll 32
    for (int p = 0; p < P; ++p)
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) _mm512_storeu_ps(out + out_offs[p] + kLanes * v, acc[p][v]);
  } else {
    for (int p = 0; p < P; ++p) {
      float tmp[kLanes * V];
      for (int v = 0; v < V; ++v) _mm512_storeu_ps(tmp + kLanes * v, acc[p][v]);
      std::copy(tmp, tmp + lanes, out + out_offs[p]);
    }
  }
}

// pair_tile<P, V> for P = 1 .. kMaxPixels<V>, indexed by P - 1.
template <int V>
constexpr auto kPairTiles = kernel_table<kMaxPixels<V>>([]<int P>() { return &pair_tile<P, V>; });

// ---- the row kernel for up to 16 output channels -------------------------------------------

// Note [Pair row kernel]
// A block of one 16-lane vector is bound by its broadcasts: pair_tile issues one broadcast load
// per vdpbf16ps, and a core issues broadcasts at about half its FMA rate (Note [Register tiles
// for 8 and 16 lanes] in conv.cc). conv.cc's row kernel (Note [Row kernel for 16 channels]) does
// without the bound, and so does this one, on pairs of input channels: for up to 16 output
// channels, a 3-wide kernel and horizontal stride 1 it keeps T outputs of one row and the 3
// weight vectors of one (kernel row, channel pair) in registers, and multiplies every broadcast
// pair by all 3 of them. The pairs per input pixel, HALF, is a template parameter (2 for an RGB
// input padded to 4 channels, 8 in a 16-channel stage) so that every broadcast's address is a
// constant offset from one pointer. Weights are packed [kh][pair][kernel column][16]. Each
// output is summed by one thread in a fixed order (kernel row, channel pair, kernel column).

constexpr int kRowTile = 16;  // T accumulators + 3 weights + a broadcast (+ the emulation's two)

template <int T, int KW, int HALF>
void pair_row_tile(const std::uint16_t* img16, std::int64_t row_step, int kh, const Pair* __restrict wp,
                   const float* bias, float* __restrict out, std::int64_t ld_y, int lanes) {
  __m512 acc[T];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) acc[t] = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
  const auto* in = reinterpret_cast<const AliasedPair*>(img16);
  for (int i = 0; i < kh; ++i, in += row_step) {
    const AliasedPair* xr = in;
    for (int k = 0; k < HALF; ++k, ++xr, wp += KW * kLanes) {
      __m512i w[KW];
#pragma GCC unroll 8
      for (int j = 0; j < KW; ++j) w[j] = _mm512_loadu_si512(wp + kLanes * j);
#pragma GCC unroll 32
      for (int c = 0; c < T + KW - 1; ++c) {
        const __m512i b = broadcast(xr[c * HALF]);
#pragma GCC unroll 8
        for (int j = 0; j < KW; ++j)
          if (c - j >= 0 && c - j < T) acc[c - j] = dot(acc[c - j], b, w[j]);
      }
    }
  }
  if (lanes == kLanes && ld_y == kLanes) {
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) _mm512_storeu_ps(out + kLanes * t, acc[t]);
  } else {
    for (int t = 0; t < T; ++t) {
      float tmp[kLanes];
      _mm512_storeu_ps(tmp, acc[t]);
      std::copy(tmp, tmp + lanes, out + t * ld_y);
    }
  }
}

// Whether pair_row_conv handles this convolution: up to 16 output channels, a 3-wide kernel at
// horizontal stride 1, and 3 or 4 or 15 or 16 input channels (2 or 8 pairs).
bool row_kernel_applies(const Conv2dShape& s) {
  const int half = static_cast<int>(round_up(s.c_in, 2)) / 2;
  return s.c_out <= kLanes && s.kw == 3 && s.stride_w == 1 && (half == 2 || half == 8);
}

// pair_conv (below) with the row kernel, where row_kernel_applies. Threads split the output
// rows; each row is cut into balanced tiles of up to 16 pixels.
template <int HALF, typename In, typename Get>
void pair_row_conv(const CpuContext& ctx, const Conv2dShape& s, const In* x, std::int64_t ld_x,
                   const float* bias, float* y, std::int64_t ld_y, Get get) {
  constexpr int kKW = 3;
  static constexpr auto kTiles = kernel_table<kRowTile>([]<int T>() { return &pair_row_tile<T, kKW, HALF>; });
  Pair* wp = scratch_pairs(Scratch::kWeights, std::int64_t{s.kh} * HALF * kKW * kLanes);
  for (int i = 0, o = 0; i < s.kh; ++i)
    for (int k = 0; k < HALF; ++k)
      for (int j = 0; j < kKW; ++j)
        for (int co = 0; co < kLanes; ++co, ++o) {
          float low = 0.0f, high = 0.0f;
          if (co < s.c_out) {
            if (2 * k < s.c_in) low = get(co, 2 * k, i, j);
            if (2 * k + 1 < s.c_in) high = get(co, 2 * k + 1, i, j);
          }
          wp[o] = (detail::rounded_bits(low) >> 16) | detail::rounded_bits(high);
        }
  const float* bias16 = padded_bias(bias, s.c_out, kLanes);
  const int oh = s.out_h(), ow = s.out_w();
  const int hp = s.h + 2 * s.pad_h, wpad = s.w + 2 * s.pad_w;
  const std::int64_t row_step = std::int64_t{wpad} * HALF;
  const std::int64_t image_in = std::int64_t{s.h} * s.w * ld_x;
  const int tiles = (ow + kRowTile - 1) / kRowTile;
  parallel_rows(ctx, s.n, oh, std::int64_t{ow} * s.c_out * s.kh * kKW * s.c_in, [&](std::int64_t r0, std::int64_t r1) {
    auto* buf = reinterpret_cast<std::uint16_t*>(scratch_pairs(Scratch::kInput, hp * row_step));
    for_image_rows(r0, r1, oh, [&](std::int64_t n, int row_begin, int row_end) {
      const InputRows rows = input_rows(s, row_begin, row_end);
      bf16_rows(x + n * image_in, s.h, s.w, s.c_in, ld_x, 2 * HALF, s.pad_h, s.pad_w, wpad,
                rows.first, rows.end, buf);
      for (int oy = row_begin; oy < row_end; ++oy) {
        const std::uint16_t* in = buf + 2 * std::int64_t{oy} * s.stride_h * row_step;
        float* yrow = y + (n * oh + oy) * std::int64_t{ow} * ld_y;
        for (int t = 0; t < tiles; ++t) {
          const int x0 = ow * t / tiles, width = ow * (t + 1) / tiles - x0;
          kTiles[width - 1](in + 2 * std::int64_t{x0} * HALF, row_step, s.kh, wp, bias16,
                            yrow + std::int64_t{x0} * ld_y, ld_y, s.c_out);
        }
      }
    });
  });
}

// ---- the general convolution ---------------------------------------------------------------

// y = conv(x, w) (+ bias), the weights read through get(co, ci, i, j). Pixels of x are ld_in
// values apart (floats, or bf16.h's bf16 inputs), pixels of y ld_y apart; conv_input says which of
// them are converted. Threads split the output rows, as direct_conv does.
template <typename In, typename Get>
void pair_conv(const CpuContext& ctx, const Conv2dShape& conv, const In* x, std::int64_t ld_in,
               const float* bias, float* y, std::int64_t ld_y, Get get) {
  if (row_kernel_applies(conv)) {
    if (conv.c_in <= 4) return pair_row_conv<2>(ctx, conv, x, ld_in, bias, y, ld_y, get);
    return pair_row_conv<8>(ctx, conv, x, ld_in, bias, y, ld_y, get);
  }
  const ConvInput in = conv_input(conv, ld_in);
  const Conv2dShape& s = in.s;
  with_block(s.c_out, [&]<int V>() {
    constexpr int kBlock = kLanes * V;
    constexpr int kP = kMaxPixels<V>;
    const int oh = s.out_h(), ow = s.out_w();
    const int blocks = (s.c_out + kBlock - 1) / kBlock;
    const int c2 = static_cast<int>(round_up(s.c_in, 2)), half = c2 / 2;
    const int q_len = s.kw * half;
    const std::int64_t wblock = std::int64_t{s.kh} * q_len * kBlock;
    Pair* wp = scratch_pairs(Scratch::kWeights, blocks * wblock);
    pack_weight_pairs(ctx, s.c_out, s.c_in, c2, s.kh, s.kw, kBlock, wp, get);
    const float* bias_padded = padded_bias(bias, s.c_out, blocks * kBlock);
    const int hp = s.h + 2 * s.pad_h, wpad = s.w + 2 * s.pad_w;
    const std::int64_t row_step = std::int64_t{wpad} * half;
    const std::int64_t pix_step = std::int64_t{s.stride_w} * half;

    parallel_rows(ctx, s.n, oh, std::int64_t{ow} * s.c_out * s.kh * s.kw * s.c_in, [&](std::int64_t r0, std::int64_t r1) {
      auto* buf = reinterpret_cast<std::uint16_t*>(scratch_pairs(Scratch::kInput, hp * row_step));
      for_image_rows(r0, r1, oh, [&](std::int64_t n, int row_begin, int row_end) {
        // Only the padded input rows these output rows read.
        const InputRows rows = input_rows(s, row_begin, row_end);
        bf16_rows(x + n * in.ld_image, s.h, s.w, s.c_in, in.ld_x, c2, s.pad_h, s.pad_w, wpad,
                  rows.first, rows.end, buf, in.ld_row);
        const std::int64_t pix_begin = std::int64_t{row_begin} * ow;
        float* ybase = y + (n * oh * ow + pix_begin) * ld_y;
        for_each_tile<kP>(std::int64_t{row_end - row_begin} * ow, s.c_out, kBlock, [&](std::int64_t p0, int p, int cb, int lanes) {
          std::int64_t offs[kP], out_offs[kP];
          pixel_offsets(pix_begin + p0, p, ow, s.stride_h * row_step, pix_step, ld_y, offs, out_offs);
          kPairTiles<V>[p - 1](buf, offs, row_step, s.kh, q_len, wp + cb * wblock,
                               bias_padded ? bias_padded + cb * kBlock : nullptr,
                               ybase + p0 * ld_y + cb * kBlock, out_offs, lanes);
        });
      });
    });
  });
}

// ---- backward input by stride phases ------------------------------------------------------

// conv.cc's backward_input_phases (Note [Backward input by stride phases]) on pairs of dy's
// channels.
template <int V>
void pair_backward_input_phases(const CpuContext& ctx, const Conv2dShape& s, const float* dy,
                                const float* w, float* dx) {
  constexpr int kBlock = kLanes * V;
  constexpr int kP = kMaxPixels<V>;
  const int blocks = (s.c_in + kBlock - 1) / kBlock;
  const int c2 = static_cast<int>(round_up(s.c_out, 2)), half = c2 / 2;
  // Packed sub-kernels of every phase, one after the other: [a][b][block][i'][j'][pair][lane].
  const StridePhases g(s, std::int64_t{blocks} * kBlock * half);
  const std::int64_t row_step = std::int64_t{g.wp} * half;
  Pair* wp = scratch_pairs(Scratch::kWeights, g.phase_offset.back());
  g.pack_phases(s, w, [&](std::int64_t offset, int ma, int mb, auto get) {
    pack_weight_pairs(ctx, s.c_in, s.c_out, c2, ma, mb, kBlock, wp + offset, get);
  });

  const std::int64_t image_in = std::int64_t{s.h} * s.w * s.c_in;
  const std::int64_t image_out = std::int64_t{g.oh} * g.ow * s.c_out;
  const std::int64_t macs_per_row = std::int64_t{s.w} * s.c_in * s.c_out * s.kh * s.kw / (g.sh * g.sw);
  parallel_rows(ctx, s.n, s.h, macs_per_row, [&](std::int64_t r0, std::int64_t r1) {
    auto* buf = reinterpret_cast<std::uint16_t*>(scratch_pairs(Scratch::kInput, g.hp * row_step));
    for_image_rows(r0, r1, s.h, [&](std::int64_t n, int row_begin, int row_end) {
      bf16_rows(dy + n * image_out, g.oh, g.ow, s.c_out, s.c_out, c2, g.top, g.left, g.wp, 0, g.hp, buf);
      float* img_dx = dx + n * image_in;
      g.for_each_phase_tile<kP>(s, row_begin, row_end, row_step, half, kBlock, detail::Store::kOverwrite, img_dx,
                                [&](int phase, int ma, int mb, int p, const std::int64_t* offs,
                                    const std::int64_t* out_offs, int cb, int lanes) {
                                  const std::int64_t wblock = std::int64_t{ma} * mb * half * kBlock;
                                  kPairTiles<V>[p - 1](buf, offs, row_step, ma, mb * half,
                                                       wp + g.phase_offset[phase] + cb * wblock, nullptr,
                                                       img_dx + cb * kBlock, out_offs, lanes);
                                });
    });
  });
}

// ---- the weight-gradient register kernel ---------------------------------------------------

// acc[q][v] += sum over `pairs` pixel pairs of the products of x pair xp[pair * ld_x + q] and dy
// pair dyp[pair * ld_dy + 16v + lane].
template <int Q, int V>
void pair_weight_tile(const Pair* __restrict xp, std::int64_t ld_x, const Pair* __restrict dyp,
                      std::int64_t ld_dy, int pairs, float* __restrict acc_mem, std::int64_t ld_acc) {
  __m512 acc[Q][V];
#pragma GCC unroll 32
  for (int q = 0; q < Q; ++q)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[q][v] = _mm512_loadu_ps(acc_mem + q * ld_acc + kLanes * v);
  for (int pp = 0; pp < pairs; ++pp, xp += ld_x, dyp += ld_dy) {
    __m512i d[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) d[v] = _mm512_loadu_si512(dyp + kLanes * v);
#pragma GCC unroll 32
    for (int q = 0; q < Q; ++q) {
      const __m512i b = broadcast(xp[q]);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[q][v] = dot(acc[q][v], b, d[v]);
    }
  }
#pragma GCC unroll 32
  for (int q = 0; q < Q; ++q)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(acc_mem + q * ld_acc + kLanes * v, acc[q][v]);
}

// dw = correlate(x, dy), built in dwp [kh][kw*c_in][blocks*B] as conv.cc's weight_grad.
template <int V, typename In>
void pair_weight_grad(const CpuContext& ctx, const Conv2dShape& s, const In* x, const float* dy,
                      float* dw) {
  constexpr int kBlock = kLanes * V;
  constexpr int kQ = kMaxInputs<V>;
  static constexpr auto kTiles = kernel_table<kQ>([]<int Q>() { return &pair_weight_tile<Q, V>; });
  const int oh = s.out_h(), ow = s.out_w();
  const int blocks = (s.c_out + kBlock - 1) / kBlock;
  const WeightTiles tiles(s.kh, s.kw * s.c_in, kQ, blocks);
  const int q_len = tiles.q_len;
  const std::int64_t ld_acc = std::int64_t{blocks} * kBlock;
  const std::int64_t dw_size = std::int64_t{s.kh} * q_len * ld_acc;
  float* dwp = zeroed_scratch(Scratch::kWeights, dw_size);

  const std::int64_t row_step = std::int64_t{s.w + 2 * s.pad_w} * s.c_in;
  const std::int64_t image_in = std::int64_t{s.h} * s.w * s.c_in;
  const std::int64_t image_out = std::int64_t{oh} * ow;
  // Passes of about 96 pixels, as weight_grad's, so that a pass's packed pairs stay in cache
  // across the tiles that share them.
  const int rows_per_pass = std::max(1, std::min(oh, 96 / ow));
  const std::int64_t max_pairs = (std::int64_t{rows_per_pass} * ow + 1) / 2;

  auto accumulate = [&](int n0, int n1, std::int64_t t0, std::int64_t t1, float* dst) {
    In* xbuf = reinterpret_cast<In*>(padded_image_buffer(s));
    Pair* dyb = scratch_pairs(Scratch::kOutput, max_pairs * ld_acc);
    Pair* xpb = scratch_pairs(Scratch::kPacked, pass_pair_rows(s, rows_per_pass * ow, max_pairs) * q_len);
    for (int n = n0; n < n1; ++n) {
      const In* img = padded_image(s, x + n * image_in, xbuf);
      const float* dimg = dy + n * image_out * s.c_out;
      for (int r0 = 0; r0 < oh; r0 += rows_per_pass) {
        const int pixels = std::min(rows_per_pass, oh - r0) * ow;
        const int pairs = (pixels + 1) / 2;
        // dy [pair][ld_acc]: pixels 2k and 2k + 1 of the pass (the last one alone when odd).
        const float* dpass = dimg + std::int64_t{r0} * ow * s.c_out;
        for (int k = 0; k < pairs; ++k) {
          Pair* d = dyb + k * ld_acc;
          to_pairs(s.c_out, dpass + std::int64_t{2 * k} * s.c_out,
                   2 * k + 1 < pixels ? dpass + std::int64_t{2 * k + 1} * s.c_out : nullptr, d);
          std::fill(d + s.c_out, d + ld_acc, Pair{0});
        }
        // x [pair][q] per kernel row (Note [Weight-gradient passes in pixel pairs]).
        const std::int64_t kernel_row_step = pack_pass_pairs(s, img, row_step, r0, pixels, max_pairs, xpb);
        for (std::int64_t t = t0; t < t1; ++t) {
          const WeightTiles::Tile& w = tiles[t];
          kTiles[w.q - 1](xpb + w.i * kernel_row_step * q_len + w.q0, q_len, dyb + w.cb * kBlock, ld_acc, pairs,
                          dst + (std::int64_t{w.i} * q_len + w.q0) * ld_acc + w.cb * kBlock, ld_acc);
        }
      }
    }
  };

  const std::int64_t macs_per_tile = std::int64_t{s.n} * image_out * kQ * kBlock;
  sum_weight_grad(ctx, s.n, tiles.count(), std::max<std::int64_t>(1, 200000 / macs_per_tile), dw_size,
                  dwp, accumulate);

  unpack_weight_grad(s, dwp, ld_acc, dw);
}

// ---- the weight-gradient row kernel for up to 16 output channels ---------------------------

// Note [Pair weight-gradient row kernel]
// pair_weight_tile broadcasts one x pair per pixel pair and multiplies it by the dy vectors of the
// block, so with one 16-lane vector of output channels it is broadcast bound too (Note [Pair row
// kernel]). conv.cc's weight-gradient row kernel (Note [Weight-gradient row kernel]) is not, and
// this is it on pairs of neighbouring input columns. At stride 1 input column c meets dy at
// column c - j for tap j, so with x packed in column pairs, xp[row][c / 2][channel] = (x at c, x
// at c + 1), and dy packed at every column, dp[row][k][lane] = (dy at k - 2, dy at k - 1) (zero
// outside the image), the pair at input columns (c, c + 1) and tap j multiplies dp[c + 2 - j]:
// per column pair, 3 dy vectors are loaded and each of the G broadcast x pairs meets all 3. The
// kernel holds dw[i][0..3)[G input channels] (3G accumulators) for one kernel row i. Each dw
// element is summed by one thread in a fixed order (images, rows, column pairs).
//
// With two vectors of output channels (17 to 32) it holds 3GV accumulators, V = 2 and G = 4.
// Against the pass-based pair_weight_grad it packs x once rather than once per kernel column, and
// it also multiplies the 2 padding columns of every row. On ResNet-20's 32->32 16x16 layer that
// is 1.12x faster (3.1-3.3 ms against 3.6-3.8, one thread, the timing build's
// `towerflow_bench_ops --threads 1 --cpu_clock --precision bf16 --filter "32->32"`); with four
// vectors (G = 2, the dy vectors of one tap at a time) the 64->64 8x8 layer is 1.6x slower, a
// quarter of its columns being padding, so 64 channels stay with pair_weight_grad.

template <int G, int V>
void pair_weight_row_pass(const Pair* __restrict xp, std::int64_t x_row_step, int c_in,
                          const Pair* __restrict dp, std::int64_t dy_row_step, int rows,
                          int col_pairs, float* __restrict acc_mem, std::int64_t ld_j) {
  constexpr int kKW = 3, kLd = kLanes * V;
  __m512 acc[kKW][G][V];
#pragma GCC unroll 4
  for (int j = 0; j < kKW; ++j)
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g)
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[j][g][v] = _mm512_loadu_ps(acc_mem + j * ld_j + kLd * g + kLanes * v);
  for (int r = 0; r < rows; ++r) {
    const Pair* xc = xp + r * x_row_step;
    const Pair* dc = dp + r * dy_row_step + kLd * (kKW - 1);
    for (int c = 0; c < col_pairs; ++c, xc += c_in, dc += 2 * kLd) {
      __m512i d[kKW][V];
#pragma GCC unroll 4
      for (int j = 0; j < kKW; ++j)
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) d[j][v] = _mm512_loadu_si512(dc - kLd * j + kLanes * v);
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) {
        const __m512i b = broadcast(xc[g]);
#pragma GCC unroll 4
        for (int j = 0; j < kKW; ++j)
#pragma GCC unroll 4
          for (int v = 0; v < V; ++v) acc[j][g][v] = dot(acc[j][g][v], b, d[j][v]);
      }
    }
  }
#pragma GCC unroll 4
  for (int j = 0; j < kKW; ++j)
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g)
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) _mm512_storeu_ps(acc_mem + j * ld_j + kLd * g + kLanes * v, acc[j][g][v]);
}

// The input channels a row pass holds with V vectors of output channels: 3 * G * V accumulators.
template <int V>
constexpr int kRowPassChannels = 8 / V;

// Whether pair_weight_grad_rows handles this convolution: up to 32 output channels, a 3-wide
// kernel, stride 1.
bool weight_row_kernel_applies(const Conv2dShape& s) {
  return s.c_out <= 2 * kLanes && s.kw == 3 && s.stride_h == 1 && s.stride_w == 1;
}

// V vectors of output channels (V * 16 >= c_out, V 1 or 2).
template <int V, typename In>
void pair_weight_grad_rows(const CpuContext& ctx, const Conv2dShape& s, const In* x,
                           const float* dy, float* dw) {
  constexpr int kKW = 3, kG = kRowPassChannels<V>, kLd = kLanes * V;
  static constexpr auto kPasses = kernel_table<kG>([]<int G>() { return &pair_weight_row_pass<G, V>; });
  const int oh = s.out_h(), ow = s.out_w();
  const int hp = s.h + 2 * s.pad_h, wpad = s.w + 2 * s.pad_w;
  const int col_pairs = (wpad + 1) / 2;
  const std::int64_t x_row_step = std::int64_t{col_pairs} * s.c_in;
  const std::int64_t image_in = std::int64_t{s.h} * s.w * s.c_in;
  const std::int64_t image_out = std::int64_t{oh} * ow * s.c_out;
  // dy pairs at every column k of [0, 2 * col_pairs + 2): (dy at k - 2, dy at k - 1).
  const int dy_cols = 2 * col_pairs + 2;
  const std::int64_t dy_row_step = std::int64_t{dy_cols} * kLd;
  const int ci_groups = (s.c_in + kG - 1) / kG;
  const std::int64_t tasks = std::int64_t{s.kh} * ci_groups;
  const std::int64_t ld_j = std::int64_t{s.c_in} * kLd;
  const std::int64_t dw_size = std::int64_t{s.kh} * kKW * ld_j;  // [i][j][ci][kLd]
  float* dwp = zeroed_scratch(Scratch::kWeights, dw_size);

  // Adds images [n0, n1), tasks [t0, t1) (task = kernel row, input-channel group) into dst.
  auto accumulate = [&](int n0, int n1, std::int64_t t0, std::int64_t t1, float* dst) {
    Pair* xb = scratch_pairs(Scratch::kInput, hp * x_row_step);
    Pair* db = scratch_pairs(Scratch::kOutput, oh * dy_row_step);
    for (int n = n0; n < n1; ++n) {
      pack_column_pairs(s, x + n * image_in, col_pairs, x_row_step, xb);
      // dy: column k holds (dy at k - 2, dy at k - 1), each column rounded once.
      for (int v = 0; v < V; ++v) {
        const __mmask16 lanes = s.c_out > kLanes * v ? detail::first_lanes(s.c_out - kLanes * v) : 0;
        for (int r = 0; r < oh; ++r) {
          const float* row = dy + n * image_out + std::int64_t{r} * ow * s.c_out + kLanes * v;
          Pair* d = db + r * dy_row_step + kLanes * v;
          __m512i before = _mm512_setzero_si512();  // the rounded column k - 2
          for (int k = 0; k < dy_cols; ++k, d += kLd) {
            const int c = k - 1;
            const __m512i at = c >= 0 && c < ow
                                   ? detail::rounded_bits16(_mm512_maskz_loadu_epi32(lanes, row + std::int64_t{c} * s.c_out))
                                   : _mm512_setzero_si512();
            _mm512_storeu_si512(d, _mm512_or_si512(_mm512_srli_epi32(before, 16), at));
            before = at;
          }
        }
      }
      for (std::int64_t t = t0; t < t1; ++t) {
        const int i = static_cast<int>(t / ci_groups);
        const int ci0 = static_cast<int>(t % ci_groups) * kG;
        const int g = std::min(kG, s.c_in - ci0);
        kPasses[g - 1](xb + i * x_row_step + ci0, x_row_step, s.c_in, db, dy_row_step, oh, col_pairs,
                       dst + (std::int64_t{i} * kKW * s.c_in + ci0) * kLd, ld_j);
      }
    }
  };
  sum_weight_grad(ctx, s.n, tasks, 1, dw_size, dwp, accumulate);
  unpack_weight_grad(s, dwp, kLd, dw);  // s.kw == kKW (weight_row_kernel_applies)
}

// ---- the kernels of the table --------------------------------------------------------------

// This object's drivers, for detail::Bf16Table.
struct PairDrivers {
  template <typename In, typename Get>
  static void conv(const CpuContext& ctx, const Conv2dShape& s, const In* x, std::int64_t ld_x,
                   const float* bias, float* y, std::int64_t ld_y, Get get) {
    pair_conv(ctx, s, x, ld_x, bias, y, ld_y, get);
  }
  static void backward_input_phases(const CpuContext& ctx, const Conv2dShape& s, const float* dy,
                                    const float* w, float* dx) {
    with_block(s.c_in, [&]<int V>() { pair_backward_input_phases<V>(ctx, s, dy, w, dx); });
  }
  template <typename In>
  static void backward_weight(const CpuContext& ctx, const Conv2dShape& s, const In* x, const float* dy,
                              float* dw) {
    if (weight_row_kernel_applies(s)) {
      if (s.c_out <= kLanes) return pair_weight_grad_rows<1>(ctx, s, x, dy, dw);
      return pair_weight_grad_rows<2>(ctx, s, x, dy, dw);
    }
    with_block(s.c_out, [&]<int V>() { pair_weight_grad<V>(ctx, s, x, dy, dw); });
  }
};

}  // namespace
}  // namespace towerflow::cpu::TW_ISA

extern "C" const towerflow::cpu::Bf16KernelTable TW_KERNEL_TABLE_NAME(towerflow_bf16_pairs_) =
    towerflow::cpu::TW_ISA::detail::Bf16Table<towerflow::cpu::TW_ISA::PairDrivers>::kTable;
