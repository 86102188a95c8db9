// Convolutions and GEMM through oneDNN (onednn_impl.h), on bf16 or fp32 operands.
//
// Each problem gets, once per thread, the oneDNN primitive for bf16 (or fp32) sources and weights
// with fp32 outputs, the reorders that convert our fp32 operands into the layouts it asked for (for
// bf16 the rounding is oneDNN's, to nearest even), and those buffers. Activations stay NHWC, which
// oneDNN's JIT and AMX kernels read directly; weights go into oneDNN's blocked layout, and the
// weight gradient comes back out of it into OIHW.
//
// Threads: this oneDNN runs on OpenMP. Each calling thread sets its own OpenMP thread count (one
// for the slices of onednn_context.cc: Note [oneDNN on the context's threads]), and the count is
// in the cache key, since a primitive is built for the count it was created under.
#include <omp.h>

#include <array>
#include <cstdlib>
#include <map>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <unordered_map>

#include "core/cpu/isa.h"
#include "core/cpu/onednn_impl.h"
#include "core/error.h"

namespace towerflow::cpu::onednn {
namespace {

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

// oneDNN's instruction set, read once. TOWERFLOW_MAX_CPU_ISA holds oneDNN to the same level as
// towerflow's own kernels (Note [Holding the CPU to a lower level] in isa.cc) unless
// ONEDNN_MAX_CPU_ISA names one of its own. oneDNN takes the cap only before its first use, so
// the engine and every query go through here first.
#if DNNL_VERSION_MAJOR >= 3
constexpr dnnl::cpu_isa kAllIsas = dnnl::cpu_isa::isa_default;  // oneDNN 3: the CPU's best
#else
constexpr dnnl::cpu_isa kAllIsas = dnnl::cpu_isa::all;
#endif

dnnl::cpu_isa effective_isa() {
  static const dnnl::cpu_isa isa = [] {
    const std::string level = max_cpu_isa();
    if (!level.empty() && !std::getenv("ONEDNN_MAX_CPU_ISA") && !std::getenv("DNNL_MAX_CPU_ISA")) {
      const dnnl::cpu_isa cap = level == "baseline"      ? dnnl::cpu_isa::sse41
                                : level == "avx2"        ? dnnl::cpu_isa::avx2
                                : level == "avx512"      ? dnnl::cpu_isa::avx512_core_vnni
                                : level == "avx512_bf16" ? dnnl::cpu_isa::avx512_core_bf16
                                                         : kAllIsas;
      try {
        dnnl::set_max_cpu_isa(cap);
      } catch (const dnnl::error&) {
        // oneDNN was used before (a second caller in this process): its instruction set stays.
      }
    }
    return dnnl::get_effective_cpu_isa();
  }();
  return isa;
}

dnnl::engine& engine() {
  static dnnl::engine e = (effective_isa(), dnnl::engine(dnnl::engine::kind::cpu, 0));
  return e;
}

bool is_reference(const char* impl) { return std::string(impl).find("ref") != std::string::npos; }

// A conversion of one operand: user layout (fp32) into the primitive's (bf16), into a buffer of
// its own.
struct Conversion {
  memory::desc user;
  memory converted;  // owns its buffer (only where needed)
  dnnl::reorder reorder;
  bool needed = false;

