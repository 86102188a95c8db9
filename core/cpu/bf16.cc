#include "core/cpu/bf16.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string_view>
#include <vector>

#include "core/cpu/bf16_bits.h"
#include "core/cpu/bf16_amx.h"
#include "core/cpu/bf16_pairs.h"
#include "core/cpu/gemm.h"
#include "core/cpu/isa.h"
#include "core/cpu/onednn_impl.h"
#include "core/error.h"

// Note [bf16 kernels]
// Where the CPU multiplies bf16 in hardware (AVX512-BF16's vdpbf16ps, AMX tiles), oneDNN's JIT
// kernels read bf16 operands at twice (AVX512-BF16) or many times (AMX) the fp32 rate, so they are
// the automatic choice there. Without those instructions there are two ways to get bf16 products
// with fp32 accumulation: oneDNN's JIT kernels emulate the bf16 instructions with AVX-512 integer
// shuffles, or our fp32 kernels run on operands rounded to bf16 (the emulated path). Measured on a
// 2-core Intel Xeon @ 2.80GHz (Ice Lake-SP, AVX-512 without BF16), one thread, ResNet-20's layer
// shapes at batch 64: oneDNN's bf16 convolutions ran at 17-41 GFLOP/s against 36-153 for oneDNN's
// fp32 ones (2-4x slower), while the emulated path costs one rounding pass over each operand
// (ResNet-20 trains at 0.90x fp32: docs/precision.md, "Measured"). So the emulated path is the
// automatic choice without bf16 instructions, and TOWERFLOW_BF16_KERNELS=onednn can still ask for
// oneDNN's kernels there (so that they are tested on every AVX-512 machine).
//
// towerflow's own kernels run where the CPU has the instructions: on AMX tiles (amx, Note [bf16
// AMX kernels] in bf16_amx.cc) and on vdpbf16ps (avx512bf16, Note [bf16 pair kernels] in
// bf16_pairs.cc). oneDNN stays the fixed choice there: on a 2-core Sapphire Rapids-class Xeon,
// towerflow's AMX kernels as the whole process's ran ResNet-20's bf16 step at 1.03-1.13x oneDNN's
// in two alternating rounds (`towerflow_bench_train --model resnet20 --precision bf16
// --kernel_choice fixed`, TOWERFLOW_BF16_KERNELS=amx against =onednn), within noise of a choice,
// and the per-problem kernel choice (kernel_choice.h) takes whichever is faster for each layer.
// towerflow's are chosen automatically by a build without oneDNN (AMX first). Their twins with
// the instructions emulated (amx-emulated, avx512bf16-emulated) run their packing and tiling on
// any AVX-512 CPU, for the tests.

