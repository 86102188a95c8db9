// bf16 convolutions and GEMM on AMX tiles (bf16_amx.h), compiled once with AMX-TILE and AMX-BF16
// and once for AVX-512F with the tiles emulated.
#include "core/cpu/bf16_amx.h"

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/cpu/bf16_packing.h"
#include "core/cpu/conv_impl.h"
#include "core/cpu/simd_impl.h"

// Note [bf16 AMX kernels]
// An AMX tile holds up to 16 rows of 64 bytes. tdpbf16ps multiplies a tile A of 16 rows of K
// bf16 (K/2 pairs, K <= 32) by a tile B of K/2 rows of 16 pairs and adds the 16 x 16 fp32
// products into a tile C: 8192 multiply-adds per instruction, 16 times vdpbf16ps's. B's layout is
// the pair kernels' packed weights ([pair][16 output channels], bf16_packing.h), and since a tile
// load takes any row stride, A's rows are read straight from the bf16 rows of the input:
//   forward, backward input  C = 16 output pixels x 16 output channels. A's row m is pixel m's
//       input under one kernel row: q = (kernel column, channel), contiguous in NHWC, in chunks
//       of kc bf16 (the largest even divisor of kw * c2 up to 32, so that no chunk reads past a
//       pixel's q; the channels c2 are padded to 16 where that divisor would be small). Where the
//       stride is 1, the pixels of a tile run along the rows of the padded input: an output row
//       is taken as wide as the padded input, whose extra pixels are computed and dropped, so
//       consecutive pixels are one row stride apart across rows and tiles are full. With a larger
//       stride a tile stays in one output row. Stride > 1 backward input runs per stride phase,
//       each a stride-1 convolution of the embedded dy (Note [Backward input by stride phases]).
//   backward weight  C = 16 output channels x 16 of q (kernel column, input channel), for one
//       kernel row; A = dy transposed, [output channel][pixel pair], B = x in pixel pairs
//       [pair][q], per pass of up to 128 pixels with the pairs padded with zeros to chunks of 16.
//       Only dy is transposed (once a pass, in registers, 16 pairs by 16 channels at a time; x,
//       kw * c_in / c_out times larger, is packed as the pair kernels pack it, Note
//       [Weight-gradient passes in pixel pairs]): with x transposed
//       instead, per kernel row, the packing alone took 12.5 ms of the 16->16 32x32
//       layer's weight gradient at batch 128 (2 threads, tile instructions removed), 2.9x the
//       emulated path's whole kernel. C lives in a padded weight gradient, loaded and stored per
//       pass; images and tiles follow Note [Weight gradient: image groups or tiles]. At stride 1
//       with the input channels in sixteens, x is packed once per image instead (Note [AMX
//       weight gradient over column pairs]).
//   GEMM  a 1x1 convolution over the rows of op(a), as the pair kernels'.
// Tiles: C 0-3 (2 x 2 tiles of 16 x 16 fp32), A 4 and 5, B 6 and 7. A block of work is up to 32
// pixels (or q) by 32 channels: four products for two loads of A and two of B.
// Every output element is summed by one thread in a fixed order, so results do not depend on the
// thread count (Note [Deterministic reductions]).
//
// Linux lends a process the tile data only when asked (Note [AMX permission] in isa.cc, asked by
// cpu_has_amx_bf16() before these kernels are chosen). Each thread loads the tile configuration
// before its first tile instruction and releases the tiles when its part of a call is done.
//
// Without AMX the tiles are emulated: thread-local arrays, and tdpbf16ps as two FMAs per lane in
// the order of Intel's description (the even products of a pair, then the odd). The instruction
// does not round that way: it adds a tile row's products to the accumulator in a sum of its own,
// so the two differ in the last bits. On a Sapphire
// Rapids-class Xeon, with a full row (32 products), 43% of the results differ from the FMAs' and
// 21% from the exactly rounded sum, the largest error about 2^-20 of the largest term for both
// (`towerflow_bench_amx_rounding`). Both stay within the tests' tolerance
// for the same products summed in another order. The instruction also treats denormal inputs as
// zero and flushes denormal results. As with the pair kernels, the emulation exists so that every
// packing, tiling and phase path runs on any AVX-512 CPU, in the tests.

namespace towerflow::cpu::TW_ISA {

using detail::bf16_rows;
using detail::conv_input;
using detail::ConvInput;
using detail::first_lanes;
using detail::for_image_rows;
using detail::input_rows;
using detail::InputRows;
using detail::pack_column_pairs;
using detail::pack_pass_pairs;
using detail::pack_weight_pairs;
using detail::padded_image;
using detail::padded_image_buffer;
using detail::parallel_rows;
using detail::pass_pair_rows;
using detail::Pair;
using detail::round_up;
using detail::rounded_bits;
using detail::rounded_bits16;
using detail::Scratch;
using detail::scratch;
using detail::scratch_pairs;
using detail::shared_kernel_rows;
using detail::StridePhases;
using detail::sum_weight_grad;
using detail::zeroed_scratch;

namespace {

constexpr int kRows = 16;      // rows of a tile
constexpr int kRowBytes = 64;  // bytes of a tile row
constexpr int kLanes = 16;     // fp32 values or bf16 pairs in a tile row
constexpr int kBlock = 32;     // pixels (or q) and channels of a block of 2 x 2 tiles

// ldtilecfg's operand, palette 1.
struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

// C tiles 0-3: 16 x 16 fp32; A tiles 4 and 5: 16 rows of a_bytes (a_bytes / 2 bf16); B tiles 6
// and 7: a_bytes / 4 rows of 16 pairs.
TileConfig tile_config(int a_bytes) {
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.colsb[t] = static_cast<std::uint16_t>(t == 4 || t == 5 ? a_bytes : kRowBytes);
    c.rows[t] = static_cast<std::uint8_t>(t >= 6 ? a_bytes / 4 : kRows);
  }
  return c;
}

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)

