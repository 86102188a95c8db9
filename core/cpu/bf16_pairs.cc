// bf16 convolutions and GEMM on products of bf16 pairs (bf16_pairs.h), compiled once with
// AVX512-BF16 and once for AVX-512F with the instruction emulated.
#include "core/cpu/bf16_pairs.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/cpu/bf16_packing.h"
#include "core/cpu/conv_impl.h"
#include "core/cpu/simd_impl.h"
#include "core/cpu/winograd_impl.h"

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
//                            pixels: per pass (Note [Weight-gradient pass length]), x is packed
//                            [pixel pair][q] for each kernel row (once for all of them where they
//                            can share it: Note [Weight-gradient passes in pixel pairs] in
//                            bf16_packing.h) and dy [pixel pair][output channel]; the tile is
//                            conv.cc's weight tile (Q inputs x V vectors). Images and tiles follow
//                            Note [Weight gradient: image groups or tiles].
//   GEMM                     a 1x1 convolution over the rows of op(a) as pixels.
// Every output element is summed by one thread in a fixed order, so results do not depend on the
// thread count (Note [Deterministic reductions]); the order differs from the fp32 kernels' (pairs).
//
// Without AVX512-BF16 the instruction is emulated with two FMAs per lane in its own order (the
// high products, then the low). A product of two bf16 is exact in fp32, so each FMA rounds as
// the instruction's accumulation does and the emulation gives the same bits, except that the
// instruction treats denormal inputs as zero and flushes denormal results. (On the instruction's
// build the packing rounds with vcvtneps2bf16 and vcvtne2ps2bf16, which flush denormals too:
// pair_of in bf16_packing.h. Against rounded_bits16 there, the direct kernels of ResNet-20's
// layers took up to 21% less time on a 2-core Zen 4 EPYC, most of them 2-15% (`towerflow_bench_ops
// --precision bf16` with TOWERFLOW_BF16_KERNELS=avx512bf16).) The emulation exists so that every
// packing and tiling path runs on any AVX-512 CPU, in the tests. The timing object (TW_BF16_DOT_TIMING, linked only into
// towerflow_bench_ops_bf16_timing) computes each vdpbf16ps as one FMA on the raw pairs instead:
// wrong values, but the instruction's cost if it issues at the FMA's rate (the premise of its
// twice-fp32 throughput), so that the kernels can be timed and tuned on CPUs without it
// (docs/precision.md, which has the figures and their commands).

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
using detail::pair_of;
using detail::parallel_rows;
using detail::pass_pair_rows;
using detail::pixel_offsets;
using detail::Pair;
using detail::round_up;
using detail::rounded_bits16;
using detail::Scratch;
using detail::scratch_pairs;
using detail::StridePhases;
using detail::sum_weight_grad;
using detail::to_pairs;
using detail::unpack_weight_grad;
using detail::WeightTiles;
using detail::winograd_applies;
using detail::winograd_weight_grad_out;
using detail::WinogradTiles;
using detail::WinogradWeightGradPlan;
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
// out + out_offs[p] (its first `lanes` channels), or added to what is there with `add`.
template <int P, int V>
void pair_tile(const std::uint16_t* img16, const std::int64_t* offs, std::int64_t row_step,
               int kh, int q_len, const Pair* __restrict wp, const float* bias,
               float* __restrict out, const std::int64_t* out_offs, int lanes, bool add) {
  if (add) {  // Note [Prefetching what a tile adds to]
#pragma GCC unroll 32
    for (int p = 0; p < P; ++p) detail::prefetch_floats(out + out_offs[p], lanes);
  }
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
    if (add) {
#pragma GCC unroll 32
      for (int p = 0; p < P; ++p)
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) {
          float* o = out + out_offs[p] + kLanes * v;
          _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), acc[p][v]));
        }
      return;
    }
#pragma GCC unroll 32
    for (int p = 0; p < P; ++p)
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) _mm512_storeu_ps(out + out_offs[p] + kLanes * v, acc[p][v]);
  } else {
    for (int p = 0; p < P; ++p) {
      float tmp[kLanes * V];
      for (int v = 0; v < V; ++v) _mm512_storeu_ps(tmp + kLanes * v, acc[p][v]);
      float* o = out + out_offs[p];
      if (add) {
        for (int l = 0; l < lanes; ++l) o[l] += tmp[l];
      } else {
        std::copy(tmp, tmp + lanes, o);
      }
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
                   const float* bias, float* __restrict out, std::int64_t ld_y, int lanes, bool add) {
  if (add) {  // Note [Prefetching what a tile adds to]
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) detail::prefetch_floats(out + t * ld_y, lanes);
  }
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
    for (int t = 0; t < T; ++t) {
      float* o = out + kLanes * t;
      _mm512_storeu_ps(o, add ? _mm512_add_ps(_mm512_loadu_ps(o), acc[t]) : acc[t]);
    }
  } else {
    for (int t = 0; t < T; ++t) {
      float tmp[kLanes];
      _mm512_storeu_ps(tmp, acc[t]);
      float* o = out + t * ld_y;
      if (add) {
        for (int l = 0; l < lanes; ++l) o[l] += tmp[l];
      } else {
        std::copy(tmp, tmp + lanes, o);
      }
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
                   const float* bias, float* y, std::int64_t ld_y, Get get, detail::Store store) {
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
                            yrow + std::int64_t{x0} * ld_y, ld_y, s.c_out, store == detail::Store::kAdd);
        }
      }
    });
  });
}