namespace towerflow::cpu {
namespace {

using detail::bf16_bits;

std::mutex g_mu;
std::optional<Bf16Kernels> g_forced;

struct Choice {
  Bf16Kernels kernels;
  std::string why;
};

void require_onednn(std::string_view asked_by) {
  if (!onednn::built())
    raise<DeviceError>(asked_by, " asks for oneDNN's bf16 kernels, but this build has no oneDNN; "
                       "install libdnnl-dev and rebuild (-DTOWERFLOW_ONEDNN=ON), or use emulated");
  if (!onednn::jit_bf16())
    raise<DeviceError>(asked_by, " asks for oneDNN's bf16 kernels, but oneDNN has only reference "
                       "bf16 kernels for this CPU (its instruction set: ", onednn::isa(),
                       "; bf16 needs AVX-512); use emulated or auto");
}

bool pairs_built() {
#if defined(TW_HAVE_BF16_PAIRS)
  return true;
#else
  return false;
#endif
}

bool avx512_supported() {
  const std::vector<Isa> isas = supported_isas();
  return std::find(isas.begin(), isas.end(), Isa::Avx512) != isas.end();
}

void require_pairs(std::string_view asked_by, bool emulated_instruction) {
  if (!pairs_built())
    raise<DeviceError>(asked_by, " asks for towerflow's AVX512-BF16 kernels, but this build has "
                       "none (they need an x86-64 build with a compiler that knows -mavx512bf16); "
                       "use auto or emulated");
  if (!avx512_supported())
    raise<DeviceError>(asked_by, " asks for towerflow's AVX512-BF16 kernels, but this CPU has no "
                       "AVX-512 (its features: ", cpu_features(), "); use auto or emulated");
  if (!emulated_instruction && !cpu_has_avx512_bf16())
    raise<DeviceError>(asked_by, " asks for towerflow's AVX512-BF16 kernels, but this CPU has no "
                       "AVX512-BF16 (its features: ", cpu_features(), "); use auto, emulated, or "
                       "avx512bf16-emulated to run them with the instruction emulated (slower)");
}

bool amx_built() {
#if defined(TW_HAVE_BF16_AMX)
  return true;
#else
  return false;
#endif
}

void require_amx(std::string_view asked_by, bool emulated_instruction) {
  if (!amx_built())
    raise<DeviceError>(asked_by, " asks for towerflow's AMX kernels, but this build has none (they "
                       "need an x86-64 build with a compiler that knows -mamx-bf16); use auto or emulated");
  if (!avx512_supported())
    raise<DeviceError>(asked_by, " asks for towerflow's AMX kernels, but this CPU has no AVX-512 "
                       "(its features: ", cpu_features(), "); use auto or emulated");
  if (!emulated_instruction && !cpu_has_amx_bf16())
    raise<DeviceError>(asked_by, " asks for towerflow's AMX kernels, but ", amx_unavailable(),
                       " (CPU features: ", cpu_features(), "); use auto, emulated, or amx-emulated "
                       "to run them with the tiles emulated (slower)");
}

// Checks that this build and CPU can run k, naming asked_by in the error.
void require(Bf16Kernels k, std::string_view asked_by) {
  switch (k) {
    case Bf16Kernels::OneDnn:
      return require_onednn(asked_by);
    case Bf16Kernels::Avx512Bf16:
    case Bf16Kernels::Avx512Bf16Emulated:
      return require_pairs(asked_by, k == Bf16Kernels::Avx512Bf16Emulated);
    case Bf16Kernels::Amx:
    case Bf16Kernels::AmxEmulated:
      return require_amx(asked_by, k == Bf16Kernels::AmxEmulated);
    case Bf16Kernels::Emulated:
      return;
  }
}

constexpr Bf16Kernels kAllKernels[] = {Bf16Kernels::Emulated, Bf16Kernels::OneDnn,
                                       Bf16Kernels::Amx, Bf16Kernels::AmxEmulated,
                                       Bf16Kernels::Avx512Bf16, Bf16Kernels::Avx512Bf16Emulated};

// Why the automatic choice is the emulated path, for the start-up block: a CPU with AVX512-BF16
// can end there too (the CPU kernels held below avx512, a build without the kernels).
std::string why_emulated() {
  if (!cpu_has_avx512_bf16() && !cpu_has_amx_bf16())
    return onednn::built() ? "this CPU has no AVX512-BF16 or AMX" : "this build has no oneDNN";
  if (active_isa() != Isa::Avx512)
    return std::string("towerflow's bf16 kernels need the avx512 CPU kernels, which run ") +
           isa_name(active_isa()) + " here";
  return "oneDNN has no JIT bf16 kernels here and this build has none of towerflow's";
}

Choice choose() {
  if (const char* env = std::getenv("TOWERFLOW_BF16_KERNELS"); env && *env) {
    const std::string_view v(env);
    for (const Bf16Kernels k : kAllKernels)
      if (v == bf16_kernels_name(k)) {
        const std::string asked = "TOWERFLOW_BF16_KERNELS=" + std::string(v);
        require(k, asked);
        return {k, asked};
      }
    if (v != "auto")
      raise<InvalidArgument>("TOWERFLOW_BF16_KERNELS='", v, "' is not a choice; use auto, onednn, "
                             "amx, amx-emulated, avx512bf16, avx512bf16-emulated or emulated (or "
                             "unset it)");
  }
  if (onednn::built() && onednn::native_bf16()) return {Bf16Kernels::OneDnn, "the best this CPU has"};
  if (amx_built() && cpu_has_amx_bf16() && active_isa() == Isa::Avx512)
    return {Bf16Kernels::Amx, "the best this build has for this CPU"};
  if (pairs_built() && cpu_has_avx512_bf16() && active_isa() == Isa::Avx512)
    return {Bf16Kernels::Avx512Bf16, "the best this build has for this CPU"};
  return {Bf16Kernels::Emulated, why_emulated()};
}

const Choice& choice_locked() {
  static const Choice c = choose();
  return c;
}

// ---- the emulated path: the fp32 kernels on rounded copies ---------------------------------

// x rounded into one of this thread's two scratch buffers.
const float* rounded(const CpuContext& ctx, const float* x, std::int64_t n, int slot) {
  thread_local std::vector<float> scratch[2];
  std::vector<float>& buf = scratch[slot];
  if (static_cast<std::int64_t>(buf.size()) < n) buf.resize(static_cast<std::size_t>(n));
  float* out = buf.data();
  ctx.parallel_for(n, 1 << 14, [&](std::int64_t b, std::int64_t e) {
    round_to_bf16(e - b, x + b, out + b);
  });
  return out;
}

// x (bf16 bits) widened into this thread's third scratch buffer: what `rounded` would give for
// the floats they came from.
const float* widened(const CpuContext& ctx, const std::uint16_t* x, std::int64_t n) {
  thread_local std::vector<float> scratch;
  if (static_cast<std::int64_t>(scratch.size()) < n) scratch.resize(static_cast<std::size_t>(n));
  float* out = scratch.data();
  ctx.parallel_for(n, 1 << 14, [&](std::int64_t b, std::int64_t e) {
    widen_bf16(e - b, x + b, out + b);
  });
  return out;
}

// y (bf16 bits) from the forward's fp32 result: fn(buffer) writes it into this thread's fourth
// scratch buffer, which is then rounded into y (bf16.h's bf16 outputs). fn's result is returned,
// and y written only where it is true.
template <typename Fn>
bool narrowed(const CpuContext& ctx, std::int64_t n, std::uint16_t* y, Fn fn) {
  thread_local std::vector<float> scratch;
  if (static_cast<std::int64_t>(scratch.size()) < n) scratch.resize(static_cast<std::size_t>(n));
  float* out = scratch.data();
  if (!fn(out)) return false;
  ctx.parallel_for(n, 1 << 14, [&](std::int64_t b, std::int64_t e) { narrow_to_bf16(e - b, out + b, y + b); });
  return true;
}

std::int64_t x_size(const Conv2dShape& s) { return std::int64_t(s.n) * s.h * s.w * s.c_in; }
std::int64_t w_size(const Conv2dShape& s) { return std::int64_t(s.c_out) * s.c_in * s.kh * s.kw; }
std::int64_t y_size(const Conv2dShape& s) {
  return std::int64_t(s.n) * s.out_h() * s.out_w() * s.c_out;
}

// towerflow's own kernels k (pairs or AMX), or null.
const Bf16KernelTable* own_kernels(Bf16Kernels k) {
  switch (k) {
#if defined(TW_HAVE_BF16_PAIRS)
    case Bf16Kernels::Avx512Bf16:
      return &towerflow_bf16_pairs_avx512bf16;
    case Bf16Kernels::Avx512Bf16Emulated:
      return &towerflow_bf16_pairs_avx512bf16_emulated;
#endif
#if defined(TW_HAVE_BF16_AMX)
    case Bf16Kernels::Amx:
      return &towerflow_bf16_amx;
    case Bf16Kernels::AmxEmulated:
      return &towerflow_bf16_amx_emulated;
#endif
    default:
      return nullptr;
  }
}

// f(the table of k) where k is one of towerflow's own kernel objects (pairs or AMX), s checked
// first; false elsewhere.
template <typename F>
bool on_own_kernels(Bf16Kernels k, const Conv2dShape& s, F&& f) {
  s.validate();
  const Bf16KernelTable* p = own_kernels(k);
  return p && f(*p);
}

}  // namespace

float round_to_bf16(float x) {
  return std::bit_cast<float>(bf16_bits(std::bit_cast<std::uint32_t>(x)));
}

void round_to_bf16(std::int64_t n, const float* x, float* y) {
  for (std::int64_t i = 0; i < n; ++i)
    y[i] = std::bit_cast<float>(bf16_bits(std::bit_cast<std::uint32_t>(x[i])));
}

void narrow_to_bf16(std::int64_t n, const float* x, std::uint16_t* y) {
  for (std::int64_t i = 0; i < n; ++i)
    y[i] = static_cast<std::uint16_t>(bf16_bits(std::bit_cast<std::uint32_t>(x[i])) >> 16);
}

void widen_bf16(std::int64_t n, const std::uint16_t* x, float* y) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = std::bit_cast<float>(std::uint32_t{x[i]} << 16);
}