  Conversion() = default;
  Conversion(const memory::desc& user_md, const memory::desc& target_md)
      : user(user_md), needed(user_md != target_md) {
    if (!needed) return;
    converted = memory(target_md, engine());
    reorder = dnnl::reorder(memory(user_md, engine()), converted);
  }
  // The operand at `data` converted (or the user memory itself when no conversion is needed).
  memory in(dnnl::stream& s, const void* data) {
    memory m(user, engine(), const_cast<void*>(data));
    if (!needed) return m;
    reorder.execute(s, m, converted);
    return converted;
  }
};

struct Problem {
  bool reference = false;
  dnnl::primitive primitive;
  Conversion a, b;  // the two operands
  // The weight gradient, where oneDNN writes it in a blocked layout: its buffer, and the reorder
  // into OIHW.
  memory blocked_result;
  dnnl::reorder result_out;
};

enum Kind { kForward, kBackwardInput, kBackwardWeight, kGemm };
using Key = std::array<int, 17>;

struct ThreadState {
  dnnl::stream stream{engine()};
  std::map<Key, Problem> problems;
};

ThreadState& state(int threads) {
  thread_local ThreadState t;
  omp_set_num_threads(threads);
  return t;
}

dt operand_type(Operands op) { return op == Operands::kBf16 ? dt::bf16 : dt::f32; }

// x_type: how x is stored (f32, or bf16 for the bf16 inputs of onednn_impl.h); y_type, how the
// forward's y is (f32, or bf16 for its bf16 outputs).
Key conv_key(Kind kind, const Conv2dShape& s, int threads, bool bias, Operands op,
             dt x_type = dt::f32, dt y_type = dt::f32) {
  return {kind, s.n, s.h, s.w, s.c_in, s.c_out, s.kh, s.kw, s.stride_h, s.stride_w, s.pad_h,
          s.pad_w, threads, bias ? 1 : 0, static_cast<int>(op), x_type == dt::bf16 ? 1 : 0,
          y_type == dt::bf16 ? 1 : 0};
}

struct ConvDescs {
  memory::dims src, weights, dst, bias, strides, pad_l, pad_r;
  bool valid = true;
};

ConvDescs conv_descs(const Conv2dShape& s) {
  ConvDescs d;
  const int oh = s.out_h(), ow = s.out_w();
  d.src = {s.n, s.c_in, s.h, s.w};
  d.weights = {s.c_out, s.c_in, s.kh, s.kw};
  d.dst = {s.n, s.c_out, oh, ow};
  d.bias = {s.c_out};
  d.strides = {s.stride_h, s.stride_w};
  d.pad_l = {s.pad_h, s.pad_w};
  // Our output size rounds down; oneDNN wants the right padding that gives it.
  const int pr_h = (oh - 1) * s.stride_h + s.kh - s.h - s.pad_h;
  const int pr_w = (ow - 1) * s.stride_w + s.kw - s.w - s.pad_w;
  d.pad_r = {pr_h, pr_w};
  d.valid = pr_h >= 0 && pr_w >= 0;
  return d;
}

// The primitive descriptors, in oneDNN 3's form (engine first, no operation descriptor) or in
// oneDNN 2's (an operation descriptor, then the engine).
dnnl::convolution_forward::primitive_desc forward_hint(const ConvDescs& d, bool bias, dt op,
                                                        dt y_type = dt::f32) {
  const memory::desc src(d.src, op, tag::nhwc), wei(d.weights, op, tag::any),
      dst(d.dst, y_type, tag::nhwc);
  const memory::desc bias_md = bias ? memory::desc(d.bias, dt::f32, tag::a) : memory::desc();
#if DNNL_VERSION_MAJOR >= 3
  return {engine(), dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, src,
          wei, bias_md, dst, d.strides, d.pad_l, d.pad_r};
#else
  return {{dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, src, wei,
           bias_md, dst, d.strides, d.pad_l, d.pad_r},
          engine()};
#endif
}

dnnl::convolution_backward_data::primitive_desc backward_data_desc(const ConvDescs& d, dt op) {
  const memory::desc dsrc(d.src, dt::f32, tag::nhwc), wei(d.weights, op, tag::any),
      ddst(d.dst, op, tag::nhwc);
#if DNNL_VERSION_MAJOR >= 3
  return {engine(), dnnl::algorithm::convolution_direct, dsrc, wei, ddst, d.strides, d.pad_l,
          d.pad_r, forward_hint(d, false, op)};
#else
  return {{dnnl::algorithm::convolution_direct, dsrc, wei, ddst, d.strides, d.pad_l, d.pad_r},
          engine(), forward_hint(d, false, op)};
#endif
}

dnnl::convolution_backward_weights::primitive_desc backward_weights_desc(const ConvDescs& d,
                                                                         dt op) {
  const memory::desc src(d.src, op, tag::nhwc), dwei(d.weights, dt::f32, tag::any),
      ddst(d.dst, op, tag::nhwc);
#if DNNL_VERSION_MAJOR >= 3
  return {engine(), dnnl::algorithm::convolution_direct, src, dwei, ddst, d.strides, d.pad_l,
          d.pad_r, forward_hint(d, false, op)};
#else
  return {{dnnl::algorithm::convolution_direct, src, dwei, ddst, d.strides, d.pad_l, d.pad_r},
          engine(), forward_hint(d, false, op)};
#endif
}

dnnl::matmul::primitive_desc matmul_desc(const memory::desc& a, const memory::desc& b,
                                         const memory::desc& c) {
#if DNNL_VERSION_MAJOR >= 3
  return {engine(), a, b, c};
#else
  return {{a, b, c}, engine()};
#endif
}

Problem make_forward(const Conv2dShape& s, bool bias, dt op, dt x_type, dt y_type) {
  Problem p;
  const ConvDescs d = conv_descs(s);
  if (!d.valid) return Problem{.reference = true};
  const auto pd = forward_hint(d, bias, op, y_type);
  if (is_reference(pd.impl_info_str())) return Problem{.reference = true};
  p.primitive = dnnl::convolution_forward(pd);
  p.a = Conversion(memory::desc(d.src, x_type, tag::nhwc), pd.src_desc());
  p.b = Conversion(memory::desc(d.weights, dt::f32, tag::oihw), pd.weights_desc());
  return p;
}

Problem make_backward_input(const Conv2dShape& s, dt op) {
  Problem p;
  const ConvDescs d = conv_descs(s);
  if (!d.valid) return Problem{.reference = true};
  const auto pd = backward_data_desc(d, op);
  if (is_reference(pd.impl_info_str())) return Problem{.reference = true};
  p.primitive = dnnl::convolution_backward_data(pd);
  p.a = Conversion(memory::desc(d.dst, dt::f32, tag::nhwc), pd.diff_dst_desc());
  p.b = Conversion(memory::desc(d.weights, dt::f32, tag::oihw), pd.weights_desc());
  return p;
}

Problem make_backward_weight(const Conv2dShape& s, dt op, dt x_type) {
  Problem p;
  const ConvDescs d = conv_descs(s);
  if (!d.valid) return Problem{.reference = true};
  const auto pd = backward_weights_desc(d, op);
  if (is_reference(pd.impl_info_str())) return Problem{.reference = true};
  p.primitive = dnnl::convolution_backward_weights(pd);
  p.a = Conversion(memory::desc(d.src, x_type, tag::nhwc), pd.src_desc());
  p.b = Conversion(memory::desc(d.dst, dt::f32, tag::nhwc), pd.diff_dst_desc());
  const memory::desc oihw(d.weights, dt::f32, tag::oihw);
  if (pd.diff_weights_desc() != oihw) {
    p.blocked_result = memory(pd.diff_weights_desc(), engine());
    p.result_out = dnnl::reorder(p.blocked_result, memory(oihw, engine()));
  }
  return p;
}

// The problem for key, made once per thread (make may throw dnnl::error for a problem oneDNN
// rejects: then it is a reference problem too, run emulated).
template <typename Make>
Problem& problem(ThreadState& t, const Key& key, Make make) {
  auto it = t.problems.find(key);
  if (it == t.problems.end()) {
    Problem p;
    try {
      p = make();
    } catch (const dnnl::error&) {
      p = Problem{.reference = true};
    }
    it = t.problems.emplace(key, std::move(p)).first;
  }
  return it->second;
}

// oneDNN's status codes become exceptions that name the call.
template <typename F>
void checked(const char* what, F f) {
  try {
    f();
  } catch (const dnnl::error& e) {
    raise<DeviceError>("oneDNN ", what, " failed: ", e.what(), " (status ", int(e.status), ")");
  }
}

const char* what(Operands op, Kind kind) {
  static constexpr const char* kNames[2][4] = {
      {"bf16 convolution (forward)", "bf16 convolution (backward input)",
       "bf16 convolution (backward weight)", "bf16 matrix product"},
      {"fp32 convolution (forward)", "fp32 convolution (backward input)",
       "fp32 convolution (backward weight)", "fp32 matrix product"}};
  return kNames[op == Operands::kBf16 ? 0 : 1][kind];
}

}  // namespace

bool built() { return true; }

std::string version() {
  const dnnl_version_t* v = dnnl_version();
  return std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
}

std::string isa() {
  switch (static_cast<dnnl_cpu_isa_t>(effective_isa())) {
#if DNNL_VERSION_MAJOR >= 3
    case dnnl_cpu_isa_avx512_core_amx_fp16: return "avx512_core_amx_fp16";
    case dnnl_cpu_isa_avx512_core_fp16: return "avx512_core_fp16";
    case dnnl_cpu_isa_avx2_vnni_2: return "avx2_vnni_2";
#endif
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_sse41: return "sse41";
    default: return "other";
  }
}

namespace {
bool has_bits(dnnl_cpu_isa_t bits) {
  const auto isa = static_cast<unsigned>(effective_isa());
  return (isa & static_cast<unsigned>(bits)) == static_cast<unsigned>(bits);
}
}  // namespace

bool native_bf16() { return has_bits(dnnl_cpu_isa_avx512_core_bf16); }
bool jit_bf16() { return has_bits(dnnl_cpu_isa_avx512_core); }

namespace {

// x stored as x_type and y as y_type (f32, or bf16 with op kBf16).
bool forward(int threads, const Conv2dShape& s, const void* x, dt x_type, const float* w,
             const float* bias_or_null, void* y, dt y_type, Operands op) {
  ThreadState& t = state(threads);
  const bool bias = bias_or_null != nullptr;
  Problem& p = problem(t, conv_key(kForward, s, threads, bias, op, x_type, y_type),
                       [&] { return make_forward(s, bias, operand_type(op), x_type, y_type); });
  if (p.reference) return false;
  checked(what(op, kForward), [&] {
    const ConvDescs d = conv_descs(s);
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC, p.a.in(t.stream, x)},
        {DNNL_ARG_WEIGHTS, p.b.in(t.stream, w)},
        {DNNL_ARG_DST, memory(memory::desc(d.dst, y_type, tag::nhwc), engine(), y)}};
    if (bias)
      args.emplace(DNNL_ARG_BIAS, memory(memory::desc(d.bias, dt::f32, tag::a), engine(),
                                         const_cast<float*>(bias_or_null)));
    p.primitive.execute(t.stream, args);
    t.stream.wait();
  });
  return true;
}