// GCC's tile intrinsics are asm statements that name no memory operand (but for the store's
// clobber): a compiler barrier before each configuration and load keeps the stores of the
// operands they read before them.
void load_config(const TileConfig& c) {
  __asm__ volatile("" ::: "memory");
  _tile_loadconfig(&c);
}
void release_tiles() { _tile_release(); }
#define TW_TILE_LOAD(t, base, stride)      \
  do {                                     \
    __asm__ volatile("" ::: "memory");     \
    _tile_loadd(t, base, stride);          \
  } while (0)
#define TW_TILE_STORE(t, base, stride) _tile_stored(t, base, stride)
#define TW_TILE_ZERO(t) _tile_zero(t)
#define TW_TILE_DP(c, a, b) _tile_dpbf16ps(c, a, b)

#else

struct EmulatedTiles {
  TileConfig config;
  alignas(64) std::uint8_t data[8][kRows][kRowBytes];
};

EmulatedTiles& emulated_tiles() {
  thread_local EmulatedTiles t;
  return t;
}

void load_config(const TileConfig& c) {
  EmulatedTiles& e = emulated_tiles();
  e.config = c;
  std::memset(e.data, 0, sizeof e.data);
}
void release_tiles() {}

#if defined(TW_BF16_DOT_TIMING)

// The timing object (towerflow_bench_ops_bf16_timing only): no tiles at all, so that the kernels
// time what they cost besides the tile instructions (docs/precision.md). The values are wrong.
void tile_load(int, const void*, std::int64_t) { __asm__ volatile("" ::: "memory"); }
void tile_store(int, void*, std::int64_t) { __asm__ volatile("" ::: "memory"); }
void tile_zero(int) {}
void tile_dp(int, int, int) {}

#else

// Rows beyond the configured ones, and bytes beyond a row's colsb, are zero (as tileloadd's).
void tile_load(int t, const void* base, std::int64_t stride) {
  EmulatedTiles& e = emulated_tiles();
  for (int r = 0; r < kRows; ++r) {
    std::memset(e.data[t][r], 0, kRowBytes);
    if (r < e.config.rows[t])
      std::memcpy(e.data[t][r], static_cast<const char*>(base) + r * stride, e.config.colsb[t]);
  }
}

void tile_store(int t, void* base, std::int64_t stride) {
  const EmulatedTiles& e = emulated_tiles();
  for (int r = 0; r < e.config.rows[t]; ++r)
    std::memcpy(static_cast<char*>(base) + r * stride, e.data[t][r], e.config.colsb[t]);
}

void tile_zero(int t) { std::memset(emulated_tiles().data[t], 0, sizeof emulated_tiles().data[t]); }

// tdpbf16ps: c[m][n] += a[m].pair(k).low * b[k].pair(n).low, then the high halves, for each
// pair k in order.
void tile_dp(int c, int a, int b) {
  EmulatedTiles& e = emulated_tiles();
  const __mmask16 lanes = static_cast<__mmask16>((1u << (e.config.colsb[c] / 4)) - 1);
  const int pairs = e.config.colsb[a] / 4;
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  for (int m = 0; m < e.config.rows[c]; ++m) {
    __m512 acc = _mm512_maskz_loadu_ps(lanes, e.data[c][m]);
    for (int k = 0; k < pairs; ++k) {
      std::uint32_t p;
      std::memcpy(&p, e.data[a][m] + 4 * k, 4);
      const __m512i bk = _mm512_maskz_loadu_epi32(lanes, e.data[b][k]);
      acc = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(p << 16))),
                            _mm512_castsi512_ps(_mm512_slli_epi32(bk, 16)), acc);
      acc = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(p & 0xffff0000u))),
                            _mm512_castsi512_ps(_mm512_and_si512(bk, high)), acc);
    }
    _mm512_mask_storeu_ps(e.data[c][m], lanes, acc);
  }
}

#endif  // TW_BF16_DOT_TIMING

#define TW_TILE_LOAD(t, base, stride) tile_load(t, base, stride)
#define TW_TILE_STORE(t, base, stride) tile_store(t, base, stride)
#define TW_TILE_ZERO(t) tile_zero(t)
#define TW_TILE_DP(c, a, b) tile_dp(c, a, b)

#endif

// This thread's tiles, configured for A rows of a_bytes, released at the end of the scope.
class TileScope {
 public:
  explicit TileScope(int a_bytes) { configure(a_bytes); }
  ~TileScope() { release_tiles(); }
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;
  void configure(int a_bytes) {
    if (a_bytes == a_bytes_) return;
    config_ = tile_config(a_bytes);
    load_config(config_);
    a_bytes_ = a_bytes;
  }

 private:
  TileConfig config_;
  int a_bytes_ = 0;
};

// ---- forward (and backward input) -----------------------------------------------------------

// The largest even divisor of q up to 32: the bf16 per chunk of a kernel row's q.
int chunk_of(int q) {
  for (int kc = 32; kc > 2; kc -= 2)
    if (q % kc == 0) return kc;
  return 2;
}

// The channels of a bf16 image row (c2 >= c, even) and the chunk of its kernel rows' q = kw * c2:
// c rounded up to 2, or to 16 where that would leave chunks under 16 of a q over 32.
struct Layout {
  int c2, kc;
};
Layout layout(int c, int kw) {
  int c2 = static_cast<int>(round_up(c, 2));
  if (kw * c2 > 32 && chunk_of(kw * c2) < 16) c2 = static_cast<int>(round_up(c, 16));
  return {c2, chunk_of(kw * c2)};
}

