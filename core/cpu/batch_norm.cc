#include "core/cpu/batch_norm.h"

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

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
using detail::max8;
using detail::Scratch;
using detail::scratch;
using detail::splat8;
using detail::store8;
using detail::Vec8;

namespace {

// The ReLU's gradient with both values loaded first, so that the select compiles to a blend
// rather than a branch that mispredicts on about half of a ReLU's outputs.
inline float relu_grad(float y, float dy) { return y > 0.0f ? dy : 0.0f; }

// The training forward's value before its ReLU, (x - mean) * scale + shift, for a float or a
// vector of them. One expression for the forward and for the backward that recomputes its mask
// (Note [The ReLU mask from x]), so that both contract it to the same FMA and agree bit for bit.
template <typename T>
inline T pre_relu(T x, T mean, T scale, T shift) {
  return (x - mean) * scale + shift;
}

// Note [The ReLU mask from x]
// The backward of relu(batch_norm(x)) needs the ReLU's mask, y > 0. Reading it from y costs a
// pass over y in each of the backward's two passes (x and dy are read in both anyway), 7 floats
// of traffic per element instead of 5. Recomputing the pre-ReLU value from x, the saved mean and
// invstd, gamma and beta costs an FMA and a compare: the forward takes its scale from the saved
// invstd (training_stats) and both sides evaluate pre_relu(), so the mask is the forward's own,
// bit for bit (a test checks it against the mask read from y). The add variant's mask needs the
// residual as well, so it reads y.

// Inputs x: floats, or bf16 bits (std::uint16_t, the top half of a float32's: a convolution's
// output stored for the batch norm after it, Note [bf16 convolution outputs] in
// core/tensor/ops.cc), widened exactly to the floats they stand for. Eight at a time, or one.
// With AVX2, by its widening instruction: GCC makes the vector extensions' conversion from four
// lanes at a time.
inline Vec8 load_x8(const float* p) { return load8(p); }
inline Vec8 load_x8(const std::uint16_t* p) {
#if defined(__AVX2__)
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return std::bit_cast<Vec8>(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
#else
  typedef std::uint16_t Vec8h __attribute__((vector_size(16), aligned(2), may_alias));
  typedef std::uint32_t Vec8u __attribute__((vector_size(32)));
  return std::bit_cast<Vec8>(__builtin_convertvector(*reinterpret_cast<const Vec8h*>(p), Vec8u) << 16);
#endif
}
inline float load_x(const float* p) { return *p; }
inline float load_x(const std::uint16_t* p) { return std::bit_cast<float>(std::uint32_t{*p} << 16); }

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

// Note [Sums in registers]
// A block's per-channel sums are kept in registers across its rows, a few vectors of channels
// at a time (for_vector_groups), rather than loaded from and stored to the block's accumulator
// array at every row: that made each row wait for the store of the row before (a store-to-load
// round trip and an add per vector), which at ResNet's 16 and 32 channels, a row or two per
// cache line, held the statistics passes well under the memory's speed. A group's rows are read
// from the caches after the first group's pass has brought the block in. The adds per channel
// are the same, in the same order, so the results are too.

// group.template operator()<NV>(ch) for channels [ch, ch + NV * kLanes), NV <= kMaxVectors, over
// all of [0, c), c a multiple of kLanes.
template <int kMaxVectors, typename Group>
void for_vector_groups(int c, Group group) {
  int ch = 0;
  for (; ch + kMaxVectors * kLanes <= c; ch += kMaxVectors * kLanes) group.template operator()<kMaxVectors>(ch);
  const int left = (c - ch) / kLanes;
  if constexpr (kMaxVectors > 3) if (left == 3) return group.template operator()<3>(ch);
  if constexpr (kMaxVectors > 2) if (left == 2) return group.template operator()<2>(ch);
  if constexpr (kMaxVectors > 1) if (left == 1) return group.template operator()<1>(ch);
}

// shifted_sums over rows [r0, r1) for channels [ch, ch + NV * kLanes) (Note [Sums in registers]).
template <int NV, typename X>
void shifted_sums_rows(std::int64_t r0, std::int64_t r1, int c, int ch, const X* x,
                       const float* k, float* acc) {
  Vec8 s1[NV], s2[NV], kv[NV];
  for (int j = 0; j < NV; ++j) {
    s1[j] = s2[j] = splat8(0.0f);
    kv[j] = load8(k + ch + j * kLanes);
  }
  for (std::int64_t r = r0; r < r1; ++r)
    for (int j = 0; j < NV; ++j) {
      const Vec8 d = load_x8(x + r * c + ch + j * kLanes) - kv[j];
      s1[j] += d;
      s2[j] += d * d;
    }
  for (int j = 0; j < NV; ++j) {
    store8(acc + ch + j * kLanes, s1[j]);
    store8(acc + c + ch + j * kLanes, s2[j]);
  }
}

// The first row of x as floats, into k[0, c).
template <typename X>
void first_row(int c, const X* x, float* k) {
  for (int ch = 0; ch < c; ++ch) k[ch] = load_x(x + ch);
}

// sums[0..c) = sum(x - k), sums[c..2c) = sum((x - k)^2), k[0, c) the first row (first_row's).
template <typename X>
void shifted_sums(const CpuContext& ctx, std::int64_t rows, int c, const X* x, const float* k, double* sums) {
  blocked_sums(ctx, rows, 2 * c, sums, [&](std::int64_t r0, std::int64_t r1, float* acc) {
    if (c % kLanes == 0)
      return for_vector_groups<4>(c, [&]<int NV>(int ch) { shifted_sums_rows<NV>(r0, r1, c, ch, x, k, acc); });
    float* __restrict s1 = acc;
    float* __restrict s2 = acc + c;
    const float* __restrict kr = k;
    for (std::int64_t r = r0; r < r1; ++r) {
      const X* __restrict row = x + r * c;
      for (int ch = 0; ch < c; ++ch) {
        const float d = load_x(row + ch) - kr[ch];
        s1[ch] += d;
        s2[ch] += d * d;
      }
    }
  });
}

// Per-channel scale and shift of the training forward: y = (x - mean) * scale + shift. Centring
// first (rather than folding the mean into the shift) keeps y accurate when |mean| >> std.
template <typename X>
void training_stats(const CpuContext& ctx, std::int64_t rows, int c, const X* x,
                    const float* gamma, const float* beta, float eps, float* save_mean,
                    float* save_invstd, float* scale, float* shift) {
  double* sums = reinterpret_cast<double*>(scratch(Scratch::kWeights, 2 * 2 * std::size_t(c) + std::size_t(c)));
  float* k = reinterpret_cast<float*>(sums + 2 * c);
  first_row(c, x, k);
  shifted_sums(ctx, rows, c, x, k, sums);
  for (int ch = 0; ch < c; ++ch) {
    const double m = sums[ch] / rows;
    const double var = std::max(0.0, sums[c + ch] / rows - m * m);
    const double mean = m + k[ch];
    const double invstd = 1.0 / std::sqrt(var + eps);
    save_mean[ch] = static_cast<float>(mean);
    save_invstd[ch] = static_cast<float>(invstd);
    // From the saved (rounded) invstd, not the double: backward recomputes this scale from what
    // was saved (Note [The ReLU mask from x]), and batch_norm_forward_apply takes it so too.
    scale[ch] = static_cast<float>(gamma[ch] * static_cast<double>(save_invstd[ch]));
    shift[ch] = beta[ch];
  }
}

// The scale/shift arrays live in the caller's scratch and are read by every thread.
float* affine_scratch(int c) { return scratch(Scratch::kOutput, 2 * std::size_t(c)); }

// Output values: floats as they are, or rounded to bf16 bits as bf16_bits.h rounds them (to
// nearest, ties to even; infinities stay) but for NaN: bf16 outputs come from a ReLU, which
// gives none (it passes NaN as 0), so the NaN case, a third of the instructions, is
// left out. Eight at a time, or one.
inline void store_out8(float* p, Vec8 v) { store8(p, v); }
inline void store_out8(std::uint16_t* p, Vec8 v) {
  typedef std::uint32_t Vec8u __attribute__((vector_size(32)));
  const Vec8u b = std::bit_cast<Vec8u>(v);
  const Vec8u r = (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
  // Narrowed by the instruction sets' own narrowing (the values fit 16 bits): GCC makes the vector
  // extensions' conversion from a two-register permute.
#if defined(__AVX512BW__) && defined(__AVX512VL__)
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtepi32_epi16(std::bit_cast<__m256i>(r)));
#elif defined(__AVX2__)
  const __m256i w = std::bit_cast<__m256i>(r);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm_packus_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)));
