#include "core/cpu/pool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "core/cpu/bf16_bits.h"
#include "core/cpu/simd_impl.h"
#include "core/error.h"

// In NHWC every window position is a contiguous run of c channels, so each kernel below works on
// whole channel rows: the inner loops run over c and vectorise; windows are clipped to the image
// once per output pixel instead of testing every element. Forward kernels split output rows over
// threads. Backward kernels gather: each dx pixel sums what the windows holding it pass back, in
// the order of the output pixels, and rows of input pixels are split over threads. Every dx
// element is written once, by one thread, in a fixed order, and results do not depend on the
// thread count.

namespace towerflow::cpu::TW_ISA {

using detail::IVec;
using detail::kLanes;
using detail::kWideLanes;
using detail::Scratch;
using detail::scratch;
using detail::store_streaming;
using detail::stream_fence;
using detail::streaming_aligned;
using detail::Vec;

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

// Output rows (columns) whose window holds input row (column) i: [first_window, last_window].
int first_window(int i, int pad, int k, int stride) {
  const int lo = i + pad - k + 1;
  return lo <= 0 ? 0 : (lo + stride - 1) / stride;
}
int last_window(int i, int pad, int stride, int out) { return std::min(out - 1, (i + pad) / stride); }

// The windows that hold one input pixel, in output order (row, then column): NR rows of them,
// row a at `rows[a]` (its offset in dy and argmax), times NC columns, column b at `cols[b]`.
// NR and NC are 1 or 2 (a 3x3 or 2x2 window at stride 2, where a pixel sits in one or two windows
// each way), or 0 where the counts nr and nc are known at run time only.
struct Windows {
  const std::int64_t* rows;
  int nr;
  const std::int64_t* cols;
  int nc;
};

// The windows that hold each input row and column of s, worked out once per call: the backward
// kernels need them at every input pixel, where the divisions that find them cost more than the
// pixel's gather of one or two windows. For input row i the output rows' offsets in dy,
// row_offs[i * per_row ..][0, rows[i]), and for input column j the output columns' offsets,
// col_offs[j * per_col ..][0, cols[j]), each in output order; `last_col[j]` is the last column.
struct PoolWindows {
  int per_row = 0, per_col = 0;
  std::vector<int> rows, cols, last_col;
  std::vector<std::int64_t> row_offs, col_offs;

  // The calling thread's tables, filled for s. They are reused from call to call (assign keeps
  // the vectors' capacity), so that a training step's pool passes allocate nothing; the workers
  // of the call read them through the reference.
  static const PoolWindows& for_shape(const Pool2dShape& s) {
    thread_local PoolWindows w;
    w.fill(s);
    return w;
  }

  Windows at(int i, int j) const {
    return {row_offs.data() + std::int64_t{i} * per_row, rows[i], col_offs.data() + std::int64_t{j} * per_col, cols[j]};
  }