// ---- the general convolution ---------------------------------------------------------------

// y = conv(x, w) (+ bias), or y += it with Store::kAdd, the weights read through get(co, ci, i,
// j). Pixels of x are ld_in values apart (floats, or bf16.h's bf16 inputs), pixels of y ld_y
// apart; conv_input says which of them are converted. Threads split the output rows, as
// direct_conv does.
template <typename In, typename Get>
void pair_conv(const CpuContext& ctx, const Conv2dShape& conv, const In* x, std::int64_t ld_in,
               const float* bias, float* y, std::int64_t ld_y, Get get,
               detail::Store store = detail::Store::kOverwrite) {
  if (row_kernel_applies(conv)) {
    if (conv.c_in <= 4) return pair_row_conv<2>(ctx, conv, x, ld_in, bias, y, ld_y, get, store);
    return pair_row_conv<8>(ctx, conv, x, ld_in, bias, y, ld_y, get, store);
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
                               ybase + p0 * ld_y + cb * kBlock, out_offs, lanes, store == detail::Store::kAdd);
        });
      });
    });
  });
}

// ---- backward input by stride phases ------------------------------------------------------

// conv.cc's backward_input_phases (Note [Backward input by stride phases]) on pairs of dy's
// channels: dx written, or added to with Store::kAdd.
template <int V>
void pair_backward_input_phases(const CpuContext& ctx, const Conv2dShape& s, const float* dy,
                                const float* w, float* dx, detail::Store store) {
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
      const detail::Store st = g.zero_rows_to_add(s, row_begin, row_end, store, img_dx);  // Note [Phases into zeroed rows]
      g.for_each_phase_tile<kP>(s, row_begin, row_end, row_step, half, kBlock, st, img_dx,
                                [&](int phase, int ma, int mb, int p, const std::int64_t* offs,
                                    const std::int64_t* out_offs, int cb, int lanes) {
                                  const std::int64_t wblock = std::int64_t{ma} * mb * half * kBlock;
                                  kPairTiles<V>[p - 1](buf, offs, row_step, ma, mb * half,
                                                       wp + g.phase_offset[phase] + cb * wblock, nullptr,
                                                       img_dx + cb * kBlock, out_offs, lanes,
                                                       st == detail::Store::kAdd);
                                });
    });
  });
}

// Note [Weight-gradient pass length]
// A pass of pair_weight_grad_from packs dy and x for about 96 pixels, as conv.cc's weight_grad,
// so that the packed pairs stay in cache across the tiles that share them. Where the kernel rows
// share one packing (Note [Weight-gradient passes in pixel pairs]), a pass also packs the kh - 1
// output rows after it, which the next pass packs again: with tfcnn's 5x5 kernels on 32x32
// images a 96-pixel pass (3 rows) packed 7 rows of x, 2.3 times the image. There the pass is at
// least 4 * (kh - 1) rows, so that the rows packed twice are at most a quarter of those packed,
// up to 512 pixels (the pass's dy pairs, 256 of them at 64 output channels, then take 64 KiB).
// On a 2-core Zen 4 EPYC, tfcnn's conv1 weight gradient (3->64, 5x5, 32x32, batch 128), with dy
// made by its max pool's backward in training (Conv2DMaxPoolRelu's gradient, `towerflow_bench_train
// --model tfcnn --precision bf16 --trace`), took 5.0 ms against 6.0 with 96-pixel passes. With
// pair_of's packing as well, tfcnn's 5x5 64->64 weight gradient on 16x16 images (one pass per
// image) took 16.4 ms against 18.0 (`towerflow_bench_ops --precision bf16` with
// TOWERFLOW_BF16_KERNELS=avx512bf16).