#else
  typedef std::uint16_t Vec8h __attribute__((vector_size(16), aligned(2), may_alias));
  *reinterpret_cast<Vec8h*>(p) = __builtin_convertvector(r, Vec8h);
#endif
}
inline void store_out(float* p, float v) { *p = v; }
inline void store_out(std::uint16_t* p, float v) {
  const std::uint32_t b = std::bit_cast<std::uint32_t>(v);
  *p = static_cast<std::uint16_t>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

// The forward's elementwise pass over rows [r0, r1): y = pre_relu(x) (+ residual when
// kResidual), through max(0, .) when kRelu; the residual floats or bf16 bits (widened as x is);
// y float, or bf16 bits (std::uint16_t) rounded from the same floats. With vectors where c is a
// multiple of kLanes: left to the auto-vectoriser, each row's loop checks every pointer against y
// at run time (y may be x), which at ResNet's 16 channels costs about as much as the row's work.
template <bool kRelu, bool kResidual, typename X, typename Out, typename R = float>
void forward_rows(std::int64_t r0, std::int64_t r1, int c, const X* x, const std::type_identity_t<R>* residual,
                  const float* mean, const float* scale, const float* shift, Out* y) {
  static_assert(kRelu || std::is_same_v<Out, float>, "bf16 outputs come from a ReLU (no NaN)");
  if (c % kLanes == 0) {
    const Vec8 zero = splat8(0.0f);
    for (std::int64_t r = r0; r < r1; ++r) {
      const std::int64_t o = r * c;
      for (int ch = 0; ch < c; ch += kLanes) {
        Vec8 v = pre_relu(load_x8(x + o + ch), load8(mean + ch), load8(scale + ch), load8(shift + ch));
        if constexpr (kResidual) v += load_x8(residual + o + ch);
        store_out8(y + o + ch, kRelu ? max8(v, zero) : v);
      }
    }
    return;
  }
  for (std::int64_t r = r0; r < r1; ++r)
    for (int ch = 0; ch < c; ++ch) {
      float v = pre_relu(load_x(x + r * c + ch), mean[ch], scale[ch], shift[ch]);
      if constexpr (kResidual) v += load_x(residual + r * c + ch);
      store_out(y + r * c + ch, kRelu ? std::max(0.0f, v) : v);
    }
}

}  // namespace