const char* bf16_kernels_name(Bf16Kernels k) {
  switch (k) {
    case Bf16Kernels::OneDnn:
      return "onednn";
    case Bf16Kernels::Avx512Bf16:
      return "avx512bf16";
    case Bf16Kernels::Avx512Bf16Emulated:
      return "avx512bf16-emulated";
    case Bf16Kernels::Amx:
      return "amx";
    case Bf16Kernels::AmxEmulated:
      return "amx-emulated";
    case Bf16Kernels::Emulated:
      break;
  }
  return "emulated";
}

bool bf16_products_in_kernels(Bf16Kernels k) { return k != Bf16Kernels::Emulated; }

std::vector<Bf16Kernels> built_bf16_kernels() {
  std::vector<Bf16Kernels> out{Bf16Kernels::Emulated};
  if (onednn::built()) out.push_back(Bf16Kernels::OneDnn);
  if (amx_built()) out.insert(out.end(), {Bf16Kernels::Amx, Bf16Kernels::AmxEmulated});
  if (pairs_built()) out.insert(out.end(), {Bf16Kernels::Avx512Bf16, Bf16Kernels::Avx512Bf16Emulated});
  return out;
}

Bf16Kernels active_bf16_kernels() {
  std::lock_guard lock(g_mu);
  return g_forced ? *g_forced : choice_locked().kernels;
}