 private:
  void fill(const Pool2dShape& s) {
    per_row = (s.kh + s.stride_h - 1) / s.stride_h;
    per_col = (s.kw + s.stride_w - 1) / s.stride_w;
    rows.assign(static_cast<std::size_t>(s.h), 0);
    cols.assign(static_cast<std::size_t>(s.w), 0);
    last_col.assign(static_cast<std::size_t>(s.w), 0);
    row_offs.assign(static_cast<std::size_t>(s.h) * per_row, 0);
    col_offs.assign(static_cast<std::size_t>(s.w) * per_col, 0);
    const int oh = s.out_h(), ow = s.out_w();
    for (int i = 0; i < s.h; ++i) {
      const int first = first_window(i, s.pad_h, s.kh, s.stride_h), last = last_window(i, s.pad_h, s.stride_h, oh);
      rows[i] = std::max(0, last - first + 1);
      for (int a = 0; a < rows[i]; ++a) row_offs[i * per_row + a] = std::int64_t{first + a} * ow * s.c;
    }
    for (int j = 0; j < s.w; ++j) {
      const int first = first_window(j, s.pad_w, s.kw, s.stride_w), last = last_window(j, s.pad_w, s.stride_w, ow);
      cols[j] = std::max(0, last - first + 1);
      last_col[j] = last;
      for (int b = 0; b < cols[j]; ++b) col_offs[j * per_col + b] = std::int64_t{first + b} * s.c;
    }
  }
};

// Asks for the cache lines of [p, p + n_bytes) (Note [Prefetching the next rows]).
inline void prefetch(const void* p, std::int64_t n_bytes) {
  const char* b = static_cast<const char*>(p);
  for (std::int64_t i = 0; i < n_bytes; i += 64) __builtin_prefetch(b + i);
}

// Note [Prefetching the next rows]
// A pool over NHWC reads a few rows of the image at a time, in steps of the stride, and does
// enough work per window that the hardware prefetchers fall behind when the rows come from
// memory, which is where they are in a training step: the convolution before has just written
// more than the caches hold. So at each output pixel the forward asks for the input pixels the
// next output row's window adds at this column, and the backward for the gradient and argmax of
// the next output row. On a 2-core Zen 5 EPYC (`towerflow_bench_kernels
// --benchmark_filter=maxpool`, whose `_cold` rows write 64 MiB first), tfcnn's pool1 forward went
// from 1.71-1.93 to 1.00-1.29 ms and its backward from 1.61-1.91 to 1.07-1.51 ms; in the training
// step both pools together from 2.5-2.8 to 1.2 ms per step forward and 2.0 to 1.2 backward
// (docs/benchmarks.md).

// Whether some lane of v is NaN or infinite.
template <typename T>
inline bool any_not_finite(T v) {
  const T z = v - v;  // 0 where v is finite, NaN where it is NaN or infinite
#if defined(__AVX512F__)
  if constexpr (sizeof(T) == 64) return _mm512_cmp_ps_mask(__m512(z), __m512(z), _CMP_UNORD_Q) != 0;
#endif
#if defined(__AVX__)
  if constexpr (sizeof(T) == 32) return _mm256_movemask_ps(_mm256_cmp_ps(__m256(z), __m256(z), _CMP_UNORD_Q)) != 0;
#endif
  bool any = false;
  for (int i = 0; i < static_cast<int>(sizeof(T) / sizeof(float)); ++i) any |= z[i] != z[i];
  return any;
}

// Output values: floats as they are, or bf16 bits rounded as bf16_bits.h rounds (to nearest,
// ties to even; NaN stays NaN, which max pool passes on): L at a time, or one.
template <int L>
inline void store_out(float* p, typename Vec<L>::type v) {
  Vec<L>::store(p, v);
}
// The bf16 bits of N floats' bits b (N lanes of uint32), as bf16_bits.h rounds them.
template <typename U>
inline U bf16_bits_of(U b) {
  const U nearest = (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
  const U quiet_nan = (b >> 16) | 0x40u;
  const U nan = (U)((b & 0x7fffffffu) > 0x7f800000u);  // all ones where NaN
  return (quiet_nan & nan) | (nearest & ~nan);
}
template <int L>
inline void store_out(std::uint16_t* p, typename Vec<L>::type v) {
  typedef std::uint32_t U8 __attribute__((vector_size(32)));
  typedef std::uint16_t H8 __attribute__((vector_size(16), aligned(2), may_alias));
  if constexpr (L == 8) {
    *reinterpret_cast<H8*>(p) = __builtin_convertvector(bf16_bits_of(std::bit_cast<U8>(v)), H8);
  } else {
    typedef std::uint32_t U16 __attribute__((vector_size(64)));
    typedef std::uint16_t H16 __attribute__((vector_size(32), aligned(2), may_alias));
    *reinterpret_cast<H16*>(p) = __builtin_convertvector(bf16_bits_of(std::bit_cast<U16>(v)), H16);
  }
}
inline void store_out(float* p, float v) { *p = v; }
inline void store_out(std::uint16_t* p, float v) {
  *p = static_cast<std::uint16_t>(towerflow::cpu::detail::bf16_bits(std::bit_cast<std::uint32_t>(v)) >> 16);
}

// One window's maximum and its position for channels [ch, ch + K * L): start from the window's
// first element, then take strictly greater values (the first maximum wins) or NaN (NaN
// propagates), as PyTorch does. The channels sit in K registers of L lanes, the window runs
// innermost; the K vectors are independent chains of compare and select. KH x KW > 0 is the
// window's size known at compile time (a whole 2x2 or 3x3 window inside the image), unrolled:
// the loop over a window of runtime size costs more than its compares (tfcnn's pool1 forward in
// `towerflow_bench_kernels --benchmark_filter=maxpool` on a Zen 5: 2.68 ms with the loop, 1.64
// unrolled). With Relu the maximum is stored through relu_forward's
// rule (v < 0 ? 0 : v, NaN stays), and the position as -1 where that output is not > 0. The
// maximum goes out as the output's type (store_out: float, or bf16 bits).
//
// Note [Max pool without the NaN test]
// Taking NaN as well as greater values costs a second compare and an or per element, and GCC
// adds a third instruction inverting the mask for the selects: 7 instructions per vector of an
// element instead of 5. So the window is first scanned taking greater values only, while adding
// its values up in another register, an add instead of a compare and an or; the sum is finite
// exactly when no value was NaN or infinite (or the sum overflowed). Only then does the scan
// stand; otherwise the window is scanned again with the NaN test. The results are the same bits.
//
// The scan and its lambdas are inlined by force: GCC otherwise kept a 3x3 window's element step
// out of line where max_window writes bf16 (b, at and sum went through memory at every element),
// and tfcnn's pool1 forward with bf16 output took 1.52-1.82 ms per call against 1.49-1.68 inlined
// (a 2-core Zen 4 EPYC, `towerflow_bench_train --model tfcnn --precision bf16 --trace`, three
// alternating runs).
template <bool kNanTest, int L, int K, int KH, int KW>
[[gnu::always_inline]] inline void scan_window(const Pool2dShape& s, const float* img, const Window& win,
                                               int ch, typename Vec<L>::type* b, typename IVec<L>::type* at,
                                               typename Vec<L>::type* sum) {
  using V = Vec<L>;
  using I = IVec<L>;
  const int rows = KH > 0 ? KH : win.h1 - win.h0, cols = KW > 0 ? KW : win.w1 - win.w0;
  const int pos0 = win.h0 * s.w + win.w0;
  const float* base = img + std::int64_t{pos0} * s.c + ch;
  for (int k = 0; k < K; ++k) {
    b[k] = V::load(base + k * L);
    at[k] = I::splat(pos0);
    if constexpr (!kNanTest) sum[k] = b[k];
  }
  const auto element = [&](int dh, int dw) __attribute__((always_inline)) {
    const int offset = dh * s.w + dw;
    const float* p = base + std::int64_t{offset} * s.c;
    const typename I::type pos = I::splat(pos0 + offset);
    for (int k = 0; k < K; ++k) {
      const typename V::type v = V::load(p + k * L);
      typename I::type take = v > b[k];
      if constexpr (kNanTest) take |= v != v;
      b[k] = take ? v : b[k];
      at[k] = take ? pos : at[k];
      if constexpr (!kNanTest) sum[k] += v;
    }
  };
  if constexpr (KH > 0 && KW > 0) {
    [&]<int... D>(std::integer_sequence<int, D...>) __attribute__((always_inline)) {
      (element(D / KW, D % KW), ...);
    }(std::make_integer_sequence<int, KH * KW>{});
  } else {
    for (int dh = 0; dh < rows; ++dh)
      for (int dw = 0; dw < cols; ++dw) element(dh, dw);
  }
}

// The scan with the NaN test, out of line: inlined, GCC keeps the first scan's loads alive for
// it and spills them all.
template <int L, int K, int KH, int KW>
[[gnu::noinline]] void scan_window_with_nan(const Pool2dShape& s, const float* img, const Window& win, int ch,
                                            typename Vec<L>::type* b, typename IVec<L>::type* at) {
  scan_window<true, L, K, KH, KW>(s, img, win, ch, b, at, nullptr);
}

template <bool Relu, bool kStreamIdx, int L, int K, int KH, int KW, typename Out>
void max_window(const Pool2dShape& s, const float* img, const Window& win, int ch, Out* best,
                std::int32_t* idx) {
  using V = Vec<L>;
  using I = IVec<L>;
  typename V::type b[K], sum[K];
  typename I::type at[K];
  scan_window<false, L, K, KH, KW>(s, img, win, ch, b, at, sum);
  typename V::type all = sum[0];
  for (int k = 1; k < K; ++k) all += sum[k];
  if (any_not_finite(all)) [[unlikely]]
    scan_window_with_nan<L, K, KH, KW>(s, img, win, ch, b, at);
  for (int k = 0; k < K; ++k) {
    if constexpr (Relu) {
      at[k] = b[k] > V::splat(0.0f) ? at[k] : I::splat(-1);
      b[k] = b[k] < V::splat(0.0f) ? V::splat(0.0f) : b[k];
    }
    store_out<L>(best + ch + k * L, b[k]);
    if constexpr (kStreamIdx) store_streaming(idx + ch + k * L, at[k]);
    else if (idx) I::store(idx + ch + k * L, at[k]);
  }
}

// Note [Pool windows of fixed size]
// The code for windows and window counts of a size known at compile time (max_window's whole 2x2
// and 3x3 windows, with_count's 1 and 2) is compiled where the target has 256-bit vectors, not
// for the x86 baseline (x86-64-v2, CPUs without AVX), where each 8-lane vector is a pair of SSE
// registers: there the loops of runtime size run, with the same results. Unrolled, the baseline's
// pool.cc took 42 s to compile, 6 s without (a 2-core Zen 3 EPYC, one job alone), for CPUs
// that no longer meet a training run.
#if defined(__x86_64__) && !defined(__AVX__)
constexpr bool kFixedWindows = false;
#else
constexpr bool kFixedWindows = true;
#endif

// max_window for the window's size: unrolled for a whole 2x2 or 3x3 window.
template <bool Relu, bool kStreamIdx, int L, int K, typename Out>
void max_window(const Pool2dShape& s, const float* img, const Window& win, int ch, Out* best,
                std::int32_t* idx) {
  const int rows = win.h1 - win.h0, cols = win.w1 - win.w0;
  if constexpr (kFixedWindows) {
    if (rows == 3 && cols == 3) return max_window<Relu, kStreamIdx, L, K, 3, 3>(s, img, win, ch, best, idx);
    if (rows == 2 && cols == 2) return max_window<Relu, kStreamIdx, L, K, 2, 2>(s, img, win, ch, best, idx);
  }
  max_window<Relu, kStreamIdx, L, K, 0, 0>(s, img, win, ch, best, idx);
}

// fn.template operator()<B>() with B = flag.
template <typename Fn>
void with_flag(bool flag, Fn&& fn) {
  if (flag) return fn.template operator()<true>();
  fn.template operator()<false>();
}

// Outputs of at least this many bytes are written with streaming stores (Note [Streaming
// stores]): more than the two cores' L2 caches hold. tfcnn's pool2 gradient (8 MiB) took 265-781
// us per call with plain stores (the slow end when dx's lines were not in the caches) and 235-340
// with streaming stores, and its reader, conv2's backward, 52.1-52.5 ms either way (a 2-core Zen 4
// EPYC, `towerflow_bench_train --model tfcnn --trace` in fp32 and bf16, alternating runs).
constexpr std::int64_t kStreamingBytes = std::int64_t{4} << 20;

// Note [Streaming the argmax]
// The forward's argmax is read by the backward alone, after the rest of the forward and most of
// the backward have run: caching it as it is written only makes each line a read from memory
// before its write (Note [Streaming stores] in simd_impl.h). So an argmax of this many bytes or
// more is written with streaming stores: tfcnn's, whose pool1 runs in chunks of 1 MiB of argmax
// (Note [Convolution and pool in chunks of the batch] in core/tensor/cpu_backend.cc). On a
// 2-core Zen 4 EPYC its pool2 forward in fp32 (2 MiB of argmax) took 317-381 us a call against
// 354-422 with plain stores (`towerflow_bench_train --model tfcnn --trace`, three alternating
// runs); the chunks' pools, whose input is in cache, 118-119 against 119-121.
constexpr std::int64_t kStreamingArgmaxBytes = std::int64_t{1} << 20;

// fn.template operator()<N>() with N = n where n is 1 or 2, else 0 (always 0 without
// kFixedWindows).
template <typename Fn>
void with_count(int n, Fn&& fn) {
  if constexpr (kFixedWindows) {
    if (n == 1) return fn.template operator()<1>();
    if (n == 2) return fn.template operator()<2>();
  }
  fn.template operator()<0>();
}

// Note [Channel sums of a pool gradient]
// A convolution followed by max pooling (tfcnn's conv1 and pool1, conv2 and pool2) needs the sum
// of the pool's input gradient per channel for its bias, and a pass of its own over that gradient
// reads it back from memory, where the pool's streaming stores have just put it (32 MiB for
// tfcnn's conv1 at batch 128). max_pool_backward_channel_sums adds each pixel's gradient to the
// sums while it is still in registers: in float over the pixels of one row of a block, the rows'
// sums in double over the block, the blocks' in double in block order. The blocks are fixed runs
// of kSumBlockPixels pixels, so the bits do not depend on the thread count; they are not
// conv2d_backward_bias's (a double sum over the pixels), from which they differ by float
// rounding over a row's pixels. Widening every pixel's gradient to double cost more than the pass
// it saved: in tfcnn's training step on a 2-core Zen 4 EPYC the pool1 gradient took 1.9-2.1 ms
// with the double sums against 1.3-1.6 without sums and 1.6-1.7 with these (`towerflow_bench_train
// --model tfcnn --trace`, alternating runs), where conv2d_backward_bias's pass took 0.7-1.2 ms.
constexpr std::int64_t kSumBlockPixels = 1024;

// dx for channels [ch, ch + K * L) of input pixel pos: the gradients of the windows w whose
// maximum sat there, summed in output order. An argmax of -1 (max_pool_relu_forward's, where its
// ReLU passes nothing) matches no pixel: skipping it gives the bits of adding the zero
// relu_backward would have passed (a sum that starts at +0 is never -0). With kSums, each
// channel's value is added to acc[ch] as well.
template <int L, int K, int NR, int NC, bool kStream, bool kSums>
void gather_max(const float* g_img, const std::int32_t* idx_img, const Windows& w, int pos, int ch, float* d,
                float* acc) {
  using V = Vec<L>;
  using I = IVec<L>;
  const typename I::type here = I::splat(pos);
  typename V::type sum[K];
  for (int k = 0; k < K; ++k) sum[k] = V::splat(0.0f);
  const int nr = NR > 0 ? NR : w.nr, nc = NC > 0 ? NC : w.nc;
  for (int a = 0; a < nr; ++a)
    for (int b = 0; b < nc; ++b) {
      const std::int64_t o = w.rows[a] + w.cols[b] + ch;
      for (int k = 0; k < K; ++k)
        sum[k] = I::load(idx_img + o + k * L) == here ? sum[k] + V::load(g_img + o + k * L) : sum[k];
    }
  for (int k = 0; k < K; ++k) {
    if constexpr (kStream) store_streaming(d + ch + k * L, sum[k]);
    else V::store(d + ch + k * L, sum[k]);
    if constexpr (kSums) V::store(acc + ch + k * L, V::load(acc + ch + k * L) + sum[k]);
  }
}

// dx for channels [ch, ch + K * L) of one input pixel: the scaled gradients of the windows w,
// summed in output order.
template <int L, int K, int NR, int NC, bool kStream>
void gather_avg(const float* g_img, const Windows& w, float scale, int ch, float* d) {
  using V = Vec<L>;
  typename V::type sum[K];
  for (int k = 0; k < K; ++k) sum[k] = V::splat(0.0f);
  const int nr = NR > 0 ? NR : w.nr, nc = NC > 0 ? NC : w.nc;
  for (int a = 0; a < nr; ++a)
    for (int b = 0; b < nc; ++b) {
      const float* g = g_img + w.rows[a] + w.cols[b] + ch;
      for (int k = 0; k < K; ++k) sum[k] += V::load(g + k * L) * scale;
    }
  for (int k = 0; k < K; ++k) {
    if constexpr (kStream) store_streaming(d + ch + k * L, sum[k]);
    else V::store(d + ch + k * L, sum[k]);
  }
}

// out[ch, ch + K * L) = scale times the sum of the window's pixels for those channels, in the
// window's order.
template <int L, int K>
void sum_window(const Pool2dShape& s, const float* img, const Window& win, float scale, int ch, float* out) {
  using V = Vec<L>;
  typename V::type sum[K];
  for (int k = 0; k < K; ++k) sum[k] = V::splat(0.0f);
  for (int ih = win.h0; ih < win.h1; ++ih)
    for (int iw = win.w0; iw < win.w1; ++iw) {
      const float* p = img + (std::int64_t{ih} * s.w + iw) * s.c + ch;
      for (int k = 0; k < K; ++k) sum[k] += V::load(p + k * L);
    }
  for (int k = 0; k < K; ++k) V::store(out + ch + k * L, sum[k] * scale);
}

// Channels [0, c) of one pixel in groups: four vectors of the widest width at a time, then one,
// then eight lanes, then `rest(ch)` for each channel left.
template <typename Group, typename Rest>
void for_channel_groups(int c, Group group, Rest rest) {
  int ch = 0;
  for (; ch + 4 * kWideLanes <= c; ch += 4 * kWideLanes) group.template operator()<kWideLanes, 4>(ch);
  for (; ch + kWideLanes <= c; ch += kWideLanes) group.template operator()<kWideLanes, 1>(ch);
  for (; ch + kLanes <= c; ch += kLanes) group.template operator()<kLanes, 1>(ch);
  for (; ch < c; ++ch) rest(ch);
}

template <bool Relu, typename Out>
void max_pool_forward_impl(const CpuContext& ctx, const Pool2dShape& s, const float* x, Out* y,
                           std::int32_t* argmax) {
  s.validate();
  const int oh = s.out_h(), ow = s.out_w(), c = s.c;
  // argmax with streaming stores where it is large (Note [Streaming the argmax]); every channel
  // group's store is then aligned, as c is a multiple of the widest vector.
  const bool stream_idx = argmax != nullptr &&
                          std::int64_t{s.n} * oh * ow * c * std::int64_t{sizeof(std::int32_t)} >= kStreamingArgmaxBytes &&
                          streaming_aligned(argmax) && c % kWideLanes == 0;
  ctx.parallel_for(std::int64_t{s.n} * oh, min_rows(s), [&](std::int64_t r0, std::int64_t r1) {
    with_flag(stream_idx, [&]<bool kStreamIdx>() {
      for (std::int64_t r = r0; r < r1; ++r) {
        const std::int64_t n = r / oh;
        const int row = static_cast<int>(r % oh);
        const float* img = x + n * s.h * s.w * c;
        for (int col = 0; col < ow; ++col) {
          const Window win = clip(s, row, col);
          const std::int64_t o = (r * ow + col) * c;
          Out* best = y + o;
          std::int32_t* idx = argmax ? argmax + o : nullptr;
          const float* first = img + (std::int64_t{win.h0} * s.w + win.w0) * c;
          const std::int32_t first_pos = win.h0 * s.w + win.w0;
          // The rows the next output row's window adds (Note [Prefetching the next rows]).
          const int next_top = row * s.stride_h - s.pad_h + s.stride_h;
          for (int ih = std::max(win.h1, next_top); ih < std::min(next_top + s.kh, s.h); ++ih)
            prefetch(img + (std::int64_t{ih} * s.w + win.w0) * c,
                     std::int64_t{win.w1 - win.w0} * c * std::int64_t{sizeof(float)});
          for_channel_groups(c, [&]<int L, int K>(int ch) { max_window<Relu, kStreamIdx, L, K>(s, img, win, ch, best, idx); }, [&](int ch) {
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
            if (Relu && !(b > 0.0f)) at = -1;
            store_out(best + ch, Relu && b < 0.0f ? 0.0f : b);
            if (idx) idx[ch] = at;
          });
        }
      }
      if constexpr (kStreamIdx) stream_fence();
    });
  });
}

}  // namespace

void max_pool_forward(const CpuContext& ctx, const Pool2dShape& s, const float* x, float* y,
                      std::int32_t* argmax) {
  max_pool_forward_impl<false>(ctx, s, x, y, argmax);
}

void max_pool_relu_forward(const CpuContext& ctx, const Pool2dShape& s, const float* x, float* y,
                           std::int32_t* argmax) {
  TW_CHECK(argmax != nullptr, "max_pool_relu_forward needs an argmax buffer");
  max_pool_forward_impl<true>(ctx, s, x, y, argmax);
}

void max_pool_relu_forward_bf16(const CpuContext& ctx, const Pool2dShape& s, const float* x,
                                std::uint16_t* y, std::int32_t* argmax) {
  TW_CHECK(argmax != nullptr, "max_pool_relu_forward_bf16 needs an argmax buffer");
  max_pool_forward_impl<true>(ctx, s, x, y, argmax);
}

namespace {

// dx for pixels [iw0, iw1) of input row r (image r / h, row r % h), pixel iw at dx_row + iw * c,
// and with kSums, each pixel's gradient added to acc[0, c) in pixel order.
template <bool kStream, bool kSums>
void max_pool_backward_row(const Pool2dShape& s, const PoolWindows& windows, const float* dy,
                           const std::int32_t* argmax, std::int64_t r, int iw0, int iw1, float* dx_row,
                           float* acc) {
  const int oh = s.out_h(), ow = s.out_w(), c = s.c;
  const std::int64_t image_out = std::int64_t{oh} * ow * c;
  const std::int64_t n = r / s.h;
  const int ih = static_cast<int>(r % s.h);
  const float* g_img = dy + n * image_out;
  const std::int32_t* idx_img = argmax + n * image_out;
  const int row1 = last_window(ih, s.pad_h, s.stride_h, oh);
  with_count(windows.rows[ih], [&]<int NR>() {
    for (int iw = iw0; iw < iw1; ++iw) {
      const int pos = ih * s.w + iw;
      float* d = dx_row + std::int64_t{iw} * c;
      // The next output row at the newest column (Note [Prefetching the next rows]).
      const int col1 = windows.last_col[iw];
      if (row1 + 1 < oh && (iw == iw0 || col1 != windows.last_col[iw - 1])) {
        const std::int64_t o = (std::int64_t{row1 + 1} * ow + col1) * c;
        prefetch(g_img + o, std::int64_t{c} * std::int64_t{sizeof(float)});
        prefetch(idx_img + o, std::int64_t{c} * std::int64_t{sizeof(std::int32_t)});
      }
      const Windows w = windows.at(ih, iw);
      with_count(w.nc, [&]<int NC>() {
        for_channel_groups(
            c,
            [&]<int L, int K>(int ch) {
              gather_max<L, K, NR, NC, kStream, kSums>(g_img, idx_img, w, pos, ch, d, acc);
            },
            [&](int ch) {
              float sum = 0.0f;
              for (int a = 0; a < w.nr; ++a)
                for (int b = 0; b < w.nc; ++b) {
                  const std::int64_t o = w.rows[a] + w.cols[b] + ch;
                  if (idx_img[o] == pos) sum += g_img[o];
                }
              d[ch] = sum;
              if constexpr (kSums) acc[ch] += sum;
            });
      });
    }
  });
}

// max_pool_backward, and with sums (non-null) its channel sums (Note [Channel sums of a pool
// gradient]).
void max_pool_backward_impl(const CpuContext& ctx, const Pool2dShape& s, const float* dy,
                            const std::int32_t* argmax, float* dx, float* sums) {
  s.validate();
  TW_CHECK(argmax != nullptr, "max_pool_backward needs the argmax of max_pool_forward");
  const int c = s.c;
  const PoolWindows& windows = PoolWindows::for_shape(s);
  // dx with streaming stores where it outgrows the caches (Note [Streaming stores]); every
  // channel group's store is then aligned, as c is a multiple of the widest vector.
  const bool stream = std::int64_t{s.n} * s.h * s.w * c * std::int64_t{sizeof(float)} >= kStreamingBytes &&
                      streaming_aligned(dx) && c % kWideLanes == 0;
  if (sums == nullptr) {
    const std::int64_t min_rows = std::max<std::int64_t>(1, 20000 / (std::int64_t{s.w} * c * s.kh));
    ctx.parallel_for(std::int64_t{s.n} * s.h, min_rows, [&](std::int64_t r0, std::int64_t r1) {
      with_flag(stream, [&]<bool kStream>() {
        for (std::int64_t r = r0; r < r1; ++r)
          max_pool_backward_row<kStream, false>(s, windows, dy, argmax, r, 0, s.w, dx + r * s.w * c,
                                                nullptr);
        if constexpr (kStream) stream_fence();
      });
    });
    return;
  }
  const std::int64_t pixels = std::int64_t{s.n} * s.h * s.w;
  const std::int64_t nblocks = (pixels + kSumBlockPixels - 1) / kSumBlockPixels;
  double* partial = reinterpret_cast<double*>(scratch(Scratch::kAux, static_cast<std::size_t>(2 * nblocks * c)));
  ctx.parallel_for(nblocks, 1, [&](std::int64_t b0, std::int64_t b1) {
    float* row_sums = scratch(Scratch::kOutput, static_cast<std::size_t>(c));
    with_flag(stream, [&]<bool kStream>() {
      for (std::int64_t b = b0; b < b1; ++b) {
        double* acc = partial + b * c;
        std::fill(acc, acc + c, 0.0);
        const std::int64_t p0 = b * kSumBlockPixels, p1 = std::min(pixels, p0 + kSumBlockPixels);
        for (std::int64_t r = p0 / s.w; r * s.w < p1; ++r) {
          const int iw0 = static_cast<int>(std::max<std::int64_t>(p0 - r * s.w, 0));
          const int iw1 = static_cast<int>(std::min<std::int64_t>(p1 - r * s.w, s.w));
          std::fill(row_sums, row_sums + c, 0.0f);
          max_pool_backward_row<kStream, true>(s, windows, dy, argmax, r, iw0, iw1, dx + r * s.w * c,
                                               row_sums);
          for (int ch = 0; ch < c; ++ch) acc[ch] += row_sums[ch];
        }
      }
      if constexpr (kStream) stream_fence();
    });
  });
  for (int ch = 0; ch < c; ++ch) {
    double total = 0.0;
    for (std::int64_t b = 0; b < nblocks; ++b) total += partial[b * c + ch];
    sums[ch] = static_cast<float>(total);
  }
}

}  // namespace

void max_pool_backward(const CpuContext& ctx, const Pool2dShape& s, const float* dy,
                       const std::int32_t* argmax, float* dx) {
  max_pool_backward_impl(ctx, s, dy, argmax, dx, nullptr);
}

void max_pool_backward_rows(const Pool2dShape& s, const float* dy, const std::int32_t* argmax,
                            std::int64_t r0, std::int64_t r1, float* dx_rows, float* row_sums) {
  s.validate();
  TW_CHECK(argmax != nullptr, "max_pool_backward_rows needs the argmax of max_pool_forward");
  TW_CHECK(0 <= r0 && r0 <= r1 && r1 <= std::int64_t{s.n} * s.h, "max_pool_backward_rows: rows [", r0, ", ", r1,
           ") outside the batch's ", std::int64_t{s.n} * s.h);
  const PoolWindows& windows = PoolWindows::for_shape(s);
  const std::int64_t row_size = std::int64_t{s.w} * s.c;
  for (std::int64_t r = r0; r < r1; ++r) {
    float* dx_row = dx_rows + (r - r0) * row_size;
    if (row_sums == nullptr) {
      max_pool_backward_row<false, false>(s, windows, dy, argmax, r, 0, s.w, dx_row, nullptr);
    } else {
      float* acc = row_sums + (r - r0) * s.c;
      std::fill(acc, acc + s.c, 0.0f);
      max_pool_backward_row<false, true>(s, windows, dy, argmax, r, 0, s.w, dx_row, acc);
    }
  }
}

void max_pool_backward_channel_sums(const CpuContext& ctx, const Pool2dShape& s, const float* dy,
                                    const std::int32_t* argmax, float* dx, float* sums) {
  TW_CHECK(sums != nullptr, "max_pool_backward_channel_sums needs a buffer for the sums");
  max_pool_backward_impl(ctx, s, dy, argmax, dx, sums);
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
        // Channels in groups of vectors (as max pooling), each summed in registers over the
        // window in the window's order; the group's vectors are independent chains of adds.
        // The channels left over one by one, in the same order.
        for_channel_groups(
            c, [&]<int L, int K>(int ch) { sum_window<L, K>(s, img, win, scale, ch, out); },
            [&](int ch) {
              float sum = 0.0f;
              for (int ih = win.h0; ih < win.h1; ++ih)
                for (int iw = win.w0; iw < win.w1; ++iw) sum += img[(std::int64_t{ih} * s.w + iw) * c + ch];
              out[ch] = sum * scale;
            });
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
  const std::int64_t min_rows = std::max<std::int64_t>(1, 20000 / (std::int64_t{s.w} * c));
  const PoolWindows& windows = PoolWindows::for_shape(s);
  // dx with streaming stores where it outgrows the caches (Note [Streaming stores]); every
  // channel group's store is then aligned, as c is a multiple of the widest vector.
  const bool stream = std::int64_t{s.n} * s.h * s.w * c * std::int64_t{sizeof(float)} >= kStreamingBytes &&
                      streaming_aligned(dx) && c % kWideLanes == 0;
  ctx.parallel_for(std::int64_t{s.n} * s.h, min_rows, [&](std::int64_t r0, std::int64_t r1) {
    with_flag(stream, [&]<bool kStream>() {
      for (std::int64_t r = r0; r < r1; ++r) {
        const std::int64_t n = r / s.h;
        const int ih = static_cast<int>(r % s.h);
        const float* g_img = dy + n * oh * ow * c;
        with_count(windows.rows[ih], [&]<int NR>() {
          for (int iw = 0; iw < s.w; ++iw) {
            float* d = dx + (r * s.w + iw) * c;
            const Windows w = windows.at(ih, iw);
            with_count(w.nc, [&]<int NC>() {
              for_channel_groups(
                  c, [&]<int L, int K>(int ch) { gather_avg<L, K, NR, NC, kStream>(g_img, w, scale, ch, d); },
                  [&](int ch) {
                    float sum = 0.0f;
                    for (int a = 0; a < w.nr; ++a)
                      for (int b = 0; b < w.nc; ++b) sum += g_img[w.rows[a] + w.cols[b] + ch] * scale;
                    d[ch] = sum;
                  });
            });
          }
        });
      }
      if constexpr (kStream) stream_fence();
    });
  });
}

}  // namespace towerflow::cpu::TW_ISA