namespace {

// The training forwards: statistics, then the elementwise pass with the saved mean and the scale
// and shift they give (kernel names the caller in errors).
template <bool kRelu, bool kResidual, typename X, typename Out, typename R = float>
void training_forward(const char* kernel, const CpuContext& ctx, std::int64_t rows, int c,
                      const X* x, const std::type_identity_t<R>* residual, const float* gamma,
                      const float* beta, float eps, Out* y, float* save_mean,
                      float* save_invstd) {
  check_args(kernel, rows, c, eps);
  float* scale = affine_scratch(c);
  float* shift = scale + c;
  training_stats(ctx, rows, c, x, gamma, beta, eps, save_mean, save_invstd, scale, shift);
  rows_parallel(ctx, rows, c, [&](std::int64_t r0, std::int64_t r1) {
    forward_rows<kRelu, kResidual, X, Out, R>(r0, r1, c, x, residual, save_mean, scale, shift, y);
  });
}

}  // namespace

void batch_norm_forward_training(const CpuContext& ctx, std::int64_t rows, int c, const float* x,
                                 const float* gamma, const float* beta, float eps, float* y,
                                 float* save_mean, float* save_invstd) {
  training_forward<false, false>("batch_norm_forward_training", ctx, rows, c, x, nullptr, gamma,
                                 beta, eps, y, save_mean, save_invstd);
}

