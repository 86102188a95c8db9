#pragma once
// Private helpers shared by the kernels that multiply bf16 pairs (bf16_pairs.cc on vdpbf16ps,
// bf16_amx.cc on AMX tiles): rounding fp32 operands to bf16 while packing them into rows of bf16
// or into pairs, the forms of the other kernels through a convolution, and an object's table
// from its drivers. Compiled into each kernel object's namespace, as conv_impl.h is.

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/cpu/bf16_bits.h"
#include "core/cpu/bf16_pairs.h"
#include "core/cpu/context.h"
#include "core/cpu/conv.h"
#include "core/cpu/simd_impl.h"

namespace towerflow::cpu::TW_ISA::detail {

// Two bf16 of one sum in a dword: the even-indexed one in the low half.
using Pair = std::uint32_t;
// Pairs read from an image written as 16-bit values.
typedef std::uint32_t AliasedPair __attribute__((may_alias));

// This thread's scratch slot as n pairs (simd_impl.h's scratch counts 4-byte floats).
inline Pair* scratch_pairs(Scratch slot, std::int64_t n) {
  return reinterpret_cast<Pair*>(scratch(slot, static_cast<std::size_t>(n)));
}

inline std::uint32_t rounded_bits(float x) {
  return ::towerflow::cpu::detail::bf16_bits(std::bit_cast<std::uint32_t>(x));
}

// rounded_bits of 16 floats' bits at once. The packing loops below run on it, with masked tails,
// rather than on scalar loops: the packing of short runs (a pixel's channels, 16 output
// channels) is called thousands of times per image, and this made the weight gradients 1.2x to
// 1.35x faster (docs/precision.md).
inline __m512i rounded_bits16(__m512i bits) {
  const __m512i top = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i nearest =
      _mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)), lsb), top);
  const __m512i quiet = _mm512_or_si512(_mm512_and_si512(bits, top), _mm512_set1_epi32(0x00400000));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  return _mm512_mask_blend_epi32(nan, nearest, quiet);
}

// The first `left` lanes of 16 (all of them from left >= 16).
inline __mmask16 first_lanes(std::int64_t left) {
  return left >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << left) - 1);
}

// The float bits of the lanes m of 16 values at p (zeros elsewhere): floats, or the bf16 bits of
// bf16.h's bf16 inputs widened (which rounded_bits16 then leaves as they are). The packers below
// read their inputs through it, so that they take either.
inline __m512i load_bits16(__mmask16 m, const float* p) { return _mm512_maskz_loadu_epi32(m, p); }
inline __m512i load_bits16(__mmask16 m, const std::uint16_t* p) {
  return _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16);
}

// The pairs (low, high) of a and b rounded to bf16 in each lane. With the instruction,
// vcvtne2ps2bf16 rounds both (to nearest even, as rounded_bits16, but with denormal inputs and
// results flushed to zero, as vdpbf16ps treats its operands, so the products are the same) and a
// word permutation interleaves them; on the emulated build, rounded_bits16.
inline __m512i pair_of(__m512 a, __m512 b) {
#if defined(__AVX512BF16__)
  const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(b, a);  // words 0-15 a, 16-31 b
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                              23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(interleave, both);
#else
  return _mm512_or_si512(_mm512_srli_epi32(rounded_bits16(_mm512_castps_si512(a)), 16),
                         rounded_bits16(_mm512_castps_si512(b)));
#endif
}