// One convolution's packed weights as the tiles read them.
struct ConvPlan {
  int kh;                 // kernel rows
  int chunks, kc;         // a kernel row's q: chunks of kc bf16
  std::int64_t row_step;  // bf16 from one kernel row's input to the next in the image
  const Pair* w;          // [block][kh][q pair][16], wblock pairs per block of 16 output channels
  std::int64_t wblock;
  int c_out;
  const float* bias;  // c_out values, or null
  bool add = false;   // outputs added to what the destination holds (no bias then)
};

// out [32 pixels][32 channels] = the C tiles of MA x 16 pixels and NB x 16 output channels. Pixel
// m reads kernel row i at a + m * unit + i * row_step (bf16); w are the first block's weights.
template <int MA, int NB>
void conv_block(const ConvPlan& p, const std::uint16_t* a, std::int64_t unit, const Pair* w, float* out) {
  TW_TILE_ZERO(0);
  if constexpr (NB == 2) TW_TILE_ZERO(1);
  if constexpr (MA == 2) TW_TILE_ZERO(2);
  if constexpr (MA == 2 && NB == 2) TW_TILE_ZERO(3);
  const std::int64_t a_stride = unit * 2, b_step = std::int64_t{p.kc} / 2 * kLanes;
  const std::uint16_t* a1 = a + kRows * unit;
  for (int i = 0; i < p.kh; ++i) {
    const std::uint16_t* r0 = a + i * p.row_step;
    const std::uint16_t* r1 = a1 + i * p.row_step;
    for (int u = 0; u < p.chunks; ++u, w += b_step) {
      TW_TILE_LOAD(4, r0 + u * p.kc, a_stride);
      if constexpr (MA == 2) TW_TILE_LOAD(5, r1 + u * p.kc, a_stride);
      TW_TILE_LOAD(6, w, kRowBytes);
      if constexpr (NB == 2) TW_TILE_LOAD(7, w + p.wblock, kRowBytes);
      TW_TILE_DP(0, 4, 6);
      if constexpr (NB == 2) TW_TILE_DP(1, 4, 7);
      if constexpr (MA == 2) TW_TILE_DP(2, 5, 6);
      if constexpr (MA == 2 && NB == 2) TW_TILE_DP(3, 5, 7);
    }
  }
  constexpr std::int64_t kLd = kBlock * sizeof(float);
  TW_TILE_STORE(0, out, kLd);
  if constexpr (NB == 2) TW_TILE_STORE(1, out + kLanes, kLd);
  if constexpr (MA == 2) TW_TILE_STORE(2, out + kRows * kBlock, kLd);
  if constexpr (MA == 2 && NB == 2) TW_TILE_STORE(3, out + kRows * kBlock + kLanes, kLd);
}

// Output pixels (y, x), y < rows and x < cols: kernel row 0 of pixel (y, x) reads the image at
// img + (y * wv + x) * unit bf16 (wv >= cols), and its c_out values go to out + y * out_row +
// x * out_col. Tiles run over y * wv + x; pixels with x >= cols are computed and dropped, and
// the image must be readable 31 pixels past the last one.
struct Grid {
  const std::uint16_t* img;
  int rows, cols;
  std::int64_t wv, unit;
  float* out;
  std::int64_t out_row, out_col;
};

void run_grid(const ConvPlan& p, const Grid& g) {
  const std::int64_t end = std::int64_t{g.rows - 1} * g.wv + g.cols;
  const int blocks = (p.c_out + kLanes - 1) / kLanes;
  alignas(64) float c[kBlock * kBlock];
  for (std::int64_t v0 = 0; v0 < end; v0 += kBlock) {
    const int pixels = static_cast<int>(std::min<std::int64_t>(kBlock, end - v0));
    const std::uint16_t* a = g.img + v0 * g.unit;
    if (p.add) {  // Note [Prefetching what a tile adds to]
      std::int64_t y = v0 / g.wv, x = v0 % g.wv;
      for (int m = 0; m < pixels; ++m, ++x) {
        if (x == g.wv) x = 0, ++y;
        if (x < g.cols) detail::prefetch_floats(g.out + y * g.out_row + x * g.out_col, p.c_out);
      }
    }
    for (int cb = 0; cb < blocks; cb += 2) {
      const Pair* w = p.w + cb * p.wblock;
      const bool two_a = pixels > kRows, two_b = blocks - cb > 1;
      if (two_a && two_b) conv_block<2, 2>(p, a, g.unit, w, c);
      else if (two_a) conv_block<2, 1>(p, a, g.unit, w, c);
      else if (two_b) conv_block<1, 2>(p, a, g.unit, w, c);
      else conv_block<1, 1>(p, a, g.unit, w, c);
      const int lanes = std::min(kBlock, p.c_out - cb * kLanes);
      std::int64_t y = v0 / g.wv, x = v0 % g.wv;
      for (int m = 0; m < pixels; ++m, ++x) {
        if (x == g.wv) x = 0, ++y;
        if (x >= g.cols) continue;
        float* dst = g.out + y * g.out_row + x * g.out_col + cb * kLanes;
        const float* src = c + m * kBlock;
        if (p.add) {
          for (int l = 0; l < lanes; ++l) dst[l] += src[l];
        } else if (p.bias) {
          const float* b = p.bias + cb * kLanes;
          for (int l = 0; l < lanes; ++l) dst[l] = src[l] + b[l];
        } else {
          std::copy(src, src + lanes, dst);
        }
      }
    }
  }
}

// Zeroed bf16 after an image, for the tiles that read past a grid's last pixel (run_grid): 32
// pixels of `unit` bf16 and a kernel row's q.
std::int64_t slack(std::int64_t unit, int kw, int c2) { return 32 * unit + std::int64_t{kw} * c2 + 32; }