void batch_norm_relu_forward_training(const CpuContext& ctx, std::int64_t rows, int c,
                                      const float* x, const float* gamma, const float* beta,
                                      float eps, float* y, float* save_mean, float* save_invstd) {
  training_forward<true, false>("batch_norm_relu_forward_training", ctx, rows, c, x, nullptr,
                                gamma, beta, eps, y, save_mean, save_invstd);
}

void batch_norm_relu_forward_training_bf16(const CpuContext& ctx, std::int64_t rows, int c,
                                           const float* x, const float* gamma, const float* beta,
                                           float eps, std::uint16_t* y, float* save_mean,
                                           float* save_invstd) {
  training_forward<true, false>("batch_norm_relu_forward_training_bf16", ctx, rows, c, x, nullptr,
                                gamma, beta, eps, y, save_mean, save_invstd);
}

void batch_norm_add_relu_forward_training(const CpuContext& ctx, std::int64_t rows, int c,
                                          const float* x, const float* residual,
                                          const float* gamma, const float* beta, float eps,
                                          float* y, float* save_mean, float* save_invstd) {
  training_forward<true, true>("batch_norm_add_relu_forward_training", ctx, rows, c, x, residual,
                               gamma, beta, eps, y, save_mean, save_invstd);
}

void batch_norm_forward_training_bf16_input(const CpuContext& ctx, std::int64_t rows, int c,
                                            const std::uint16_t* x, const float* gamma,
                                            const float* beta, float eps, float* y,
                                            float* save_mean, float* save_invstd) {
  training_forward<false, false>("batch_norm_forward_training_bf16_input", ctx, rows, c, x, nullptr,
                                 gamma, beta, eps, y, save_mean, save_invstd);
}

void batch_norm_relu_forward_training_bf16_input(const CpuContext& ctx, std::int64_t rows, int c,
                                                 const std::uint16_t* x, const float* gamma,
                                                 const float* beta, float eps, float* y,
                                                 float* save_mean, float* save_invstd) {
  training_forward<true, false>("batch_norm_relu_forward_training_bf16_input", ctx, rows, c, x,
                                nullptr, gamma, beta, eps, y, save_mean, save_invstd);
}

void batch_norm_relu_forward_training_bf16_io(const CpuContext& ctx, std::int64_t rows, int c,
                                              const std::uint16_t* x, const float* gamma,
                                              const float* beta, float eps, std::uint16_t* y,
                                              float* save_mean, float* save_invstd) {
  training_forward<true, false>("batch_norm_relu_forward_training_bf16_io", ctx, rows, c, x,
                                nullptr, gamma, beta, eps, y, save_mean, save_invstd);
}

void batch_norm_add_relu_forward_training_bf16_input(const CpuContext& ctx, std::int64_t rows,
                                                     int c, const std::uint16_t* x,
                                                     const float* residual,
                                                     const std::uint16_t* residual_bf16,
                                                     const float* gamma, const float* beta,
                                                     float eps, float* y, std::uint16_t* y_bf16,
                                                     float* save_mean, float* save_invstd) {
  constexpr const char* kKernel = "batch_norm_add_relu_forward_training_bf16_input";
  TW_CHECK((residual == nullptr) != (residual_bf16 == nullptr) && (y == nullptr) != (y_bf16 == nullptr),
           kKernel, " takes one residual (float or bf16) and one output (float or bf16)");
  using U16 = std::uint16_t;
  if (residual_bf16 && y_bf16)
    return training_forward<true, true, U16, U16, U16>(kKernel, ctx, rows, c, x, residual_bf16, gamma, beta,
                                                       eps, y_bf16, save_mean, save_invstd);
  if (residual_bf16)
    return training_forward<true, true, U16, float, U16>(kKernel, ctx, rows, c, x, residual_bf16, gamma,
                                                         beta, eps, y, save_mean, save_invstd);
  if (y_bf16)
    return training_forward<true, true, U16, U16>(kKernel, ctx, rows, c, x, residual, gamma, beta, eps,
                                                  y_bf16, save_mean, save_invstd);
  training_forward<true, true>(kKernel, ctx, rows, c, x, residual, gamma, beta, eps, y, save_mean,
                               save_invstd);
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
    forward_rows<false, false>(r0, r1, c, x, nullptr, running_mean, scale, beta, y);
  });
}