bool backward_weight(int threads, const Conv2dShape& s, const void* x, dt x_type,
                     const float* dy, float* dw, Operands op) {
  ThreadState& t = state(threads);
  Problem& p = problem(t, conv_key(kBackwardWeight, s, threads, false, op, x_type),
                       [&] { return make_backward_weight(s, operand_type(op), x_type); });
  if (p.reference) return false;
  checked(what(op, kBackwardWeight), [&] {
    const ConvDescs d = conv_descs(s);
    memory user_dw(memory::desc(d.weights, dt::f32, tag::oihw), engine(), dw);
    const bool blocked = static_cast<bool>(p.blocked_result);
    p.primitive.execute(t.stream, {{DNNL_ARG_SRC, p.a.in(t.stream, x)},
                                   {DNNL_ARG_DIFF_DST, p.b.in(t.stream, dy)},
                                   {DNNL_ARG_DIFF_WEIGHTS, blocked ? p.blocked_result : user_dw}});
    if (blocked) p.result_out.execute(t.stream, p.blocked_result, user_dw);
    t.stream.wait();
  });
  return true;
}

}  // namespace

bool conv2d_forward(int threads, const Conv2dShape& s, const float* x, const float* w,
                    const float* bias_or_null, float* y, Operands op) {
  return forward(threads, s, x, dt::f32, w, bias_or_null, y, dt::f32, op);
}