// y = conv(x, w) (+ bias), or y += conv(x, w) with Store::kAdd (no bias), the weights read
// through get(co, ci, i, j). Pixels of x are ld_in values apart (floats, or bf16.h's bf16
// inputs), pixels of y ld_y apart; conv_input says which of them are converted. Threads split the
// output rows, as direct_conv does.
template <typename In, typename Get>
void amx_conv(const CpuContext& ctx, const Conv2dShape& conv, const In* x, std::int64_t ld_in,
              const float* bias, float* y, std::int64_t ld_y, Get get,
              detail::Store store = detail::Store::kOverwrite) {
  const ConvInput in = conv_input(conv, ld_in);
  const Conv2dShape& s = in.s;
  const Layout l = layout(s.c_in, s.kw);
  const int oh = s.out_h(), ow = s.out_w();
  const int blocks = (s.c_out + kLanes - 1) / kLanes;
  const std::int64_t wblock = std::int64_t{s.kh} * s.kw * (l.c2 / 2) * kLanes;
  Pair* wp = scratch_pairs(Scratch::kWeights, blocks * wblock);
  pack_weight_pairs(ctx, s.c_out, s.c_in, l.c2, s.kh, s.kw, kLanes, wp, get);
  const int hp = s.h + 2 * s.pad_h, wpad = s.w + 2 * s.pad_w;
  const std::int64_t row_step = std::int64_t{wpad} * l.c2, unit = std::int64_t{s.stride_w} * l.c2;
  const std::int64_t image = hp * row_step, extra = slack(unit, s.kw, l.c2);
  const bool flat = s.stride_h == 1 && s.stride_w == 1;
  const ConvPlan plan{.kh = s.kh, .chunks = s.kw * l.c2 / l.kc, .kc = l.kc, .row_step = row_step,
                      .w = wp, .wblock = wblock, .c_out = s.c_out, .bias = bias,
                      .add = store == detail::Store::kAdd};

  parallel_rows(ctx, s.n, oh, std::int64_t{ow} * s.c_out * s.kh * s.kw * s.c_in, [&](std::int64_t r0, std::int64_t r1) {
    auto* buf = reinterpret_cast<std::uint16_t*>(scratch_pairs(Scratch::kInput, (image + extra + 1) / 2));
    std::fill(buf + image, buf + image + extra, std::uint16_t{0});
    TileScope tiles(2 * l.kc);
    for_image_rows(r0, r1, oh, [&](std::int64_t n, int row_begin, int row_end) {
      // Only the padded input rows these output rows read.
      const InputRows rows = input_rows(s, row_begin, row_end);
      bf16_rows(x + n * in.ld_image, s.h, s.w, s.c_in, in.ld_x, l.c2, s.pad_h, s.pad_w, wpad,
                rows.first, rows.end, buf, in.ld_row);
      float* y_img = y + n * oh * ow * ld_y;
      if (flat) {
        run_grid(plan, {.img = buf + row_begin * row_step, .rows = row_end - row_begin, .cols = ow,
                        .wv = wpad, .unit = unit, .out = y_img + std::int64_t{row_begin} * ow * ld_y,
                        .out_row = ow * ld_y, .out_col = ld_y});
      } else {
        for (int row = row_begin; row < row_end; ++row)
          run_grid(plan, {.img = buf + std::int64_t{row} * s.stride_h * row_step, .rows = 1, .cols = ow,
                          .wv = ow, .unit = unit, .out = y_img + std::int64_t{row} * ow * ld_y,
                          .out_row = 0, .out_col = ld_y});
      }
    });
  });
}

// Backward input with stride > 1: per stride phase (Note [Backward input by stride phases]), a
// stride-1 convolution of the embedded dy with the phase's sub-kernel; dx written, or added to
// with Store::kAdd.
void amx_backward_input_phases(const CpuContext& ctx, const Conv2dShape& s, const float* dy,
                               const float* w, float* dx, detail::Store store) {
  const Layout l = layout(s.c_out, s.kw);
  const int half = l.c2 / 2, blocks = (s.c_in + kLanes - 1) / kLanes;
  const StridePhases g(s, std::int64_t{blocks} * kLanes * half);
  const std::int64_t row_step = std::int64_t{g.wp} * l.c2;
  Pair* wp = scratch_pairs(Scratch::kWeights, g.phase_offset.back());
  g.pack_phases(s, w, [&](std::int64_t offset, int ma, int mb, auto get) {
    pack_weight_pairs(ctx, s.c_in, s.c_out, l.c2, ma, mb, kLanes, wp + offset, get);
  });
  const std::int64_t image = g.hp * row_step, extra = slack(l.c2, s.kw, l.c2);
  const std::int64_t image_in = std::int64_t{s.h} * s.w * s.c_in;
  const std::int64_t image_out = std::int64_t{g.oh} * g.ow * s.c_out;
  const std::int64_t macs_per_row = std::int64_t{s.w} * s.c_in * s.c_out * s.kh * s.kw / (g.sh * g.sw);
  parallel_rows(ctx, s.n, s.h, macs_per_row, [&](std::int64_t r0, std::int64_t r1) {
    auto* buf = reinterpret_cast<std::uint16_t*>(scratch_pairs(Scratch::kInput, (image + extra + 1) / 2));
    std::fill(buf + image, buf + image + extra, std::uint16_t{0});
    TileScope tiles(2 * l.kc);
    for_image_rows(r0, r1, s.h, [&](std::int64_t n, int row_begin, int row_end) {
      bf16_rows(dy + n * image_out, g.oh, g.ow, s.c_out, s.c_out, l.c2, g.top, g.left, g.wp, 0, g.hp, buf);
      float* img_dx = dx + n * image_in;
      const detail::Store st = g.zero_rows_to_add(s, row_begin, row_end, store, img_dx);  // Note [Phases into zeroed rows]
      g.for_each_region(s, row_begin, row_end, st, img_dx, [&](int phase, const StridePhases::Region& p) {
        const int q = p.mb * l.c2, kc = chunk_of(q);
        tiles.configure(2 * kc);
        const ConvPlan plan{.kh = p.ma, .chunks = q / kc, .kc = kc, .row_step = row_step,
                            .w = wp + g.phase_offset[phase],
                            .wblock = std::int64_t{p.ma} * p.mb * half * kLanes, .c_out = s.c_in,
                            .bias = nullptr, .add = st == detail::Store::kAdd};
        run_grid(plan, {.img = buf + p.dy_row * row_step + p.dy_col * l.c2, .rows = p.rows,
                        .cols = p.cols, .wv = g.wp, .unit = l.c2,
                        .out = img_dx + (std::int64_t{p.ih0} * s.w + p.iw0) * s.c_in,
                        .out_row = std::int64_t{g.sh} * s.w * s.c_in, .out_col = std::int64_t{g.sw} * s.c_in});
      });
    });
  });
}