namespace {

// Where the backward's ReLU mask comes from: no ReLU, the fused forward's output (y > 0), or the
// pre-ReLU value recomputed from x (Note [The ReLU mask from x]).
enum class Mask { kNone, kFromY, kFromX };

// The per-channel arrays the kFromX mask reads: the forward's scale and shift.
struct Affine {
  const float* scale = nullptr;
  const float* shift = nullptr;
};

// The gradient g of a vector of elements at offset o under the mask (vector loops); xv and m are
// their x and mean, scale and shift the kFromX mask's; y (kFromY) floats or bf16 bits.
template <Mask kMask, typename Y>
inline Vec8 masked_grad8(Vec8 g, Vec8 xv, Vec8 m, const Y* y, std::int64_t o, Vec8 scale, Vec8 shift) {
  const Vec8 zero = splat8(0.0f);
  if constexpr (kMask == Mask::kFromY) return load_x8(y + o) > zero ? g : zero;
  if constexpr (kMask == Mask::kFromX) return pre_relu(xv, m, scale, shift) > zero ? g : zero;
  return g;
}

// backward_sums over rows [r0, r1) for channels [ch, ch + NV * kLanes), c a multiple of kLanes
// (Note [Sums in registers]): acc[0..c) = sum of g, acc[c..2c) = sum of g * (x - mean), g = dy
// masked as kMask says (and stored in dr when kStore; dr may be dy). The same per-channel order
// of operations as the scalar loop.
template <Mask kMask, bool kStore, int NV, typename X, typename Y>
void backward_sums_rows(std::int64_t r0, std::int64_t r1, int c, int ch, const X* x,
                        const Y* y, const float* dy, const float* mean, Affine f, float* acc,
                        float* dr) {
  const Vec8 zero = splat8(0.0f);
  Vec8 s1[NV], s2[NV], m[NV], scale[NV] = {}, shift[NV] = {};
  for (int j = 0; j < NV; ++j) {
    s1[j] = s2[j] = zero;
    m[j] = load8(mean + ch + j * kLanes);
    if constexpr (kMask == Mask::kFromX) {
      scale[j] = load8(f.scale + ch + j * kLanes);
      shift[j] = load8(f.shift + ch + j * kLanes);
    }
  }
  for (std::int64_t r = r0; r < r1; ++r)
    for (int j = 0; j < NV; ++j) {
      const std::int64_t o = r * c + ch + j * kLanes;
      const Vec8 xv = load_x8(x + o);
      const Vec8 g = masked_grad8<kMask>(load8(dy + o), xv, m[j], y, o, scale[j], shift[j]);
      if constexpr (kStore) store8(dr + o, g);
      s1[j] += g;
      s2[j] += g * (xv - m[j]);
    }
  for (int j = 0; j < NV; ++j) {
    store8(acc + ch + j * kLanes, s1[j]);
    store8(acc + c + ch + j * kLanes, s2[j]);
  }
}

// The gradient of element ch of row r under the mask (scalar loops).
template <Mask kMask, typename X, typename Y>
inline float masked_grad(const X* xr, const Y* yr, const float* gr, const float* mean, Affine f, int ch) {
  if constexpr (kMask == Mask::kFromY) return relu_grad(load_x(yr + ch), gr[ch]);
  if constexpr (kMask == Mask::kFromX)
    return pre_relu(load_x(xr + ch), mean[ch], f.scale[ch], f.shift[ch]) > 0.0f ? gr[ch] : 0.0f;
  return gr[ch];
}

// The backward's reduction: sums[0..c) = sum(g), sums[c..2c) = sum(g * (x - mean)), g the
// gradient masked as kMask says (and then stored in d_pre_relu when that is not null).
template <Mask kMask, typename X, typename Y = float>
void backward_sums(const CpuContext& ctx, std::int64_t rows, int c, const X* x,
                   const std::type_identity_t<Y>* y, const float* dy, const float* save_mean, Affine f, double* sums,
                   float* d_pre_relu) {
  blocked_sums(ctx, rows, 2 * c, sums, [&](std::int64_t r0, std::int64_t r1, float* acc) {
    if (c % kLanes == 0) {
      // Written with vectors rather than left to the auto-vectoriser: d_pre_relu may be dy
      // itself, and the run-time overlap checks GCC emits for that case chose its scalar loop.
      if (!d_pre_relu || kMask == Mask::kNone)
        return for_vector_groups<2>(c, [&]<int NV>(int ch) {
          backward_sums_rows<kMask, false, NV, X, Y>(r0, r1, c, ch, x, y, dy, save_mean, f, acc, nullptr);
        });
      return for_vector_groups<2>(c, [&]<int NV>(int ch) {
        backward_sums_rows<kMask, true, NV, X, Y>(r0, r1, c, ch, x, y, dy, save_mean, f, acc, d_pre_relu);
      });
    }
    float* __restrict s1 = acc;
    float* __restrict s2 = acc + c;
    const float* __restrict mean = save_mean;
    for (std::int64_t r = r0; r < r1; ++r) {
      const X* __restrict xr = x + r * c;
      const float* gr = dy + r * c;
      const Y* yr = y ? y + r * c : nullptr;
      if (kMask != Mask::kNone && d_pre_relu) {
        float* dr = d_pre_relu + r * c;  // may be dy itself: read before write, element-wise
        for (int ch = 0; ch < c; ++ch) {
          const float g = masked_grad<kMask>(xr, yr, gr, mean, f, ch);
          dr[ch] = g;
          s1[ch] += g;
          s2[ch] += g * (load_x(xr + ch) - mean[ch]);
        }
      } else {
        for (int ch = 0; ch < c; ++ch) {
          const float g = masked_grad<kMask>(xr, yr, gr, mean, f, ch);
          s1[ch] += g;
          s2[ch] += g * (load_x(xr + ch) - mean[ch]);
        }
      }
    }
  });
}

// backward_dx over rows [r0, r1) for c a multiple of kLanes, the same operations per element.
template <Mask kMask, typename X, typename Y>
void backward_dx_rows(std::int64_t r0, std::int64_t r1, int c, const X* x, const Y* y,
                      const float* dy, const float* mean, Affine f, const float* a,
                      const float* mean_g, const float* b, float* dx) {
  for (std::int64_t r = r0; r < r1; ++r) {
    const std::int64_t o = r * c;
    for (int ch = 0; ch < c; ch += kLanes) {
      const Vec8 xv = load_x8(x + o + ch), m = load8(mean + ch);
      Vec8 scale{}, shift{};
      if constexpr (kMask == Mask::kFromX) {
        scale = load8(f.scale + ch);
        shift = load8(f.shift + ch);
      }
      const Vec8 g = masked_grad8<kMask>(load8(dy + o + ch), xv, m, y, o + ch, scale, shift);
      store8(dx + o + ch, load8(a + ch) * ((g - load8(mean_g + ch)) - (xv - m) * load8(b + ch)));
    }
  }
}

// The backward's elementwise pass: dx = a * ((g - mean_g) - (x - mean) * b), g as in
// backward_sums.
template <Mask kMask, typename X, typename Y = float>
void backward_dx(const CpuContext& ctx, std::int64_t rows, int c, const X* x, const std::type_identity_t<Y>* y,
                 const float* dy, const float* save_mean, Affine f, const float* a,
                 const float* mean_g, const float* b, float* dx) {
  rows_parallel(ctx, rows, c, [&](std::int64_t r0, std::int64_t r1) {
    // With vectors for the reason backward_sums has them (dx may be dy): the loop below
    // vectorises behind a run-time overlap check of every pointer against dx on every row,
    // which costs more than the row's work at ResNet's 16 and 32 channels.
    if (c % kLanes == 0) return backward_dx_rows<kMask, X, Y>(r0, r1, c, x, y, dy, save_mean, f, a, mean_g, b, dx);
    for (std::int64_t r = r0; r < r1; ++r) {
      const X* xr = x + r * c;
      const float* gr = dy + r * c;
      const Y* yr = y ? y + r * c : nullptr;
      float* dr = dx + r * c;
      for (int ch = 0; ch < c; ++ch) {
        const float g = masked_grad<kMask>(xr, yr, gr, save_mean, f, ch);
        dr[ch] = a[ch] * ((g - mean_g[ch]) - (load_x(xr + ch) - save_mean[ch]) * b[ch]);
      }
    }
  });
}

// Shared by the plain and the ReLU backward. The incoming gradient is masked as kMask says (and
// stored in d_pre_relu when that is not null) before batch norm's own backward; kFromX reads beta.
template <Mask kMask, typename X, typename Y = float>
void backward_impl(const CpuContext& ctx, std::int64_t rows, int c, const X* x,
                   const std::type_identity_t<Y>* y, const float* dy, const float* gamma, const float* beta,
                   const float* save_mean, const float* save_invstd, float* dx, float* dgamma,
                   float* dbeta, float* d_pre_relu) {
  // dx = gamma*invstd * ((g - mean(g)) - (x - mean) * invstd * mean(g * xhat)), kept in this
  // centred form: folding it into one a*g + b*x + k cancels catastrophically when dx is small.
  // a = gamma * invstd is also the forward's scale, which the kFromX mask needs in the sums.
  float* coef = scratch(Scratch::kOutput, 3 * std::size_t(c));
  float* a = coef;
  float* mean_g = coef + c;
  float* b = coef + 2 * c;
  for (int ch = 0; ch < c; ++ch) a[ch] = static_cast<float>(gamma[ch] * static_cast<double>(save_invstd[ch]));
  const Affine f{a, beta};
  double* sums = reinterpret_cast<double*>(scratch(Scratch::kWeights, 2 * 2 * std::size_t(c)));
  backward_sums<kMask, X, Y>(ctx, rows, c, x, y, dy, save_mean, f, sums, d_pre_relu);
  for (int ch = 0; ch < c; ++ch) {
    const double invstd = save_invstd[ch];
    const double sum_g = sums[ch], sum_gx = sums[c + ch];
    dbeta[ch] = static_cast<float>(sum_g);
    dgamma[ch] = static_cast<float>(sum_gx * invstd);
    mean_g[ch] = static_cast<float>(sum_g / rows);
    b[ch] = static_cast<float>(invstd * invstd * sum_gx / rows);
  }
  // With d_pre_relu the masked gradient is already in memory: read it instead of y and dy.
  if (d_pre_relu && kMask != Mask::kNone)
    return backward_dx<Mask::kNone>(ctx, rows, c, x, nullptr, d_pre_relu, save_mean, f, a, mean_g, b, dx);
  backward_dx<kMask, X, Y>(ctx, rows, c, x, y, dy, save_mean, f, a, mean_g, b, dx);
}

}  // namespace