bool conv2d_forward(int threads, const Conv2dShape& s, const std::uint16_t* x, const float* w,
                    const float* bias_or_null, float* y) {
  return forward(threads, s, x, dt::bf16, w, bias_or_null, y, dt::f32, Operands::kBf16);
}

bool conv2d_forward(int threads, const Conv2dShape& s, const float* x, const float* w,
                    const float* bias_or_null, std::uint16_t* y) {
  return forward(threads, s, x, dt::f32, w, bias_or_null, y, dt::bf16, Operands::kBf16);
}

bool conv2d_forward(int threads, const Conv2dShape& s, const std::uint16_t* x, const float* w,
                    const float* bias_or_null, std::uint16_t* y) {
  return forward(threads, s, x, dt::bf16, w, bias_or_null, y, dt::bf16, Operands::kBf16);
}

bool conv2d_backward_input(int threads, const Conv2dShape& s, const float* dy,
                           const float* w, float* dx, Operands op) {
  ThreadState& t = state(threads);
  Problem& p = problem(t, conv_key(kBackwardInput, s, threads, false, op),
                       [&] { return make_backward_input(s, operand_type(op)); });
  if (p.reference) return false;
  checked(what(op, kBackwardInput), [&] {
    const ConvDescs d = conv_descs(s);
    p.primitive.execute(t.stream,
                        {{DNNL_ARG_DIFF_DST, p.a.in(t.stream, dy)},
                         {DNNL_ARG_WEIGHTS, p.b.in(t.stream, w)},
                         {DNNL_ARG_DIFF_SRC, memory(memory::desc(d.src, dt::f32, tag::nhwc), engine(), dx)}});
    t.stream.wait();
  });
  return true;
}