// ---- the weight gradient ---------------------------------------------------------------------

// The C tiles (MA x 16 rows) x (NB x 16 columns) at c (rows ld_c floats apart) += A (rows ld_a
// pairs apart; the second tile 16 rows further) times B (rows ld_b pairs apart; the second tile
// 16 columns further), over `chunks` chunks of 16 pairs: chunk u of A is 16 pairs further along
// its rows, of B 16 rows further.
template <int MA, int NB>
void weight_block(const Pair* a, std::int64_t ld_a, const Pair* b, std::int64_t ld_b, int chunks,
                  float* c, std::int64_t ld_c) {
  const std::int64_t sc = ld_c * 4, sa = ld_a * 4, sb = ld_b * 4;
  TW_TILE_LOAD(0, c, sc);
  if constexpr (NB == 2) TW_TILE_LOAD(1, c + kLanes, sc);
  if constexpr (MA == 2) TW_TILE_LOAD(2, c + kRows * ld_c, sc);
  if constexpr (MA == 2 && NB == 2) TW_TILE_LOAD(3, c + kRows * ld_c + kLanes, sc);
  for (int u = 0; u < chunks; ++u) {
    TW_TILE_LOAD(4, a + u * kLanes, sa);
    if constexpr (MA == 2) TW_TILE_LOAD(5, a + kRows * ld_a + u * kLanes, sa);
    TW_TILE_LOAD(6, b + u * kRows * ld_b, sb);
    if constexpr (NB == 2) TW_TILE_LOAD(7, b + u * kRows * ld_b + kLanes, sb);
    TW_TILE_DP(0, 4, 6);
    if constexpr (NB == 2) TW_TILE_DP(1, 4, 7);
    if constexpr (MA == 2) TW_TILE_DP(2, 5, 6);
    if constexpr (MA == 2 && NB == 2) TW_TILE_DP(3, 5, 7);
  }
  TW_TILE_STORE(0, c, sc);
  if constexpr (NB == 2) TW_TILE_STORE(1, c + kLanes, sc);
  if constexpr (MA == 2) TW_TILE_STORE(2, c + kRows * ld_c, sc);
  if constexpr (MA == 2 && NB == 2) TW_TILE_STORE(3, c + kRows * ld_c + kLanes, sc);
}