namespace {

template <typename X>
void relu_backward(const char* kernel, const CpuContext& ctx, std::int64_t rows, int c, const X* x,
                   const float* y, const std::uint16_t* y_bf16, const float* dy, const float* gamma,
                   const float* beta, const float* save_mean, const float* save_invstd, float* dx,
                   float* dgamma, float* dbeta, float* d_pre_relu) {
  check_args(kernel, rows, c, 0.0f);
  if (y && y_bf16) raise<InvalidArgument>(kernel, ": y is given both as floats and as bf16; pass one");
  if (!y && !y_bf16 && !beta)
    raise<InvalidArgument>(kernel, ": y and beta are both null; the ReLU mask needs the forward's "
                           "output y or beta to recompute it from x");
  if (y)
    return backward_impl<Mask::kFromY>(ctx, rows, c, x, y, dy, gamma, beta, save_mean, save_invstd,
                                       dx, dgamma, dbeta, d_pre_relu);
  if (y_bf16)
    return backward_impl<Mask::kFromY, X, std::uint16_t>(ctx, rows, c, x, y_bf16, dy, gamma, beta, save_mean,
                                                         save_invstd, dx, dgamma, dbeta, d_pre_relu);
  backward_impl<Mask::kFromX>(ctx, rows, c, x, nullptr, dy, gamma, beta, save_mean, save_invstd,
                              dx, dgamma, dbeta, d_pre_relu);
}

}  // namespace