// dst[i] = the bf16 of src[i], i < n. In: float or bf16 bits (as load_bits16). With the
// instruction, vcvtneps2bf16 rounds them as pair_of does.
template <typename In>
void to_bf16(std::int64_t n, const In* __restrict src, std::uint16_t* __restrict dst) {
  for (std::int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = first_lanes(n - i);
#if defined(__AVX512BF16__)
    const __m512 v = _mm512_castsi512_ps(load_bits16(m, src + i));
    _mm256_mask_storeu_epi16(dst + i, m, (__m256i)_mm512_cvtneps_pbh(v));
#else
    const __m512i r = rounded_bits16(load_bits16(m, src + i));
    _mm256_mask_storeu_epi16(dst + i, m, _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
#endif
  }
}

// dst[i] = the pair (low[i], high[i]) as pair_of makes it, i < n; a null low or high is zeros.
template <typename In>
void to_pairs(std::int64_t n, const In* __restrict low, const In* __restrict high,
              Pair* __restrict dst) {
  for (std::int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = first_lanes(n - i);
#if defined(__AVX512BF16__)
    const __m512 lo = low ? _mm512_castsi512_ps(load_bits16(m, low + i)) : _mm512_setzero_ps();
    const __m512 hi = high ? _mm512_castsi512_ps(load_bits16(m, high + i)) : _mm512_setzero_ps();
    _mm512_mask_storeu_epi32(dst + i, m, pair_of(lo, hi));
#else
    const __m512i lo =
        low ? _mm512_srli_epi32(rounded_bits16(load_bits16(m, low + i)), 16) : _mm512_setzero_si512();
    const __m512i hi = high ? rounded_bits16(load_bits16(m, high + i)) : _mm512_setzero_si512();
    _mm512_mask_storeu_epi32(dst + i, m, _mm512_or_si512(lo, hi));
#endif
  }
}

// Rows [row_begin, row_end) of dst, an image [rows][wp][c2] of bf16 (c2 >= c, even) that holds
// img ([h][w] pixels of c channels, ld_x values apart, rows ld_row apart: w * ld_x unless given)
// at (top, left) and zeros elsewhere, channels c..c2 included.
template <typename In>
void bf16_rows(const In* img, int h, int w, int c, std::int64_t ld_x, int c2, int top, int left,
               int wp, int row_begin, int row_end, std::uint16_t* dst, std::int64_t ld_row = -1) {
  if (ld_row < 0) ld_row = std::int64_t{w} * ld_x;
  const std::int64_t row = std::int64_t{wp} * c2;
  for (int r = row_begin; r < row_end; ++r) {
    std::uint16_t* d = dst + r * row;
    const int src = r - top;
    if (src < 0 || src >= h) {
      std::fill(d, d + row, std::uint16_t{0});
      continue;
    }
    std::fill(d, d + std::int64_t{left} * c2, std::uint16_t{0});
    const In* s = img + std::int64_t{src} * ld_row;
    std::uint16_t* o = d + std::int64_t{left} * c2;
    if (c == c2 && ld_x == c) {
      to_bf16(std::int64_t{w} * c, s, o);
    } else {
      for (int x = 0; x < w; ++x) {
        to_bf16(c, s + x * ld_x, o + std::int64_t{x} * c2);
        std::fill(o + std::int64_t{x} * c2 + c, o + std::int64_t{x + 1} * c2, std::uint16_t{0});
      }
    }
    std::fill(d + std::int64_t{left + w} * c2, d + row, std::uint16_t{0});
  }
}

// Weights at base[co * co_step + ci * ci_step + i * i_step + j * j_step]: OIHW weights, the flipped
// and transposed ones of a backward input, a matrix (gemm_as_conv). pack_weight_pairs gathers
// these 16 output channels at a time (Note [Packing strided weights]).
struct StridedWeights {
  const float* base;
  std::int64_t co_step, ci_step, i_step, j_step;
  float operator()(int co, int ci, int i, int j) const {
    return base[co * co_step + ci * ci_step + i * i_step + j * j_step];
  }
};

// Note [Packing strided weights]
// The packed weights run along output channels, which are the farthest apart in OIHW weights
// and, for a matrix product's transposed b, a whole row apart. Read one weight at a time, the
// packing of a 4096 x 384 matrix (tfcnn's fc1) took half of its product's time, every read a new
// cache line. Strided weights are instead gathered 16 output channels at a time (vpgatherdd,
// AVX-512F), each channel's weights read in order as the pairs advance, and rounded 16 at a time:
// that product became 2x faster (docs/precision.md). Where the input channels are contiguous (a
// transposed b, fc1's), the gather still reads 16 lines a whole row apart, which on a Zen 4 fall
// in one set of its 8-way L1 and evict each other before the next pairs are read: the packing
// took 40% of fc1's bf16 product there. Such weights are instead read 32 contiguous inputs of 16
// output channels at a time (two vectors per channel, whole lines), rounded, made into pairs and
// transposed in registers (16 x 16 dwords), on the context's threads. Consecutive output
// channels (b as it is) are loaded rather than gathered, and the gathers of the others run on the
// context's threads too. On a 2-core Zen 4 EPYC fc1's bf16 forward went from 3.51 to 1.18 ms and
// its backward input from 2.16 to 1.15 (`TOWERFLOW_BF16_KERNELS=avx512bf16
// towerflow_bench_kernels --benchmark_filter=kernel_bf16/tfcnn/gemm`). Other weights go through
// get one at a time.

// The input of a forward convolution as the kernels convert and read it. A 1x1 kernel without
// padding at a stride above 1 reads only every stride-th pixel of every stride-th row (ResNet's
// projections read a quarter of x), so the kernels convert those alone and run the stride-1
// convolution of the out_h x out_w image they form. Elsewhere the input is x as it is.
struct ConvInput {
  Conv2dShape s;          // the convolution the kernels run
  std::int64_t ld_x;      // floats between the pixels of a row of that input
  std::int64_t ld_row;    // between its rows
  std::int64_t ld_image;  // between its images
};

inline ConvInput conv_input(const Conv2dShape& s, std::int64_t ld_x) {
  const std::int64_t ld_image = std::int64_t{s.h} * s.w * ld_x;
  if (s.kh != 1 || s.kw != 1 || s.pad_h != 0 || s.pad_w != 0 || (s.stride_h == 1 && s.stride_w == 1))
    return {s, ld_x, std::int64_t{s.w} * ld_x, ld_image};
  Conv2dShape t = s;
  t.h = s.out_h();
  t.w = s.out_w();
  t.stride_h = t.stride_w = 1;
  return {t, ld_x * s.stride_w, std::int64_t{s.w} * ld_x * s.stride_h, ld_image};
}

// r[0..16) as the rows of a 16 x 16 matrix of dwords, transposed in place: r[j] becomes column j.
// Pairs of rows are interleaved by dwords and then by quadwords, which leaves each 128-bit lane L
// of the four vectors of a group of four rows holding columns 4L..4L+3 of those rows; the
// 128-bit lanes are then transposed across the four groups.
inline void transpose16x16_epi32(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  __m512i u[4][4];  // u[g][m], 128-bit lane L: column 4L + m of rows 4g..4g+3
  for (int g = 0; g < 4; ++g) {
    u[g][0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[g][1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[g][2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[g][3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int m = 0; m < 4; ++m) {
    const __m512i x0 = _mm512_shuffle_i32x4(u[0][m], u[1][m], 0x44), x1 = _mm512_shuffle_i32x4(u[0][m], u[1][m], 0xee);
    const __m512i y0 = _mm512_shuffle_i32x4(u[2][m], u[3][m], 0x44), y1 = _mm512_shuffle_i32x4(u[2][m], u[3][m], 0xee);
    r[m] = _mm512_shuffle_i32x4(x0, y0, 0x88);
    r[4 + m] = _mm512_shuffle_i32x4(x0, y0, 0xdd);
    r[8 + m] = _mm512_shuffle_i32x4(x1, y1, 0x88);
    r[12 + m] = _mm512_shuffle_i32x4(x1, y1, 0xdd);
  }
}

// fn(cij, cb, i, j, k0) on the context's threads for every block cb, kernel position (i, j) and
// run of up to 16 pairs from k0: the packers' units of work; cij = (cb * kh + i) * kw + j.
template <typename Fn>
void for_pack_units(const CpuContext& ctx, int blocks, int kh, int kw, int pairs, Fn&& fn) {
  const int runs = (pairs + 15) / 16;
  ctx.parallel_for(std::int64_t{blocks} * kh * kw * runs, 16, [&](std::int64_t u0, std::int64_t u1) {
    for (std::int64_t u = u0; u < u1; ++u) {
      const std::int64_t cij = u / runs;
      fn(cij, static_cast<int>(cij / (std::int64_t{kh} * kw)), static_cast<int>(cij / kw % kh),
         static_cast<int>(cij % kw), static_cast<int>(u % runs) * 16);
    }
  });
}

// pack_weight_pairs for weights whose input channels are contiguous (ci_step 1: a matrix
// product's transposed b), as Note [Packing strided weights] says: the same pairs.
inline void pack_contiguous_weight_pairs(const CpuContext& ctx, int c_out, int c_in, int pairs, int kh, int kw,
                                         int block, Pair* dst, const StridedWeights& get) {
  // The high halves of 32 floats' rounded bits, in order: words 1, 3, ..., 63 of (lo, hi).
  alignas(64) static constexpr std::uint16_t kHighWords[32] = {1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21,
                                                                23, 25, 27, 29, 31, 33, 35, 37, 39, 41, 43,
                                                                45, 47, 49, 51, 53, 55, 57, 59, 61, 63};
  const __m512i high_words = _mm512_load_si512(kHighWords);
  const auto lanes = [](std::int64_t left) { return left <= 0 ? __mmask16(0) : first_lanes(left); };
  const int blocks = (c_out + block - 1) / block;
  for_pack_units(ctx, blocks, kh, kw, pairs, [&](std::int64_t cij, int cb, int i, int j, int k0) {
    Pair* out = dst + cij * pairs * block;
    for (int b0 = 0; b0 < block; b0 += 16) {
      __m512i r[16];  // row t: pairs k0..k0+15 of output channel cb * block + b0 + t
      for (int t = 0; t < 16; ++t) {
        const int co = cb * block + b0 + t;
        if (co >= c_out) {
          r[t] = _mm512_setzero_si512();
          continue;
        }
        const float* p = get.base + co * get.co_step + i * get.i_step + j * get.j_step + 2 * k0;
        const std::int64_t left = c_in - 2 * std::int64_t{k0};
        const __m512i lo = rounded_bits16(_mm512_maskz_loadu_epi32(lanes(left), p));
        const __m512i hi = rounded_bits16(_mm512_maskz_loadu_epi32(lanes(left - 16), p + 16));
        r[t] = _mm512_permutex2var_epi16(lo, high_words, hi);
      }
      transpose16x16_epi32(r);
      for (int k = 0; k < std::min(16, pairs - k0); ++k)
        _mm512_storeu_si512(out + std::int64_t{k0 + k} * block + b0, r[k]);
    }
  });
}

// Packs weights as pairs of input channels: dst[cb][i][j][k][b] = the pair (get(co, 2k, i, j),
// get(co, 2k + 1, i, j)) with co = cb * block + b and k < c2 / 2 (c2 >= c_in, even), zero where
// co >= c_out or a channel >= c_in. block is a multiple of 16.
template <typename Get>
void pack_weight_pairs(const CpuContext& ctx, int c_out, int c_in, int c2, int kh, int kw, int block, Pair* dst,
                       Get get) {
  const int blocks = (c_out + block - 1) / block, pairs = c2 / 2;
  std::int64_t o = 0;
  if constexpr (std::is_same_v<Get, StridedWeights>) {
    if (get.ci_step == 1) return pack_contiguous_weight_pairs(ctx, c_out, c_in, pairs, kh, kw, block, dst, get);
    // 32-bit gather offsets: 15 output channels' steps must fit.
    if (std::abs(get.co_step) <= std::numeric_limits<std::int32_t>::max() / 16) {
      const __m512i offsets = _mm512_mullo_epi32(
          _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
          _mm512_set1_epi32(static_cast<int>(get.co_step)));
      // Consecutive output channels (a matrix product's b as it is) are loaded rather than gathered.
      const bool contiguous = get.co_step == 1;
      auto gather = [&](__mmask16 m, const float* p) {
        return contiguous ? _mm512_maskz_loadu_epi32(m, p)
                          : _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, offsets, p, 4);
      };
      for_pack_units(ctx, blocks, kh, kw, pairs, [&](std::int64_t cij, int cb, int i, int j, int k0) {
        for (int k = k0; k < std::min(pairs, k0 + 16); ++k)
          for (int b0 = 0; b0 < block; b0 += 16) {
            const int co = cb * block + b0;
            __m512i pair = _mm512_setzero_si512();
            if (co < c_out && 2 * k < c_in) {
              const __mmask16 m = first_lanes(c_out - co);
              const float* p = get.base + co * get.co_step + 2 * k * get.ci_step + i * get.i_step +
                               j * get.j_step;
              pair = _mm512_srli_epi32(rounded_bits16(gather(m, p)), 16);
              if (2 * k + 1 < c_in)
                pair = _mm512_or_si512(pair, rounded_bits16(gather(m, p + get.ci_step)));
            }
            _mm512_storeu_si512(dst + (cij * pairs + k) * block + b0, pair);
          }
      });
      return;
    }
  }
  for (int cb = 0; cb < blocks; ++cb)
    for (int i = 0; i < kh; ++i)
      for (int j = 0; j < kw; ++j)
        for (int k = 0; k < pairs; ++k)
          for (int b = 0; b < block; ++b, ++o) {
            const int co = cb * block + b;
            float low = 0.0f, high = 0.0f;
            if (co < c_out) {
              if (2 * k < c_in) low = get(co, 2 * k, i, j);
              if (2 * k + 1 < c_in) high = get(co, 2 * k + 1, i, j);
            }
            dst[o] = (rounded_bits(low) >> 16) | rounded_bits(high);
          }
}

// The padded image img (s.h x s.w pixels of c_in channels, padding s.pad_h, s.pad_w) packed in
// pairs of columns from column `first` (0 or 1): dst[row][c][channel] = (x at column first + 2c,
// x at column first + 2c + 1), zero in the padding and beyond; rows x_row_step pairs apart.
template <typename In>
void pack_column_pairs(const Conv2dShape& s, const In* img, int col_pairs, std::int64_t x_row_step,
                       Pair* dst, int first = 0) {
  const int hp = s.h + 2 * s.pad_h;
  for (int r = 0; r < hp; ++r) {
    Pair* d = dst + r * x_row_step;
    const int src_r = r - s.pad_h;
    if (src_r < 0 || src_r >= s.h) {
      std::fill(d, d + x_row_step, Pair{0});
      continue;
    }
    const In* row = img + std::int64_t{src_r} * s.w * s.c_in;
    for (int c = 0; c < col_pairs; ++c, d += s.c_in) {
      const int left = first + 2 * c - s.pad_w;
      const In* low = left >= 0 && left < s.w ? row + std::int64_t{left} * s.c_in : nullptr;
      const In* high = left + 1 >= 0 && left + 1 < s.w ? row + std::int64_t{left + 1} * s.c_in : nullptr;
      to_pairs(s.c_in, low, high, d);
    }
  }
}

// Note [Weight-gradient passes in pixel pairs]
// The bf16 weight gradients reduce over output pixels, so they pack a pass of pixels in pairs of
// neighbouring pixels: for each kernel row i, row k of the packed x holds the pairs (input of
// pixel 2k, input of pixel 2k + 1) over q = (kernel column, input channel), kw * c_in of them.
// Where the stride in height is 1 and the output rows have an even width, kernel row i of pixel
// p reads what kernel row 0 of pixel p + i * ow reads, and pairs do not straddle rows, so the
// kernel rows share one packing: the pass and the kh - 1 output rows after it, packed once, with
// kernel row i starting i * ow / 2 rows in. Each input is then rounded and packed once rather
// than kh times. Elsewhere each kernel row has a packing of its own.

// Whether the kernel rows of s share one packing.
inline bool shared_kernel_rows(const Conv2dShape& s) { return s.stride_h == 1 && s.out_w() % 2 == 0; }

// Rows of pairs that packing a pass of up to max_pixels pixels writes, per_kernel_row apart when
// the kernel rows do not share one.
inline std::int64_t pass_pair_rows(const Conv2dShape& s, int max_pixels, std::int64_t per_kernel_row) {
  if (shared_kernel_rows(s)) return (max_pixels + std::int64_t{s.kh - 1} * s.out_w()) / 2;
  return s.kh * per_kernel_row;
}

// Packs the pass of `pixels` output pixels from output row r0 (inputs in xbuf, the padded image,
// row_step floats a row) into dst, rows of kw * c_in pairs; returns the rows from one kernel row's
// first pair to the next's (per_kernel_row where the kernel rows do not share a packing). With a
// packing of their own, kernel row i's rows are [i * per_kernel_row, i * per_kernel_row +
// (pixels + 1) / 2), the last pair's high half zero when pixels is odd.
template <typename In>
std::int64_t pack_pass_pairs(const Conv2dShape& s, const In* xbuf, std::int64_t row_step, int r0,
                             int pixels, std::int64_t per_kernel_row, Pair* dst) {
  const int ow = s.out_w(), q_len = s.kw * s.c_in;
  const std::int64_t pix_step = std::int64_t{s.stride_w} * s.c_in;
  auto input = [&](int pixel, int i) {
    return xbuf + (std::int64_t{r0 + pixel / ow} * s.stride_h + i) * row_step + (pixel % ow) * pix_step;
  };
  if (shared_kernel_rows(s)) {
    const int rows = (pixels + (s.kh - 1) * ow) / 2;
    for (int k = 0; k < rows; ++k)
      to_pairs(q_len, input(2 * k, 0), input(2 * k + 1, 0), dst + std::int64_t{k} * q_len);
    return ow / 2;
  }
  const int pairs = (pixels + 1) / 2;
  for (int i = 0; i < s.kh; ++i)
    for (int k = 0; k < pairs; ++k)
      to_pairs(q_len, input(2 * k, i), 2 * k + 1 < pixels ? input(2 * k + 1, i) : nullptr,
               dst + (i * per_kernel_row + k) * q_len);
  return per_kernel_row;
}

// The kernels that a bf16 kernel object runs through its convolution, conv(s, x, ld_x, bias, y,
// ld_y, get): y = conv(x, w) (+ bias, nullable) with pixels of x ld_x floats apart and of y ld_y
// apart, the weights read through get(co, ci, i, j).

// conv2d_forward (conv.h's arguments, x float or bf16 bits): the weights OIHW.
template <typename In, typename Conv>
void forward_as_conv(const Conv2dShape& s, const In* x, const float* w, const float* bias,
                     float* y, Conv&& conv) {
  conv(s, x, std::int64_t{s.c_in}, bias, y, std::int64_t{s.c_out},
       StridedWeights{.base = w, .co_step = std::int64_t{s.c_in} * s.kh * s.kw,
                      .ci_step = std::int64_t{s.kh} * s.kw, .i_step = s.kw, .j_step = 1});
}

// conv2d_backward_input where the stride is 1 and the padding smaller than the kernel: the
// transposed convolution as a forward one with the flipped weights, as conv.cc's. False, with
// nothing done, elsewhere.
template <typename Conv>
bool backward_input_as_forward(const Conv2dShape& s, const float* dy, const float* w, float* dx,
                               Conv&& conv) {
  if (s.stride_h != 1 || s.stride_w != 1 || s.pad_h >= s.kh || s.pad_w >= s.kw) return false;
  const Conv2dShape t{.n = s.n, .h = s.out_h(), .w = s.out_w(), .c_in = s.c_out, .c_out = s.c_in,
                      .kh = s.kh, .kw = s.kw, .stride_h = 1, .stride_w = 1,
                      .pad_h = s.kh - 1 - s.pad_h, .pad_w = s.kw - 1 - s.pad_w};
  // Weight (ci, co, i, j) of t is w[co][ci][kh - 1 - i][kw - 1 - j].
  conv(t, dy, std::int64_t{s.c_out}, nullptr, dx, std::int64_t{s.c_in},
       StridedWeights{.base = w + std::int64_t{s.kh - 1} * s.kw + (s.kw - 1),
                      .co_step = std::int64_t{s.kh} * s.kw,
                      .ci_step = std::int64_t{s.c_in} * s.kh * s.kw, .i_step = -s.kw, .j_step = -1});
  return true;
}

// c[m, n] = op(a) op(b) (gemm.h's arguments, alpha = 1, beta = 0) as a 1x1 convolution over the
// rows of op(a) as pixels. A transposed a is copied first.
template <typename Conv>
void gemm_as_conv(bool trans_a, bool trans_b, int m, int n, int k, const float* a, int lda,
                  const float* b, int ldb, float* c, int ldc, Conv&& conv) {
  const float* rows = a;
  std::int64_t ld_rows = lda;
  thread_local std::vector<float> transposed;
  if (trans_a) {
    transposed.resize(static_cast<std::size_t>(m) * k);
    for (int kk = 0; kk < k; ++kk)
      for (int i = 0; i < m; ++i) transposed[std::size_t(i) * k + kk] = a[std::int64_t{kk} * lda + i];
    rows = transposed.data();
    ld_rows = k;
  }
  const Conv2dShape s{.n = 1, .h = m, .w = 1, .c_in = k, .c_out = n, .kh = 1, .kw = 1};
  // Weight (co, ci) is op(b)[ci][co].
  conv(s, rows, ld_rows, nullptr, c, std::int64_t{ldc},
       StridedWeights{.base = b, .co_step = trans_b ? ldb : 1, .ci_step = trans_b ? 1 : ldb,
                      .i_step = 0, .j_step = 0});
}

// The table (bf16_pairs.h) of a kernel object whose drivers are D's:
//   D::conv(ctx, s, x, ld_x, bias, y, ld_y, get)  the convolution that the forward one, the
//                                                 stride-1 backward input and the GEMM run through
//   D::backward_input_phases(ctx, s, dy, w, dx)   the other backward inputs
//   D::backward_weight(ctx, s, x, dy, dw)
//   D::backward_weight_dy_rows(ctx, s, x, rows, dw)  the same with dy through rows (DyRows),
//                                                  false where there is no such path for s
//   D::winograd_backward_weight(ctx, s, x, dy, dw)  the Winograd weight gradient, false where
//                                                  there is none for s
//   D::winograd_conv(ctx, s, x, bias, y, get)       the Winograd convolution, the same
//   D::backward_input_add(ctx, s, dy, w, dx)        dx += the backward input, false where there
//                                                  is no such path
//   D::winograd_backward_input_add(ctx, s, dy, w, dx)  the same by Winograd
template <typename D>
struct Bf16Table {
  static auto conv(const CpuContext& ctx) {
    return [&ctx](const Conv2dShape& s, const auto* x, std::int64_t ld_x, const float* bias, float* y,
                  std::int64_t ld_y, auto get) { D::conv(ctx, s, x, ld_x, bias, y, ld_y, get); };
  }
  static void conv2d_forward(const CpuContext& ctx, const Conv2dShape& s, const float* x, const float* w,
                             const float* bias_or_null, float* y) {
    forward_as_conv(s, x, w, bias_or_null, y, conv(ctx));
  }
  static void conv2d_forward_bf16_input(const CpuContext& ctx, const Conv2dShape& s, const std::uint16_t* x,
                                        const float* w, const float* bias_or_null, float* y) {
    forward_as_conv(s, x, w, bias_or_null, y, conv(ctx));
  }
  static void conv2d_backward_weight_bf16_input(const CpuContext& ctx, const Conv2dShape& s,
                                                const std::uint16_t* x, const float* dy, float* dw) {
    D::backward_weight(ctx, s, x, dy, dw);
  }
  static void conv2d_backward_input(const CpuContext& ctx, const Conv2dShape& s, const float* dy,
                                    const float* w, float* dx) {
    if (!backward_input_as_forward(s, dy, w, dx, conv(ctx))) D::backward_input_phases(ctx, s, dy, w, dx);
  }
  static void conv2d_backward_weight(const CpuContext& ctx, const Conv2dShape& s, const float* x,
                                     const float* dy, float* dw) {
    D::backward_weight(ctx, s, x, dy, dw);
  }
  template <typename In, typename Out>
  static bool winograd_forward(const CpuContext& ctx, const Conv2dShape& s, const In* x, const float* w,
                               const float* bias_or_null, Out* y) {
    return D::winograd_conv(ctx, s, x, bias_or_null, y,
                            StridedWeights{.base = w, .co_step = std::int64_t{s.c_in} * s.kh * s.kw,
                                           .ci_step = std::int64_t{s.kh} * s.kw, .i_step = s.kw, .j_step = 1});
  }
  static bool winograd_backward_input(const CpuContext& ctx, const Conv2dShape& s, const float* dy,
                                      const float* w, float* dx) {
    bool ran = false;
    backward_input_as_forward(s, dy, w, dx, [&](const Conv2dShape& t, const float* in, std::int64_t, const float*,
                                               float* out, std::int64_t, StridedWeights get) {
      ran = D::winograd_conv(ctx, t, in, nullptr, out, get);
    });
    return ran;
  }
  static void gemm(const CpuContext& ctx, bool trans_a, bool trans_b, int m, int n, int k, const float* a,
                   int lda, const float* b, int ldb, float* c, int ldc) {
    gemm_as_conv(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc, conv(ctx));
  }
  static constexpr Bf16KernelTable kTable = {
      .conv2d_forward = &conv2d_forward,
      .conv2d_backward_input = &conv2d_backward_input,
      .conv2d_backward_weight = &conv2d_backward_weight,
      .gemm = &gemm,
      .forward_bf16_input = &conv2d_forward_bf16_input,
      .backward_weight_bf16_input = &conv2d_backward_weight_bf16_input,
      .winograd_backward_weight = &D::template winograd_backward_weight<float>,
      .winograd_backward_weight_bf16_input = &D::template winograd_backward_weight<std::uint16_t>,
      .winograd_forward = &winograd_forward<float, float>,
      .winograd_forward_bf16_input = &winograd_forward<std::uint16_t, float>,
      .winograd_forward_bf16_output = &winograd_forward<float, std::uint16_t>,
      .winograd_forward_bf16_io = &winograd_forward<std::uint16_t, std::uint16_t>,
      .winograd_backward_input = &winograd_backward_input,
      .backward_weight_dy_rows = &D::backward_weight_dy_rows,
      .backward_input_add = &D::backward_input_add,
      .winograd_backward_input_add = &D::winograd_backward_input_add,
  };
};

}  // namespace towerflow::cpu::TW_ISA::detail

// The name of this object's table: prefix, then the instruction set's name (TW_ISA).
#define TW_BF16_TABLE_CAT_(a, b) a##b
#define TW_BF16_TABLE_CAT(a, b) TW_BF16_TABLE_CAT_(a, b)
#define TW_KERNEL_TABLE_NAME(prefix) TW_BF16_TABLE_CAT(prefix, TW_ISA)