std::string onednn_isa() { return onednn::built() ? onednn::isa() : ""; }

std::string describe_bf16_kernels() {
  std::lock_guard lock(g_mu);
  const Choice& c = choice_locked();
  const Bf16Kernels k = g_forced ? *g_forced : c.kernels;
  const std::string why = g_forced ? std::string("chosen by a test") : c.why;
  if (k == Bf16Kernels::Emulated)
    return "emulated (" + why + "): operands rounded to bf16 for the fp32 kernels, slower than fp32";
  if (k == Bf16Kernels::Avx512Bf16) return "towerflow's AVX512-BF16 kernels (vdpbf16ps; " + why + ")";
#if defined(TW_BF16_DOT_TIMING)
  if (k == Bf16Kernels::Avx512Bf16Emulated)
    return "towerflow's AVX512-BF16 kernels with vdpbf16ps timed as one FMA (" + why +
           "; the bf16 timing benchmark): for timing only, the values are wrong";
#endif
  if (k == Bf16Kernels::Avx512Bf16Emulated)
    return "towerflow's AVX512-BF16 kernels with vdpbf16ps emulated by AVX-512F FMAs (" + why +
           "): for testing, slower than fp32";
  if (k == Bf16Kernels::Amx) return "towerflow's AMX kernels (tdpbf16ps tiles; " + why + ")";
#if defined(TW_BF16_DOT_TIMING)
  if (k == Bf16Kernels::AmxEmulated)
    return "towerflow's AMX kernels without their tile instructions (" + why +
           "; the bf16 timing benchmark): for timing their cost besides the tiles only, the values are wrong";
#endif
  if (k == Bf16Kernels::AmxEmulated)
    return "towerflow's AMX kernels with the tiles emulated by AVX-512F FMAs (" + why +
           "): for testing, much slower than fp32";
  const std::string isa = onednn::isa();
  const std::string how = isa == "avx512_core_amx"    ? "AMX tiles"
                          : onednn::native_bf16()     ? "AVX512-BF16 vdpbf16ps"
                                                      : "bf16 emulated inside oneDNN, slower than fp32";
  return "oneDNN " + onednn::version() + ", " + isa + " (" + how + "; " + why + ")";
}