void batch_norm_backward(const CpuContext& ctx, std::int64_t rows, int c, const float* x,
                         const float* dy, const float* gamma, const float* save_mean,
                         const float* save_invstd, float* dx, float* dgamma, float* dbeta) {
  check_args("batch_norm_backward", rows, c, 0.0f);
  backward_impl<Mask::kNone>(ctx, rows, c, x, nullptr, dy, gamma, nullptr, save_mean, save_invstd,
                             dx, dgamma, dbeta, nullptr);
}

void batch_norm_backward_bf16_input(const CpuContext& ctx, std::int64_t rows, int c,
                                    const std::uint16_t* x, const float* dy, const float* gamma,
                                    const float* save_mean, const float* save_invstd, float* dx,
                                    float* dgamma, float* dbeta) {
  check_args("batch_norm_backward_bf16_input", rows, c, 0.0f);
  backward_impl<Mask::kNone>(ctx, rows, c, x, nullptr, dy, gamma, nullptr, save_mean, save_invstd,
                             dx, dgamma, dbeta, nullptr);
}

void batch_norm_relu_backward(const CpuContext& ctx, std::int64_t rows, int c, const float* x,
                              const float* y, const float* dy, const float* gamma,
                              const float* beta, const float* save_mean, const float* save_invstd,
                              float* dx, float* dgamma, float* dbeta, float* d_pre_relu) {
  relu_backward("batch_norm_relu_backward", ctx, rows, c, x, y, nullptr, dy, gamma, beta, save_mean,
                save_invstd, dx, dgamma, dbeta, d_pre_relu);
}