// m[c] lane r = m[r] lane c before: a 16 x 16 transpose of dwords in 64 shuffles (unpacking
// dwords, then quadwords, within 128-bit lanes, then exchanging the lanes twice).
inline void transpose16(__m512i m[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(m[2 * i], m[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(m[2 * i], m[2 * i + 1]);
  }
  // m[4i + j], 128-bit lane l: column 4l + j of rows 4i .. 4i + 3.
  for (int i = 0; i < 4; ++i) {
    m[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    m[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    m[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    m[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    const __m512i even_lo = _mm512_shuffle_i32x4(m[j], m[4 + j], 0x88);   // lanes 0, 2 of rows 0-7
    const __m512i odd_lo = _mm512_shuffle_i32x4(m[j], m[4 + j], 0xdd);    // lanes 1, 3
    const __m512i even_hi = _mm512_shuffle_i32x4(m[8 + j], m[12 + j], 0x88);
    const __m512i odd_hi = _mm512_shuffle_i32x4(m[8 + j], m[12 + j], 0xdd);
    t[j] = _mm512_shuffle_i32x4(even_lo, even_hi, 0x88);       // column j
    t[8 + j] = _mm512_shuffle_i32x4(even_lo, even_hi, 0xdd);   // column 8 + j
    t[4 + j] = _mm512_shuffle_i32x4(odd_lo, odd_hi, 0x88);     // column 4 + j
    t[12 + j] = _mm512_shuffle_i32x4(odd_lo, odd_hi, 0xdd);    // column 12 + j
  }
  for (int i = 0; i < 16; ++i) m[i] = t[i];
}

// The dy of one pixel pair: c_out floats each, null for a zero pixel (past the image or the pass).
struct PixelPair {
  const float* low = nullptr;
  const float* high = nullptr;
};

// dyt[co][k] = the pair (dy low, dy high) of pair(k) at output channel co, for k < padded (a
// multiple of 16) and co < c_out; rows ld_pairs apart. Blocks of 16 pairs by 16 channels are
// loaded by pixel, rounded 16 at a time and transposed in registers.
template <typename PairOf>
void transpose_dy_pairs(int c_out, int padded, std::int64_t ld_pairs, Pair* dyt, PairOf pair_of) {
  for (int k0 = 0; k0 < padded; k0 += kLanes)
    for (int c0 = 0; c0 < c_out; c0 += kLanes) {
      const __mmask16 channels = first_lanes(c_out - c0);
      __m512i m[kLanes];
      for (int k = 0; k < kLanes; ++k) {
        const PixelPair p = pair_of(k0 + k);
        m[k] = _mm512_setzero_si512();
        if (!p.low) continue;
        const __m512i lo = rounded_bits16(_mm512_maskz_loadu_epi32(channels, p.low + c0));
        const __m512i hi =
            p.high ? rounded_bits16(_mm512_maskz_loadu_epi32(channels, p.high + c0)) : _mm512_setzero_si512();
        m[k] = _mm512_or_si512(_mm512_srli_epi32(lo, 16), hi);
      }
      transpose16(m);
      for (int c = 0; c < std::min(kLanes, c_out - c0); ++c)
        _mm512_storeu_si512(dyt + std::int64_t{c0 + c} * ld_pairs + k0, m[c]);
    }
}

// dw (OIHW) from the padded weight gradient dwp [kh][co_pad][q_pad], q = (kernel column, channel).
void unpack_padded_weight_grad(const Conv2dShape& s, const float* dwp, int co_pad, int q_pad, float* dw) {
  for (int co = 0; co < s.c_out; ++co)
    for (int ci = 0; ci < s.c_in; ++ci)
      for (int i = 0; i < s.kh; ++i)
        for (int j = 0; j < s.kw; ++j)
          dw[((std::int64_t{co} * s.c_in + ci) * s.kh + i) * s.kw + j] =
              dwp[(std::int64_t{i} * co_pad + co) * q_pad + std::int64_t{j} * s.c_in + ci];
}

// dw = correlate(x, dy), built in dwp [kh][co_pad][q_pad]: per kernel row, C = 16 output channels
// x 16 of q; A = dy transposed [output channel][pixel pair], packed once per pass; B = x in pixel
// pairs [pair][q], as the pair kernels pack it. A tile of B reads on past q_len into the next row
// (its columns there are dropped), so the packed x has 16 pairs of slack.
template <typename In>
void amx_weight_grad(const CpuContext& ctx, const Conv2dShape& s, const In* x, const float* dy,
                     float* dw) {
  const int oh = s.out_h(), ow = s.out_w();
  const int co_tiles = (s.c_out + kRows - 1) / kRows, co_pad = co_tiles * kRows;
  const int q_len = s.kw * s.c_in, q_tiles = (q_len + kLanes - 1) / kLanes, q_pad = q_tiles * kLanes;
  const std::int64_t dw_size = std::int64_t{s.kh} * co_pad * q_pad;
  float* dwp = zeroed_scratch(Scratch::kWeights, dw_size);

  const std::int64_t row_step = std::int64_t{s.w + 2 * s.pad_w} * s.c_in;
  const std::int64_t image_in = std::int64_t{s.h} * s.w * s.c_in;
  const std::int64_t image_out = std::int64_t{oh} * ow;
  // Passes of up to 128 pixels: 4 chunks of 16 pairs, whose packed pairs stay in cache across the
  // tiles that share them.
  const int rows_per_pass = std::max(1, std::min(oh, 128 / ow));
  const std::int64_t ld_pairs = round_up((std::int64_t{rows_per_pass} * ow + 1) / 2, kLanes);
  // Rows of packed x, and 16 more: the last kernel row's tiles read up to 15 rows past its
  // pairs when they share a packing (zeroed), and a tile of a partial q tile 16 pairs past a row.
  const std::int64_t x_rows = pass_pair_rows(s, rows_per_pass * ow, ld_pairs);
  const std::int64_t x_pairs = (x_rows + kLanes) * q_len + kLanes;
  const int co_groups = (co_tiles + 1) / 2, q_groups = (q_tiles + 1) / 2;
  const std::int64_t tiles = std::int64_t{co_groups} * s.kh * q_groups;

  auto accumulate = [&](int n0, int n1, std::int64_t t0, std::int64_t t1, float* dst) {
    In* xbuf = reinterpret_cast<In*>(padded_image_buffer(s));
    // dy transposed [co_pad][ld_pairs]: the rows past c_out stay zero.
    Pair* dyt = scratch_pairs(Scratch::kOutput, co_pad * ld_pairs);
    std::fill(dyt, dyt + co_pad * ld_pairs, Pair{0});
    // x [pair][q_len] per kernel row, and the slack.
    Pair* xp = scratch_pairs(Scratch::kPacked, x_pairs);
    std::fill(xp, xp + x_pairs, Pair{0});
    TileScope tile_scope(kRowBytes);
    for (int n = n0; n < n1; ++n) {
      const In* img = padded_image(s, x + n * image_in, xbuf);
      const float* dimg = dy + n * image_out * s.c_out;
      for (int r0 = 0; r0 < oh; r0 += rows_per_pass) {
        const int pixels = std::min(rows_per_pass, oh - r0) * ow;
        const int pairs = (pixels + 1) / 2, chunks = (pairs + kLanes - 1) / kLanes;
        const int padded = chunks * kLanes;
        // dy: pixels 2k and 2k + 1 of the pass (the last one alone when odd) in column k, zero
        // from column `pairs` to `padded`: blocks of 16 pairs by 16 output channels, loaded by
        // pixel and transposed in registers.
        const float* dpass = dimg + std::int64_t{r0} * ow * s.c_out;
        transpose_dy_pairs(s.c_out, padded, ld_pairs, dyt, [&](int k) {
          const float* low = dpass + std::int64_t{2 * k} * s.c_out;
          return PixelPair{k < pairs ? low : nullptr, 2 * k + 1 < pixels ? low + s.c_out : nullptr};
        });
        // x [pair][q] per kernel row (Note [Weight-gradient passes in pixel pairs]); the rows
        // past a kernel row's pairs that its last chunk reads hold finite values (the next
        // kernel row's, or zeros), which meet dy's zero columns.
        const std::int64_t kernel_row_step = pack_pass_pairs(s, img, row_step, r0, pixels, ld_pairs, xp);
        if (shared_kernel_rows(s)) {
          const std::int64_t end = (pixels + std::int64_t{s.kh - 1} * ow) / 2 * q_len;
          std::fill(xp + end, xp + end + kLanes * q_len, Pair{0});
        } else {
          for (int i = 0; i < s.kh; ++i)
            std::fill(xp + (i * ld_pairs + pairs) * q_len, xp + (i * ld_pairs + padded) * q_len, Pair{0});
        }
        for (std::int64_t t = t0; t < t1; ++t) {
          const int cg = static_cast<int>(t / (std::int64_t{s.kh} * q_groups));
          const int i = static_cast<int>(t / q_groups % s.kh);
          const int qg = static_cast<int>(t % q_groups);
          const Pair* a = dyt + cg * kBlock * ld_pairs;
          const Pair* b = xp + i * kernel_row_step * q_len + qg * kBlock;
          float* c = dst + (std::int64_t{i} * co_pad + cg * kBlock) * q_pad + qg * kBlock;
          const bool two_a = co_tiles - 2 * cg > 1, two_b = q_tiles - 2 * qg > 1;
          if (two_a && two_b) weight_block<2, 2>(a, ld_pairs, b, q_len, chunks, c, q_pad);
          else if (two_a) weight_block<2, 1>(a, ld_pairs, b, q_len, chunks, c, q_pad);
          else if (two_b) weight_block<1, 2>(a, ld_pairs, b, q_len, chunks, c, q_pad);
          else weight_block<1, 1>(a, ld_pairs, b, q_len, chunks, c, q_pad);
        }
      }
    }
  };

  const std::int64_t macs_per_tile = std::int64_t{s.n} * image_out * kBlock * kBlock;
  sum_weight_grad(ctx, s.n, tiles, std::max<std::int64_t>(1, 200000 / macs_per_tile), dw_size, dwp,
                  accumulate);

  unpack_padded_weight_grad(s, dwp, co_pad, q_pad, dw);
}

// ---- the weight gradient over rows of column pairs -------------------------------------------

// Note [AMX weight gradient over column pairs]
// amx_weight_grad packs x in pixel pairs once per kernel column, kw times over, and that packing
// is most of what it costs besides the tiles (docs/precision.md). At stride 1, with the input
// channels in sixteens, the products run instead over virtual pixel pairs: every output row is
// taken kx pairs wide, kx = ceil(ow / 2) + (kw - 1) / 2, and dy is zero at the virtual pixels
// past ow. x is packed once per image in pairs of columns of the padded input, at both parities:
// xe[row][k] = (x at 2k, x at 2k + 1), xo[row][k] = (x at 2k + 1, x at 2k + 2), zero outside.
// Tap (i, j) of virtual pair k of output row r reads pair k + j / 2 of input row r + i, from xe
// where j is even and xo where it is odd. Rows of x are kx pairs long, so 16 consecutive virtual
// pairs are one stride apart across output rows and a B tile is a plain load; the pairs past a
// row's real pixels read on into the next row, where dy is zero. C tiles hold 16 output channels
// by 16 input channels of one tap, in the layout of amx_weight_grad.

// Whether amx_weight_grad_rows handles s.
bool weight_rows_apply(const Conv2dShape& s) {
  return s.stride_h == 1 && s.stride_w == 1 && s.c_in % kLanes == 0;
}

template <typename In>
void amx_weight_grad_rows(const CpuContext& ctx, const Conv2dShape& s, const In* x, const float* dy,
                          float* dw) {
  const int oh = s.out_h(), ow = s.out_w(), hp = s.h + 2 * s.pad_h;
  const int kx = (ow + 1) / 2 + (s.kw - 1) / 2;
  const int co_tiles = (s.c_out + kRows - 1) / kRows, co_pad = co_tiles * kRows;
  const int c_tiles = s.c_in / kLanes, c_groups = (c_tiles + 1) / 2;
  const int q_pad = s.kw * s.c_in;
  const std::int64_t dw_size = std::int64_t{s.kh} * co_pad * q_pad;
  float* dwp = zeroed_scratch(Scratch::kWeights, dw_size);

  const std::int64_t image_in = std::int64_t{s.h} * s.w * s.c_in;
  const std::int64_t image_out = std::int64_t{oh} * ow * s.c_out;
  // Passes of about 128 virtual pairs; a B tile reads up to 15 + (kw - 1) / 2 pairs past a
  // pass, into the next rows or the zeroed slack.
  const int rows_per_pass = std::max(1, std::min(oh, 128 / kx));
  const std::int64_t ld_pairs = round_up(std::int64_t{rows_per_pass} * kx, kLanes);
  const std::int64_t x_pairs = (std::int64_t{hp} * kx + kLanes + s.kw) * s.c_in;
  const int co_groups = (co_tiles + 1) / 2;
  const std::int64_t tiles = std::int64_t{co_groups} * s.kh * s.kw * c_groups;

  auto accumulate = [&](int n0, int n1, std::int64_t t0, std::int64_t t1, float* dst) {
    Pair* dyt = scratch_pairs(Scratch::kOutput, co_pad * ld_pairs);
    std::fill(dyt, dyt + co_pad * ld_pairs, Pair{0});
    Pair* xe = scratch_pairs(Scratch::kPacked, 2 * x_pairs);
    Pair* xo = xe + x_pairs;
    std::fill(xe, xe + 2 * x_pairs, Pair{0});
    TileScope tile_scope(kRowBytes);
    for (int n = n0; n < n1; ++n) {
      pack_column_pairs(s, x + n * image_in, kx, std::int64_t{kx} * s.c_in, xe);
      pack_column_pairs(s, x + n * image_in, kx, std::int64_t{kx} * s.c_in, xo, 1);
      const float* dimg = dy + n * image_out;
      for (int r0 = 0; r0 < oh; r0 += rows_per_pass) {
        const int rows = std::min(rows_per_pass, oh - r0);
        const int pairs = rows * kx, chunks = (pairs + kLanes - 1) / kLanes;
        const int padded = chunks * kLanes;
        // dy transposed: virtual pair t = (output row r0 + t / kx, pixels 2(t % kx) and one
        // more), zero past ow and past the pass; 16 pairs by 16 channels at a time.
        transpose_dy_pairs(s.c_out, padded, ld_pairs, dyt, [&](int t) {
          const int r = t / kx, k = t % kx;
          if (t >= pairs || 2 * k >= ow) return PixelPair{};
          const float* low = dimg + (std::int64_t{r0 + r} * ow + 2 * k) * s.c_out;
          return PixelPair{low, 2 * k + 1 < ow ? low + s.c_out : nullptr};
        });
        for (std::int64_t t = t0; t < t1; ++t) {
          const int cg = static_cast<int>(t / (std::int64_t{s.kh} * s.kw * c_groups));
          const int i = static_cast<int>(t / (std::int64_t{s.kw} * c_groups) % s.kh);
          const int j = static_cast<int>(t / c_groups % s.kw);
          const int g = static_cast<int>(t % c_groups);
          const Pair* a = dyt + std::int64_t{cg} * kBlock * ld_pairs;
          const Pair* b = (j % 2 ? xo : xe) + (std::int64_t{r0 + i} * kx + j / 2) * s.c_in + g * kBlock;
          float* c = dst + (std::int64_t{i} * co_pad + cg * kBlock) * q_pad + j * s.c_in + g * kBlock;
          const bool two_a = co_tiles - 2 * cg > 1, two_b = c_tiles - 2 * g > 1;
          if (two_a && two_b) weight_block<2, 2>(a, ld_pairs, b, s.c_in, chunks, c, q_pad);
          else if (two_a) weight_block<2, 1>(a, ld_pairs, b, s.c_in, chunks, c, q_pad);
          else if (two_b) weight_block<1, 2>(a, ld_pairs, b, s.c_in, chunks, c, q_pad);
          else weight_block<1, 1>(a, ld_pairs, b, s.c_in, chunks, c, q_pad);
        }
      }
    }
  };

  const std::int64_t macs_per_tile = std::int64_t{s.n} * oh * ow * kBlock * kBlock;
  sum_weight_grad(ctx, s.n, tiles, std::max<std::int64_t>(1, 200000 / macs_per_tile), dw_size, dwp,
                  accumulate);

  unpack_padded_weight_grad(s, dwp, co_pad, q_pad, dw);
}

// ---- the kernels of the table --------------------------------------------------------------

// This object's drivers, for detail::Bf16Table.
struct AmxDrivers {
  template <typename In, typename Get>
  static void conv(const CpuContext& ctx, const Conv2dShape& s, const In* x, std::int64_t ld_x,
                   const float* bias, float* y, std::int64_t ld_y, Get get) {
    amx_conv(ctx, s, x, ld_x, bias, y, ld_y, get);
  }
  static void backward_input_phases(const CpuContext& ctx, const Conv2dShape& s, const float* dy,
                                    const float* w, float* dx) {
    amx_backward_input_phases(ctx, s, dy, w, dx, detail::Store::kOverwrite);
  }
  template <typename In>
  static void backward_weight(const CpuContext& ctx, const Conv2dShape& s, const In* x, const float* dy,
                              float* dw) {
    if (weight_rows_apply(s)) return amx_weight_grad_rows(ctx, s, x, dy, dw);
    amx_weight_grad(ctx, s, x, dy, dw);
  }
  // No weight gradient through dy's rows, and no Winograd kernels, on AMX tiles.
  static bool backward_weight_dy_rows(const CpuContext&, const Conv2dShape&, const float*, const DyRows&, float*) {
    return false;
  }
  template <typename In>
  static bool winograd_backward_weight(const CpuContext&, const Conv2dShape&, const In*, const float*, float*) {
    return false;
  }
  template <typename In, typename Out, typename Get>
  static bool winograd_conv(const CpuContext&, const Conv2dShape&, const In*, const float*, Out*, Get) {
    return false;
  }
  // dx += the backward input, added as the tiles' results are copied out.
  static bool backward_input_add(const CpuContext& ctx, const Conv2dShape& s, const float* dy, const float* w,
                                 float* dx) {
    const bool as_forward = detail::backward_input_as_forward(
        s, dy, w, dx, [&](const Conv2dShape& t, const float* in, std::int64_t ld_in, const float*, float* out,
                          std::int64_t ld_out, detail::StridedWeights get) {
          amx_conv(ctx, t, in, ld_in, nullptr, out, ld_out, get, detail::Store::kAdd);
        });
    if (!as_forward) amx_backward_input_phases(ctx, s, dy, w, dx, detail::Store::kAdd);
    return true;
  }
  // No Winograd kernels on AMX tiles.
  static bool winograd_backward_input_add(const CpuContext&, const Conv2dShape&, const float*, const float*,
                                          float*) {
    return false;
  }
};

}  // namespace
}  // namespace towerflow::cpu::TW_ISA

extern "C" const towerflow::cpu::Bf16KernelTable TW_KERNEL_TABLE_NAME(towerflow_bf16_) =
    towerflow::cpu::TW_ISA::detail::Bf16Table<towerflow::cpu::TW_ISA::AmxDrivers>::kTable;