bool bf16_kernels_fixed() {
  std::lock_guard lock(g_mu);
  if (g_forced) return true;
  const char* env = std::getenv("TOWERFLOW_BF16_KERNELS");
  return env && *env && std::string_view(env) != "auto";
}

std::vector<Bf16Kernels> runnable_bf16_kernels() {
  std::vector<Bf16Kernels> out{Bf16Kernels::Emulated};
  if (onednn::built() && onednn::jit_bf16()) out.push_back(Bf16Kernels::OneDnn);
  const bool avx512 = active_isa() == Isa::Avx512;
  if (pairs_built() && avx512 && cpu_has_avx512_bf16()) out.push_back(Bf16Kernels::Avx512Bf16);
  if (amx_built() && avx512 && cpu_has_amx_bf16()) out.push_back(Bf16Kernels::Amx);
  return out;
}

void force_bf16_kernels_for_testing(std::optional<Bf16Kernels> k) {
  if (k) require(*k, "a test");
  std::lock_guard lock(g_mu);
  g_forced = k;
}

bool conv2d_forward_bf16_with(Bf16Kernels k, const CpuContext& ctx, const Conv2dShape& s,
                              const float* x, const float* w, const float* bias_or_null, float* y) {
  s.validate();
  if (k == Bf16Kernels::OneDnn) return onednn::conv2d_forward(ctx, s, x, w, bias_or_null, y);
  if (const Bf16KernelTable* p = own_kernels(k)) {
    p->conv2d_forward(ctx, s, x, w, bias_or_null, y);
    return true;
  }
  const float* xr = rounded(ctx, x, x_size(s), 0);
  const float* wr = rounded(ctx, w, w_size(s), 1);
  conv2d_forward_bias(ctx, s, xr, wr, bias_or_null, y);
  return true;
}

bool conv2d_backward_input_bf16_with(Bf16Kernels k, const CpuContext& ctx, const Conv2dShape& s,
                                     const float* dy, const float* w, float* dx) {
  s.validate();
  if (k == Bf16Kernels::OneDnn) return onednn::conv2d_backward_input(ctx, s, dy, w, dx);
  if (const Bf16KernelTable* p = own_kernels(k)) {
    p->conv2d_backward_input(ctx, s, dy, w, dx);
    return true;
  }
  const float* dyr = rounded(ctx, dy, y_size(s), 0);
  const float* wr = rounded(ctx, w, w_size(s), 1);
  conv2d_backward_input(ctx, s, dyr, wr, dx);
  return true;
}

bool conv2d_backward_weight_bf16_with(Bf16Kernels k, const CpuContext& ctx, const Conv2dShape& s,
                                      const float* x, const float* dy, float* dw) {
  s.validate();
  if (k == Bf16Kernels::OneDnn) return onednn::conv2d_backward_weight(ctx, s, x, dy, dw);
  if (const Bf16KernelTable* p = own_kernels(k)) {
    p->conv2d_backward_weight(ctx, s, x, dy, dw);
    return true;
  }
  const float* xr = rounded(ctx, x, x_size(s), 0);
  const float* dyr = rounded(ctx, dy, y_size(s), 1);
  conv2d_backward_weight(ctx, s, xr, dyr, dw);
  return true;
}