void batch_norm_relu_backward_bf16_input(const CpuContext& ctx, std::int64_t rows, int c,
                                         const std::uint16_t* x, const float* y,
                                         const std::uint16_t* y_bf16, const float* dy,
                                         const float* gamma, const float* beta,
                                         const float* save_mean, const float* save_invstd,
                                         float* dx, float* dgamma, float* dbeta,
                                         float* d_pre_relu) {
  relu_backward("batch_norm_relu_backward_bf16_input", ctx, rows, c, x, y, y_bf16, dy, gamma, beta,
                save_mean, save_invstd, dx, dgamma, dbeta, d_pre_relu);
}

// ---- phases ------------------------------------------------------------------------------------

void batch_norm_moments(const CpuContext& ctx, std::int64_t rows, int c, const float* x,
                        double* mean, double* m2) {
  check_args("batch_norm_moments", rows, c, 0.0f);
  double* sums = reinterpret_cast<double*>(scratch(Scratch::kWeights, 2 * 2 * std::size_t(c) + std::size_t(c)));
  float* k = reinterpret_cast<float*>(sums + 2 * c);
  first_row(c, x, k);
  shifted_sums(ctx, rows, c, x, k, sums);
  for (int ch = 0; ch < c; ++ch) {
    const double s1 = sums[ch], s2 = sums[c + ch];
    mean[ch] = k[ch] + s1 / rows;
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
    if (residual && relu) return forward_rows<true, true>(r0, r1, c, x, residual, mean, scale, beta, y);
    if (residual) return forward_rows<false, true>(r0, r1, c, x, residual, mean, scale, beta, y);
    if (relu) return forward_rows<true, false>(r0, r1, c, x, nullptr, mean, scale, beta, y);
    forward_rows<false, false>(r0, r1, c, x, nullptr, mean, scale, beta, y);
  });
}

void batch_norm_backward_reduce(const CpuContext& ctx, std::int64_t rows, int c, const float* x,
                                const float* y, const float* dy, const float* mean, double* sum_g,
                                double* sum_gxc, float* d_pre_relu) {
  check_args("batch_norm_backward_reduce", rows, c, 0.0f);
  double* sums = reinterpret_cast<double*>(scratch(Scratch::kWeights, 2 * 2 * std::size_t(c)));
  if (y) backward_sums<Mask::kFromY>(ctx, rows, c, x, y, dy, mean, {}, sums, d_pre_relu);
  else backward_sums<Mask::kNone>(ctx, rows, c, x, nullptr, dy, mean, {}, sums, nullptr);
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
  if (y) backward_dx<Mask::kFromY>(ctx, rows, c, x, y, dy, mean, {}, a, mean_g, b, dx);
  else backward_dx<Mask::kNone>(ctx, rows, c, x, nullptr, dy, mean, {}, a, mean_g, b, dx);
}

}  // namespace towerflow::cpu::TW_ISA