// Output rows per pass of pair_weight_grad_from (Note [Weight-gradient pass length]).
int weight_pass_rows(const Conv2dShape& s) {
  const int oh = s.out_h(), ow = s.out_w();
  int rows = 96 / ow;
  if (detail::shared_kernel_rows(s)) rows = std::max(rows, std::min(4 * (s.kh - 1), 512 / ow));
  return std::max(1, std::min(oh, rows));
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

// dw = correlate(x, dy), built in dwp [kh][kw*c_in][blocks*B] as conv.cc's weight_grad. dy's
// output rows come from dy_rows(n, row0, count, buf, first) (bf16.h's DyRows): the stored dy's,
// or rows made as the passes ask for them, into a buffer of the thread's.
template <int V, typename In, typename DyRowsFn>
void pair_weight_grad_from(const CpuContext& ctx, const Conv2dShape& s, const In* x, DyRowsFn&& dy_rows,
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
  const int rows_per_pass = weight_pass_rows(s);
  const std::int64_t max_pairs = (std::int64_t{rows_per_pass} * ow + 1) / 2;

  auto accumulate = [&](int n0, int n1, std::int64_t t0, std::int64_t t1, float* dst) {
    In* xbuf = reinterpret_cast<In*>(padded_image_buffer(s));
    Pair* dyb = scratch_pairs(Scratch::kOutput, max_pairs * ld_acc);
    Pair* xpb = scratch_pairs(Scratch::kPacked, pass_pair_rows(s, rows_per_pass * ow, max_pairs) * q_len);
    float* rows_buf = scratch(Scratch::kRows, static_cast<std::size_t>(std::int64_t{rows_per_pass} * ow * s.c_out));
    for (int n = n0; n < n1; ++n) {
      const In* img = padded_image(s, x + n * image_in, xbuf);
      for (int r0 = 0; r0 < oh; r0 += rows_per_pass) {
        const int pass_rows = std::min(rows_per_pass, oh - r0);
        const int pixels = pass_rows * ow;
        const int pairs = (pixels + 1) / 2;
        // dy [pair][ld_acc]: pixels 2k and 2k + 1 of the pass (the last one alone when odd).
        const float* dpass = dy_rows(n, r0, pass_rows, rows_buf, t0 == 0);
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

// pair_weight_grad on a stored dy.
template <int V, typename In>
void pair_weight_grad(const CpuContext& ctx, const Conv2dShape& s, const In* x, const float* dy, float* dw) {
  const std::int64_t row = std::int64_t{s.out_w()} * s.c_out, image = s.out_h() * row;
  pair_weight_grad_from<V>(ctx, s, x,
                           [&](int n, int row0, int, float*, bool) { return dy + n * image + row0 * row; }, dw);
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

// ---- the Winograd weight gradient ----------------------------------------------------------

// Note [bf16 Winograd weight gradient]
// conv.cc's Winograd weight gradient (Note [Winograd convolution]) with its products on
// vdpbf16ps: x and dy are rounded to bf16 as every bf16 kernel reads them, transformed in fp32
// (V = B^T d B of each tile's 4x4 input patch, dM = A dY A^T of its 2x2 dy), and the transforms
// are rounded to bf16 once more, in pairs of neighbouring tiles, for the products dU[xi] = sum
// over tiles of V[xi]^T dM[xi], which pair_weight_tile sums in fp32 with the tiles as its
// pixels; dw = G^T dU G in fp32. The multiply-adds are 16/36 of the direct kernel's. The
// transforms are made in registers, two tiles at a time, and stored as pairs (on the
// instruction's build rounded by vcvtne2ps2bf16, which flushes denormals as vdpbf16ps does;
// on the emulated one by rounded_bits16, which keeps them): stored in fp32 and paired by
// to_pairs in a second pass, the transforms took 70% of the time of ResNet-20's 32->32 layer.
// The second rounding doubles the error: against the fp32 gradient of the fp32 operands, the
// relative (root-mean-square) error of ResNet-20's 16-, 32- and 64-channel weight gradients at
// batch 128 was 4.0-4.3e-3, against 2.2-2.4e-3 for the direct bf16 kernels (random ReLU inputs
// and gradients, a 2-core Zen 4 EPYC), within the bf16 tolerance of the tests. Each dU element
// is summed by one thread in a fixed order (sum_weight_grad), whatever the thread count. It is a
// candidate of the kernel choice ("winograd-avx512bf16"), taken where it measures faster than
// oneDNN's and the direct pair kernels. On a 2-core Zen 4 EPYC (`towerflow_bench_ops --threads 2
// --precision bf16 --filter resnet20`, its winograd_bwd_weight_bf16 rows against oneDNN's
// conv_bwd_weight_bf16, two runs) it took 1.13 ms against 1.66-1.76 for 32->32 16x16,
// 1.19-1.21 against 1.84 for 64->64 8x8 and 1.50-1.60 against 1.99-2.14 for 16->16 32x32.

// Image `image` ([h][w][c_in] floats or bf16 bits) rounded to bf16 into dst ([hp][wp][c_in]
// floats) at (pad_h, pad_w), zeros elsewhere.
template <typename In>
void embed_rounded(const Conv2dShape& s, const WinogradTiles& g, const In* image, float* dst) {
  const std::int64_t row = g.pad_row, width = std::int64_t{s.w} * s.c_in;
  for (int r = 0; r < g.hp; ++r) {
    float* d = dst + r * row;
    const int src = r - s.pad_h;
    if (src < 0 || src >= s.h) {
      std::fill(d, d + row, 0.0f);
      continue;
    }
    float* body = d + std::int64_t{s.pad_w} * s.c_in;
    std::fill(d, body, 0.0f);
    const In* p = image + src * width;
    for (std::int64_t i = 0; i < width; i += kLanes) {
      const __mmask16 m = detail::first_lanes(width - i);
      _mm512_mask_storeu_epi32(body + i, m, rounded_bits16(detail::load_bits16(m, p + i)));
    }
    std::fill(body + width, d + row, 0.0f);
  }
}

// The input transforms V = B^T d B of tiles a and b (b null: zeros), channels `lanes` of 16
// from c0 of their 4x4 patches (rows `row` floats apart, pixels c_in), as pairs (V of a, V of
// b): V[xi] written at v + xi * plane. Column j of V takes columns of d B, which take two of the
// patch's four pixels per row, so each column's 4 values of both tiles are made from 16 loads
// and stored as 4 pair vectors.
inline void winograd_input_pairs(const float* a, const float* b, std::int64_t row, int c_in, int c0,
                                 __mmask16 lanes, Pair* v, std::int64_t plane) {
  // Column j of d B, (d0 - d2, d1 + d2, d2 - d1, d1 - d3) in each row: d[p] + sign * d[q].
  constexpr int kP[4] = {0, 1, 2, 1}, kQ[4] = {2, 2, 1, 3};
  constexpr float kSign[4] = {-1.0f, 1.0f, -1.0f, -1.0f};
  for (int j = 0; j < 4; ++j) {
    __m512 ea[4], eb[4];
    const __m512 sign = _mm512_set1_ps(kSign[j]);
    for (int r = 0; r < 4; ++r) {
      const float* pa = a + r * row + c0;
      ea[r] = _mm512_fmadd_ps(sign, _mm512_maskz_loadu_ps(lanes, pa + kQ[j] * c_in),
                              _mm512_maskz_loadu_ps(lanes, pa + kP[j] * c_in));
      if (b) {
        const float* pb = b + r * row + c0;
        eb[r] = _mm512_fmadd_ps(sign, _mm512_maskz_loadu_ps(lanes, pb + kQ[j] * c_in),
                                _mm512_maskz_loadu_ps(lanes, pb + kP[j] * c_in));
      } else {
        eb[r] = _mm512_setzero_ps();
      }
    }
    const __m512 va[4] = {_mm512_sub_ps(ea[0], ea[2]), _mm512_add_ps(ea[1], ea[2]),
                          _mm512_sub_ps(ea[2], ea[1]), _mm512_sub_ps(ea[1], ea[3])};
    const __m512 vb[4] = {_mm512_sub_ps(eb[0], eb[2]), _mm512_add_ps(eb[1], eb[2]),
                          _mm512_sub_ps(eb[2], eb[1]), _mm512_sub_ps(eb[1], eb[3])};
    for (int i = 0; i < 4; ++i)
      _mm512_mask_storeu_epi32(v + (4 * i + j) * plane + c0, lanes, pair_of(va[i], vb[i]));
  }
}

// The 2x2 dy of a tile at y (rows x cols of it inside the image, the rest zero), channels
// `lanes` of 16 from c0, each rounded to bf16.
struct TileDy {
  __m512 d[2][2];
  TileDy(const float* y, int rows, int cols, std::int64_t row, int c_out, int c0, __mmask16 lanes) {
    for (int a = 0; a < 2; ++a)
      for (int b = 0; b < 2; ++b)
        d[a][b] = y && a < rows && b < cols
                      ? _mm512_castsi512_ps(rounded_bits16(
                            _mm512_maskz_loadu_epi32(lanes, y + a * row + std::int64_t{b} * c_out + c0)))
                      : _mm512_setzero_ps();
  }
  // Row r of A dY, (d00, d01), (d00 + d10, d01 + d11), (d00 - d10, d01 - d11), (-d10, -d11):
  // its column k.
  __m512 z(int r, int k) const {
    switch (r) {
      case 0: return d[0][k];
      case 1: return _mm512_add_ps(d[0][k], d[1][k]);
      case 2: return _mm512_sub_ps(d[0][k], d[1][k]);
      default: return _mm512_sub_ps(_mm512_setzero_ps(), d[1][k]);
    }
  }
};

// dM = A dY A^T of tiles a and b (winograd_output_adjoint's), channels `lanes` of 16 from c0,
// as pairs (dM of a, dM of b): dM[xi] written at m + xi * plane.
inline void winograd_output_adjoint_pairs(const TileDy& a, const TileDy& b, int c0, __mmask16 lanes,
                                          Pair* m, std::int64_t plane) {
  for (int r = 0; r < 4; ++r) {
    const __m512 a0 = a.z(r, 0), a1 = a.z(r, 1), b0 = b.z(r, 0), b1 = b.z(r, 1);
    const __m512 zero = _mm512_setzero_ps();
    _mm512_mask_storeu_epi32(m + (4 * r + 0) * plane + c0, lanes, pair_of(a0, b0));
    _mm512_mask_storeu_epi32(m + (4 * r + 1) * plane + c0, lanes, pair_of(_mm512_add_ps(a0, a1), _mm512_add_ps(b0, b1)));
    _mm512_mask_storeu_epi32(m + (4 * r + 2) * plane + c0, lanes, pair_of(_mm512_sub_ps(a0, a1), _mm512_sub_ps(b0, b1)));
    _mm512_mask_storeu_epi32(m + (4 * r + 3) * plane + c0, lanes, pair_of(_mm512_sub_ps(zero, a1), _mm512_sub_ps(zero, b1)));
  }
}

// One tile of a group: its 4x4 input patch in the padded image, the offset of its dy in the
// image's dy, and the rows x cols of its 2x2 outputs inside the image.
struct WinogradTile {
  const float* patch;
  std::int64_t at;
  int rows, cols;
};

// dw = correlate(x, dy) for s with winograd_applies(s), by Note [bf16 Winograd weight gradient];
// V vectors of output channels per block.
template <int V, typename In>
void pair_winograd_weight_grad(const CpuContext& ctx, const Conv2dShape& s, const In* x,
                               const float* dy, float* dw) {
  constexpr int kBlock = kLanes * V;
  constexpr int kQ = kMaxInputs<V>;
  constexpr int kXi = 16;
  static constexpr auto kTiles = kernel_table<kQ>([]<int Q>() { return &pair_weight_tile<Q, V>; });
  const int c_in = s.c_in, c_out = s.c_out;
  const WinogradWeightGradPlan plan(s, kBlock, kQ, 2);  // winograd_impl.h's, the transforms stored in tile pairs
  const std::int64_t ld_m = plan.ld_m;
  const WeightTiles& tiles = plan.tiles;
  const WinogradTiles& g = plan.g;
  float* dup = zeroed_scratch(Scratch::kWeights, plan.du_size);
  const std::int64_t pass_pairs = plan.images * ((g.group + 1) / 2);  // each image's tiles paired apart
  const std::int64_t vp_plane = pass_pairs * c_in + 16, mp_plane = pass_pairs * ld_m + 16;
  const std::int64_t image_in = std::int64_t{s.h} * s.w * c_in;

  auto accumulate = [&](int n0, int n1, std::int64_t u0, std::int64_t u1, float* dst) {
    Pair* vp = scratch_pairs(Scratch::kOutput, kXi * (vp_plane + mp_plane));
    Pair* mp = vp + kXi * vp_plane;
    // Not kAux: sum_weight_grad keeps the image groups' partial sums there.
    float* img = scratch(Scratch::kPacked, static_cast<std::size_t>(g.hp * g.pad_row));
    // The lanes of a partial last block past c_out, which the transforms do not write, are zero.
    if (c_out != ld_m) std::fill(mp, mp + kXi * mp_plane, Pair{0});
    thread_local std::vector<WinogradTile> group;
    group.resize(static_cast<std::size_t>(g.group));
    // Passes of plan.images images (winograd_impl.h's WinogradWeightGradPlan).
    for (int n = n0; n < n1; n += plan.images) {
      const int last = std::min(n1, n + plan.images);
      for (std::int64_t k = 0; k < g.per_image; ++k) {
        int pairs = 0;  // the pass's tile pairs, image after image
        for (int im = n; im < last; ++im) {
          if (k == 0) embed_rounded(s, g, x + im * image_in, img);
          const float* dimg = dy + std::int64_t{im} * g.oh * g.y_row;
          const int count = g.for_each_tile(k, img, [&](int t, const float* patch, std::int64_t at, int rows, int cols) {
            group[t] = {patch, at, rows, cols};
          });
          // The transforms of the image's tiles 2q and 2q + 1 (zeros for a missing last one) as
          // the pass's pair `pairs` + q.
          for (int q = 0; q < (count + 1) / 2; ++q) {
            const WinogradTile& ta = group[2 * q];
            const WinogradTile* tb = 2 * q + 1 < count ? &group[2 * q + 1] : nullptr;
            const std::int64_t at = pairs + q;
            for (int c0 = 0; c0 < c_in; c0 += kLanes)
              winograd_input_pairs(ta.patch, tb ? tb->patch : nullptr, g.pad_row, c_in, c0,
                                   detail::first_lanes(c_in - c0), vp + at * c_in, vp_plane);
            for (int c0 = 0; c0 < c_out; c0 += kLanes) {
              const __mmask16 lanes = detail::first_lanes(c_out - c0);
              const TileDy da(dimg + ta.at, ta.rows, ta.cols, g.y_row, c_out, c0, lanes);
              const TileDy db(tb ? dimg + tb->at : nullptr, tb ? tb->rows : 0, tb ? tb->cols : 0, g.y_row,
                              c_out, c0, lanes);
              winograd_output_adjoint_pairs(da, db, c0, lanes, mp + at * ld_m, mp_plane);
            }
          }
          pairs += (count + 1) / 2;
        }
        for (std::int64_t u = u0; u < u1; ++u) {
          const WeightTiles::Tile& w = tiles[u];
          kTiles[w.q - 1](vp + w.i * vp_plane + w.q0, c_in, mp + w.i * mp_plane + w.cb * kBlock, ld_m, pairs,
                          dst + (std::int64_t{w.i} * c_in + w.q0) * ld_m + w.cb * kBlock, ld_m);
        }
      }
    }
  };
  sum_weight_grad(ctx, s.n, tiles.count(), 1, plan.du_size, dup, accumulate);

  winograd_weight_grad_out(ctx, s, dup, ld_m, dw);
}

// ---- the Winograd forward ------------------------------------------------------------------

// Note [bf16 Winograd convolution]
// conv.cc's Winograd forward (Note [Winograd convolution]) with its 16 products per group on
// the forward pair tile: the input transforms V = B^T d B of x rounded to bf16 are rounded once
// more, into bf16 rows of their channels (a tile's channels are its channel pairs, as a bf16
// image's pixel is), the transforms U = G g G^T of the rounded weights likewise, packed as the
// pair kernels pack a 1x1 convolution's weights; the products M[xi] = V[xi] U[xi] sum in fp32 and
// the output transform Y = A^T M A runs in fp32, as conv.cc's. The backward input at stride 1
// runs through it as the forward of dy with the flipped kernel. As in the weight gradient (Note
// [bf16 Winograd weight gradient]), the second rounding puts the result within the bf16
// tolerance of the other kernels rather than at their bits. Candidates of the kernel choice
// ("winograd-avx512bf16"). On a 2-core Zen 4 EPYC (the same command's winograd_fwd_bf16 and
// winograd_bwd_input_bf16 rows) the forward took 1.20-1.23 ms against oneDNN's 1.35-1.37 on
// ResNet-20's 32->32 16x16 layer and 1.00 against 1.25 on its 64->64 8x8 one, the backward
// input 1.21-1.23 against 1.35-1.37 and 1.00-1.01 against 1.19-1.20; its 16->16 32x32 layer ran
// slower than oneDNN's (2.1-2.6 ms against 1.6-1.8), and the choice keeps oneDNN there. Short
// reductions (16 or 32 channel pairs per product) leave the pair tile less of the time than in
// the direct kernels.

// v rounded to bf16, its first lanes of 16 stored at p.
inline void store_bf16(std::uint16_t* p, __mmask16 lanes, __m512 v) {
#if defined(__AVX512BF16__)
  _mm256_mask_storeu_epi16(p, lanes, (__m256i)_mm512_cvtneps_pbh(v));
#else
  _mm256_mask_storeu_epi16(p, lanes,
                           _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded_bits16(_mm512_castps_si512(v)), 16)));
#endif
}

// The input transforms V = B^T d B of one tile (winograd_input's), c_in channels, rounded to
// bf16: V[xi] written at v + xi * plane.
inline void winograd_input_bf16(const float* __restrict p, std::int64_t row, int c_in,
                                std::uint16_t* __restrict v, std::int64_t plane) {
  for (int c0 = 0; c0 < c_in; c0 += kLanes) {
    const __mmask16 m = detail::first_lanes(c_in - c0);
    __m512 e[4][4];  // d B
    for (int r = 0; r < 4; ++r) {
      const float* q = p + r * row + c0;
      const __m512 d0 = _mm512_maskz_loadu_ps(m, q), d1 = _mm512_maskz_loadu_ps(m, q + c_in),
                   d2 = _mm512_maskz_loadu_ps(m, q + 2 * c_in), d3 = _mm512_maskz_loadu_ps(m, q + 3 * c_in);
      e[r][0] = _mm512_sub_ps(d0, d2);
      e[r][1] = _mm512_add_ps(d1, d2);
      e[r][2] = _mm512_sub_ps(d2, d1);
      e[r][3] = _mm512_sub_ps(d1, d3);
    }
    for (int j = 0; j < 4; ++j) {
      store_bf16(v + (0 + j) * plane + c0, m, _mm512_sub_ps(e[0][j], e[2][j]));
      store_bf16(v + (4 + j) * plane + c0, m, _mm512_add_ps(e[1][j], e[2][j]));
      store_bf16(v + (8 + j) * plane + c0, m, _mm512_sub_ps(e[2][j], e[1][j]));
      store_bf16(v + (12 + j) * plane + c0, m, _mm512_sub_ps(e[1][j], e[3][j]));
    }
  }
}

// winograd_output (winograd_impl.h) on 16-lane vectors, the same sums in the same order: the
// output transform Y = A^T m A of one tile's c_out channels, m[xi] at m + xi * plane, its rows x
// cols outputs inside the image written at y (rows `row` values apart, pixels c_out apart), or
// added to with Store::kAdd, plus bias (nullable). Out float, or std::uint16_t for bf16 bits
// (store_bf16's rounding; overwritten only).
template <typename Out>
inline void winograd_output16(const float* __restrict m, std::int64_t plane, int c_out, const float* bias,
                              detail::Store store, Out* __restrict y, std::int64_t row, int rows, int cols) {
  for (int c0 = 0; c0 < c_out; c0 += kLanes) {
    const __mmask16 lanes = detail::first_lanes(c_out - c0);
    __m512 s0[4], s1[4];  // A^T m
    for (int j = 0; j < 4; ++j) {
      const __m512 m0 = _mm512_maskz_loadu_ps(lanes, m + (0 + j) * plane + c0),
                   m1 = _mm512_maskz_loadu_ps(lanes, m + (4 + j) * plane + c0),
                   m2 = _mm512_maskz_loadu_ps(lanes, m + (8 + j) * plane + c0),
                   m3 = _mm512_maskz_loadu_ps(lanes, m + (12 + j) * plane + c0);
      s0[j] = _mm512_add_ps(_mm512_add_ps(m0, m1), m2);
      s1[j] = _mm512_sub_ps(_mm512_sub_ps(m1, m2), m3);
    }
    __m512 out[2][2] = {{_mm512_add_ps(_mm512_add_ps(s0[0], s0[1]), s0[2]), _mm512_sub_ps(_mm512_sub_ps(s0[1], s0[2]), s0[3])},
                        {_mm512_add_ps(_mm512_add_ps(s1[0], s1[1]), s1[2]), _mm512_sub_ps(_mm512_sub_ps(s1[1], s1[2]), s1[3])}};
    if (bias) {
      const __m512 b = _mm512_maskz_loadu_ps(lanes, bias + c0);
      for (auto& r : out)
        for (__m512& o : r) o = _mm512_add_ps(o, b);
    }
    for (int a = 0; a < rows; ++a)
      for (int b = 0; b < cols; ++b) {
        Out* o = y + a * row + b * c_out + c0;
        if constexpr (std::is_same_v<Out, std::uint16_t>) {  // overwritten, never added to
          store_bf16(o, lanes, out[a][b]);
        } else {
          const __m512 v = store == detail::Store::kAdd ? _mm512_add_ps(_mm512_maskz_loadu_ps(lanes, o), out[a][b]) : out[a][b];
          _mm512_mask_storeu_ps(o, lanes, v);
        }
      }
  }
}

// y = conv(x, w) + bias (y += it with Store::kAdd) for s with winograd_applies(s), by Note [bf16
// Winograd convolution]; get(co, ci, i, j) gives the weights, bias (nullable) c_out values; V
// vectors of output channels per block.
template <int V, typename In, typename Out, typename Get>
void pair_winograd_conv(const CpuContext& ctx, const Conv2dShape& s, const In* x, const float* bias,
                        Out* y, Get get, detail::Store store) {
  constexpr int kBlock = kLanes * V;
  constexpr int kP = kMaxPixels<V>;
  constexpr int kXi = 16;
  const int c_in = s.c_in, c_out = s.c_out, half = c_in / 2;  // c_in is even (winograd_applies)
  const int blocks = (c_out + kBlock - 1) / kBlock;
  const std::int64_t ld_m = std::int64_t{blocks} * kBlock;
  // The transforms of the rounded weights, [xi][ci][co], then packed as pairs [xi][block][pair][lane].
  const std::int64_t per_xi = ld_m * half, plane_u = std::int64_t{c_out} * c_in;
  float* u = scratch(Scratch::kAux, static_cast<std::size_t>(kXi * plane_u));
  detail::winograd_weights(
      ctx, c_out, c_in, [&](int co, int ci, int i, int j) { return std::bit_cast<float>(detail::rounded_bits(get(co, ci, i, j))); },
      [&](int co, int ci, const detail::Vec8* t) {
        for (int xi = 0; xi < kXi; ++xi) detail::store8(u + xi * plane_u + std::int64_t{ci} * c_out + co, t[xi]);
      });
  Pair* wp = scratch_pairs(Scratch::kWeights, kXi * per_xi);
  for (int xi = 0; xi < kXi; ++xi)
    pack_weight_pairs(ctx, c_out, c_in, c_in, 1, 1, kBlock, wp + xi * per_xi,
                      detail::StridedWeights{.base = u + xi * plane_u, .co_step = 1, .ci_step = c_out, .i_step = 0, .j_step = 0});
  const WinogradTiles g(s, ld_m, detail::winograd_forward_group(c_in, ld_m, kP));
  const std::int64_t v_plane = g.group * c_in + 32;  // bf16 values
  const std::int64_t image_in = std::int64_t{s.h} * s.w * c_in;
  std::array<std::int64_t, kP> in_offs, out_offs;
  for (int k = 0; k < kP; ++k) in_offs[k] = std::int64_t{k} * half, out_offs[k] = k * ld_m;

  ctx.parallel_for(s.n * g.per_image, 1, [&](std::int64_t g0, std::int64_t g1) {
    auto* vbuf = reinterpret_cast<std::uint16_t*>(scratch_pairs(Scratch::kInput, kXi * v_plane / 2));
    float* mbuf = scratch(Scratch::kOutput, static_cast<std::size_t>(kXi * g.m_plane));
    float* img = scratch(Scratch::kPacked, static_cast<std::size_t>(g.hp * g.pad_row));
    std::int64_t padded = -1;
    for (std::int64_t gi = g0; gi < g1; ++gi) {
      const std::int64_t n = gi / g.per_image, k = gi % g.per_image;
      if (padded != n) {
        embed_rounded(s, g, x + n * image_in, img);
        padded = n;
      }
      Out* out = y + n * g.oh * g.y_row;
      const int count = g.for_each_tile(k, img, [&](int t, const float* patch, std::int64_t at, int rows, int cols) {
        winograd_input_bf16(patch, g.pad_row, c_in, vbuf + std::int64_t{t} * c_in, v_plane);
        if constexpr (std::is_same_v<Out, float>)
          if (store == detail::Store::kAdd)  // Note [Prefetching what a tile adds to]
            for (int a = 0; a < rows; ++a)
              detail::prefetch_floats(out + at + a * g.y_row, std::int64_t{cols} * c_out);
      });
      // The products: mbuf[xi][t][ld_m] = vbuf[xi][t][c_in] x u[xi].
      for (int xi = 0; xi < kXi; ++xi) {
        const std::uint16_t* vx = vbuf + xi * v_plane;
        float* mx = mbuf + xi * g.m_plane;
        detail::for_each_tile<kP>(count, static_cast<int>(ld_m), kBlock, [&](std::int64_t p0, int p, int cb, int) {
          kPairTiles<V>[p - 1](vx + p0 * c_in, in_offs.data(), 0, 1, half, wp + xi * per_xi + std::int64_t{cb} * half * kBlock,
                               nullptr, mx + p0 * ld_m + cb * kBlock, out_offs.data(), kBlock, false);
        });
      }
      g.for_each_tile(k, img, [&](int t, const float*, std::int64_t at, int rows, int cols) {
        winograd_output16(mbuf + t * ld_m, g.m_plane, c_out, bias, store, out + at,
                                g.y_row, rows, cols);
      });
    }
  });
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
    with_block(s.c_in, [&]<int V>() { pair_backward_input_phases<V>(ctx, s, dy, w, dx, detail::Store::kOverwrite); });
  }
  // dx += the backward input, added as the tiles store it.
  static bool backward_input_add(const CpuContext& ctx, const Conv2dShape& s, const float* dy,
                                 const float* w, float* dx) {
    const bool as_forward = detail::backward_input_as_forward(
        s, dy, w, dx, [&](const Conv2dShape& t, const float* in, std::int64_t ld_in, const float*, float* out,
                          std::int64_t ld_out, detail::StridedWeights get) {
          pair_conv(ctx, t, in, ld_in, nullptr, out, ld_out, get, detail::Store::kAdd);
        });
    if (!as_forward)
      with_block(s.c_in, [&]<int V>() { pair_backward_input_phases<V>(ctx, s, dy, w, dx, detail::Store::kAdd); });
    return true;
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
  static bool backward_weight_dy_rows(const CpuContext& ctx, const Conv2dShape& s, const float* x,
                                      const DyRows& rows, float* dw) {
    if (weight_row_kernel_applies(s)) return false;
    with_block(s.c_out, [&]<int V>() { pair_weight_grad_from<V>(ctx, s, x, rows, dw); });
    return true;
  }
  template <typename In>
  static bool winograd_backward_weight(const CpuContext& ctx, const Conv2dShape& s, const In* x,
                                       const float* dy, float* dw) {
    if (!winograd_applies(s)) return false;
    with_block(s.c_out, [&]<int V>() { pair_winograd_weight_grad<V>(ctx, s, x, dy, dw); });
    return true;
  }
  // The Winograd convolution y = conv(x, w) (+ bias) for s, weights read through get: false
  // where it does not apply.
  template <typename In, typename Out, typename Get>
  static bool winograd_conv(const CpuContext& ctx, const Conv2dShape& s, const In* x, const float* bias,
                            Out* y, Get get) {
    if (!winograd_applies(s)) return false;
    with_block(s.c_out, [&]<int V>() { pair_winograd_conv<V>(ctx, s, x, bias, y, get, detail::Store::kOverwrite); });
    return true;
  }
  // dx += the Winograd backward input (stride 1): false where it does not apply.
  static bool winograd_backward_input_add(const CpuContext& ctx, const Conv2dShape& s, const float* dy,
                                          const float* w, float* dx) {
    bool ran = false;
    detail::backward_input_as_forward(s, dy, w, dx, [&](const Conv2dShape& t, const float* in, std::int64_t,
                                                        const float*, float* out, std::int64_t,
                                                        detail::StridedWeights get) {
      if (!winograd_applies(t)) return;
      with_block(t.c_out, [&]<int V>() { pair_winograd_conv<V>(ctx, t, in, nullptr, out, get, detail::Store::kAdd); });
      ran = true;
    });
    return ran;
  }
};

}  // namespace
}  // namespace towerflow::cpu::TW_ISA

extern "C" const towerflow::cpu::Bf16KernelTable TW_KERNEL_TABLE_NAME(towerflow_bf16_pairs_) =
    towerflow::cpu::TW_ISA::detail::Bf16Table<towerflow::cpu::TW_ISA::PairDrivers>::kTable;