bool gemm_bf16_with(Bf16Kernels kernels, const CpuContext& ctx, bool trans_a, bool trans_b, int m,
                    int n, int k, const float* a, int lda, const float* b, int ldb, float* c,
                    int ldc) {
  // Empty and invalid problems: gemm's own rules and messages.
  if (m <= 0 || n <= 0 || k <= 0 || lda < (trans_a ? m : k) || ldb < (trans_b ? k : n) || ldc < n) {
    gemm(ctx, trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
    return true;
  }
  if (kernels == Bf16Kernels::OneDnn)
    return onednn::gemm(ctx, trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc);
  if (const Bf16KernelTable* p = own_kernels(kernels)) {
    p->gemm(ctx, trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc);
    return true;
  }
  // op(a) and op(b) as stored: [m, k] or [k, m] rows of lda; [k, n] or [n, k] rows of ldb.
  const std::int64_t a_n = std::int64_t(trans_a ? k : m) * lda, b_n = std::int64_t(trans_b ? n : k) * ldb;
  const float* ar = rounded(ctx, a, a_n - (lda - (trans_a ? m : k)), 0);
  const float* br = rounded(ctx, b, b_n - (ldb - (trans_b ? k : n)), 1);
  gemm(ctx, trans_a, trans_b, m, n, k, 1.0f, ar, lda, br, ldb, 0.0f, c, ldc);
  return true;
}

bool conv2d_backward_weight_bf16_winograd_with(Bf16Kernels k, const CpuContext& ctx,
                                               const Conv2dShape& s, const float* x,
                                               const float* dy, float* dw) {
  return on_own_kernels(k, s, [&](const Bf16KernelTable& t) { return t.winograd_backward_weight(ctx, s, x, dy, dw); });
}

bool conv2d_backward_weight_bf16_winograd_with(Bf16Kernels k, const CpuContext& ctx,
                                               const Conv2dShape& s, const std::uint16_t* x,
                                               const float* dy, float* dw) {
  return on_own_kernels(k, s, [&](const Bf16KernelTable& t) {
    return t.winograd_backward_weight_bf16_input(ctx, s, x, dy, dw);
  });
}

bool conv2d_forward_bf16_winograd_with(Bf16Kernels k, const CpuContext& ctx, const Conv2dShape& s,
                                       const float* x, const float* w, const float* bias_or_null,
                                       float* y) {
  return on_own_kernels(k, s, [&](const Bf16KernelTable& t) { return t.winograd_forward(ctx, s, x, w, bias_or_null, y); });
}

bool conv2d_forward_bf16_winograd_with(Bf16Kernels k, const CpuContext& ctx, const Conv2dShape& s,
                                       const std::uint16_t* x, const float* w,
                                       const float* bias_or_null, float* y) {
  return on_own_kernels(k, s, [&](const Bf16KernelTable& t) {
    return t.winograd_forward_bf16_input(ctx, s, x, w, bias_or_null, y);
  });
}

bool conv2d_backward_input_bf16_winograd_with(Bf16Kernels k, const CpuContext& ctx,
                                              const Conv2dShape& s, const float* dy,
                                              const float* w, float* dx) {
  return on_own_kernels(k, s, [&](const Bf16KernelTable& t) { return t.winograd_backward_input(ctx, s, dy, w, dx); });
}

bool bf16_backward_input_adds(Bf16Kernels k) { return k != Bf16Kernels::OneDnn; }

bool conv2d_backward_input_bf16_add_with(Bf16Kernels k, const CpuContext& ctx, const Conv2dShape& s,
                                         const float* dy, const float* w, float* dx) {
  s.validate();
  if (k == Bf16Kernels::OneDnn) return false;
  if (const Bf16KernelTable* p = own_kernels(k)) return p->backward_input_add(ctx, s, dy, w, dx);
  const float* dyr = rounded(ctx, dy, y_size(s), 0);
  const float* wr = rounded(ctx, w, w_size(s), 1);
  conv2d_backward_input_add(ctx, s, dyr, wr, dx);
  return true;
}

bool conv2d_backward_input_bf16_winograd_add_with(Bf16Kernels k, const CpuContext& ctx,
                                                  const Conv2dShape& s, const float* dy,
                                                  const float* w, float* dx) {
  return on_own_kernels(k, s, [&](const Bf16KernelTable& t) { return t.winograd_backward_input_add(ctx, s, dy, w, dx); });
}

bool conv2d_forward_bf16_input_with(Bf16Kernels k, const CpuContext& ctx, const Conv2dShape& s,
                                    const std::uint16_t* x, const float* w,
                                    const float* bias_or_null, float* y) {
  s.validate();
  if (k == Bf16Kernels::OneDnn) return onednn::conv2d_forward(ctx, s, x, w, bias_or_null, y);
  if (const Bf16KernelTable* p = own_kernels(k)) {
    p->forward_bf16_input(ctx, s, x, w, bias_or_null, y);
    return true;
  }
  conv2d_forward_bias(ctx, s, widened(ctx, x, x_size(s)), rounded(ctx, w, w_size(s), 1),
                      bias_or_null, y);
  return true;
}

bool conv2d_backward_weight_bf16_input_with(Bf16Kernels k, const CpuContext& ctx,
                                            const Conv2dShape& s, const std::uint16_t* x,
                                            const float* dy, float* dw) {
  s.validate();
  if (k == Bf16Kernels::OneDnn) return onednn::conv2d_backward_weight(ctx, s, x, dy, dw);
  if (const Bf16KernelTable* p = own_kernels(k)) {
    p->backward_weight_bf16_input(ctx, s, x, dy, dw);
    return true;
  }
  conv2d_backward_weight(ctx, s, widened(ctx, x, x_size(s)), rounded(ctx, dy, y_size(s), 1), dw);
  return true;
}

bool conv2d_forward_bf16_output_with(Bf16Kernels k, const CpuContext& ctx, const Conv2dShape& s,
                                     const float* x, const float* w, const float* bias_or_null,
                                     std::uint16_t* y) {
  s.validate();
  if (k == Bf16Kernels::OneDnn) return onednn::conv2d_forward(ctx, s, x, w, bias_or_null, y);
  return narrowed(ctx, y_size(s), y, [&](float* out) {
    return conv2d_forward_bf16_with(k, ctx, s, x, w, bias_or_null, out);
  });
}

bool conv2d_forward_bf16_output_with(Bf16Kernels k, const CpuContext& ctx, const Conv2dShape& s,
                                     const std::uint16_t* x, const float* w,
                                     const float* bias_or_null, std::uint16_t* y) {
  s.validate();
  if (k == Bf16Kernels::OneDnn) return onednn::conv2d_forward(ctx, s, x, w, bias_or_null, y);
  return narrowed(ctx, y_size(s), y, [&](float* out) {
    return conv2d_forward_bf16_input_with(k, ctx, s, x, w, bias_or_null, out);
  });
}

bool conv2d_forward_bf16_winograd_with(Bf16Kernels k, const CpuContext& ctx, const Conv2dShape& s,
                                       const float* x, const float* w, const float* bias_or_null,
                                       std::uint16_t* y) {
  return on_own_kernels(k, s, [&](const Bf16KernelTable& t) {
    return t.winograd_forward_bf16_output(ctx, s, x, w, bias_or_null, y);
  });
}

bool conv2d_forward_bf16_winograd_with(Bf16Kernels k, const CpuContext& ctx, const Conv2dShape& s,
                                       const std::uint16_t* x, const float* w,
                                       const float* bias_or_null, std::uint16_t* y) {
  return on_own_kernels(k, s, [&](const Bf16KernelTable& t) {
    return t.winograd_forward_bf16_io(ctx, s, x, w, bias_or_null, y);
  });
}

bool conv2d_backward_weight_bf16_dy_rows_with(Bf16Kernels k, const CpuContext& ctx,
                                              const Conv2dShape& s, const float* x,
                                              const DyRows& rows, float* dw) {
  return on_own_kernels(k, s, [&](const Bf16KernelTable& t) { return t.backward_weight_dy_rows(ctx, s, x, rows, dw); });
}

// The active kernels, and the emulated path where they decline (oneDNN's reference problems).
void conv2d_forward_bf16(const CpuContext& ctx, const Conv2dShape& s, const float* x,
                         const float* w, const float* bias_or_null, float* y) {
  if (!conv2d_forward_bf16_with(active_bf16_kernels(), ctx, s, x, w, bias_or_null, y))
    conv2d_forward_bf16_with(Bf16Kernels::Emulated, ctx, s, x, w, bias_or_null, y);
}

void conv2d_backward_input_bf16(const CpuContext& ctx, const Conv2dShape& s, const float* dy,
                                const float* w, float* dx) {
  if (!conv2d_backward_input_bf16_with(active_bf16_kernels(), ctx, s, dy, w, dx))
    conv2d_backward_input_bf16_with(Bf16Kernels::Emulated, ctx, s, dy, w, dx);
}

void conv2d_backward_weight_bf16(const CpuContext& ctx, const Conv2dShape& s, const float* x,
                                 const float* dy, float* dw) {
  if (!conv2d_backward_weight_bf16_with(active_bf16_kernels(), ctx, s, x, dy, dw))
    conv2d_backward_weight_bf16_with(Bf16Kernels::Emulated, ctx, s, x, dy, dw);
}

void gemm_bf16(const CpuContext& ctx, bool trans_a, bool trans_b, int m, int n, int k,
               const float* a, int lda, const float* b, int ldb, float* c, int ldc) {
  if (!gemm_bf16_with(active_bf16_kernels(), ctx, trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc))
    gemm_bf16_with(Bf16Kernels::Emulated, ctx, trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc);
}

void conv2d_forward_bf16_input(const CpuContext& ctx, const Conv2dShape& s,
                               const std::uint16_t* x, const float* w, const float* bias_or_null,
                               float* y) {
  if (!conv2d_forward_bf16_input_with(active_bf16_kernels(), ctx, s, x, w, bias_or_null, y))
    conv2d_forward_bf16_input_with(Bf16Kernels::Emulated, ctx, s, x, w, bias_or_null, y);
}

void conv2d_forward_bf16_output(const CpuContext& ctx, const Conv2dShape& s, const float* x,
                                const float* w, const float* bias_or_null, std::uint16_t* y) {
  if (!conv2d_forward_bf16_output_with(active_bf16_kernels(), ctx, s, x, w, bias_or_null, y))
    conv2d_forward_bf16_output_with(Bf16Kernels::Emulated, ctx, s, x, w, bias_or_null, y);
}

void conv2d_forward_bf16_output(const CpuContext& ctx, const Conv2dShape& s, const std::uint16_t* x,
                                const float* w, const float* bias_or_null, std::uint16_t* y) {
  if (!conv2d_forward_bf16_output_with(active_bf16_kernels(), ctx, s, x, w, bias_or_null, y))
    conv2d_forward_bf16_output_with(Bf16Kernels::Emulated, ctx, s, x, w, bias_or_null, y);
}

void conv2d_backward_weight_bf16_input(const CpuContext& ctx, const Conv2dShape& s,
                                       const std::uint16_t* x, const float* dy, float* dw) {
  if (!conv2d_backward_weight_bf16_input_with(active_bf16_kernels(), ctx, s, x, dy, dw))
    conv2d_backward_weight_bf16_input_with(Bf16Kernels::Emulated, ctx, s, x, dy, dw);
}

}  // namespace towerflow::cpu