bool conv2d_backward_weight(int threads, const Conv2dShape& s, const float* x,
                            const float* dy, float* dw, Operands op) {
  return backward_weight(threads, s, x, dt::f32, dy, dw, op);
}

bool conv2d_backward_weight(int threads, const Conv2dShape& s, const std::uint16_t* x,
                            const float* dy, float* dw) {
  return backward_weight(threads, s, x, dt::bf16, dy, dw, Operands::kBf16);
}

bool gemm(int threads, bool trans_a, bool trans_b, int m, int n, int k, const float* a,
          int lda, const float* b, int ldb, float* c, int ldc, Operands op) {
  ThreadState& t = state(threads);
  const Key key{kGemm, m, n, k, lda, ldb, ldc, trans_a, trans_b, threads, static_cast<int>(op),
                0, 0, 0, 0, 0, 0};
  const dt type = operand_type(op);
  const memory::desc a_user({m, k}, dt::f32, trans_a ? memory::dims{1, lda} : memory::dims{lda, 1});
  const memory::desc b_user({k, n}, dt::f32, trans_b ? memory::dims{1, ldb} : memory::dims{ldb, 1});
  const memory::desc c_user({m, n}, dt::f32, memory::dims{ldc, 1});
  Problem& p = problem(t, key, [&] {
    Problem q;
    const auto pd =
        matmul_desc(memory::desc({m, k}, type, tag::ab), memory::desc({k, n}, type, tag::ab), c_user);
    if (is_reference(pd.impl_info_str())) return Problem{.reference = true};
    q.primitive = dnnl::matmul(pd);
    q.a = Conversion(a_user, pd.src_desc());
    q.b = Conversion(b_user, pd.weights_desc());
    return q;
  });
  if (p.reference) return false;
  checked(what(op, kGemm), [&] {
    p.primitive.execute(t.stream, {{DNNL_ARG_SRC, p.a.in(t.stream, a)},
                                   {DNNL_ARG_WEIGHTS, p.b.in(t.stream, b)},
                                   {DNNL_ARG_DST, memory(c_user, engine(), c)}});
    t.stream.wait();
  });
  return true;
}

}  // namespace towerflow::cpu::onednn
