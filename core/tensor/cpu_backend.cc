#include "core/tensor/cpu_backend.h"
#include "core/tensor/precision.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/cpu/batch_norm.h"
#include "core/cpu/conv.h"
#include "core/cpu/elementwise.h"
#include "core/cpu/isa.h"
#include "core/cpu/bf16.h"
#include "core/cpu/gemm.h"
#include "core/cpu/kernel_choice.h"
#include "core/cpu/pool.h"
#include "core/error.h"
#include "core/memory/allocator.h"
#include "core/tensor/mac_counter.h"
#include "core/tensor/ops.h"
#include "core/tensor/optimizer_update.h"
#include "core/trace.h"

namespace towerflow {

namespace {

using ArrayMap = Eigen::Map<Eigen::ArrayXf>;
using ConstArrayMap = Eigen::Map<const Eigen::ArrayXf>;

// Elementwise loops are memory-bound; chunks below this many elements are not worth a thread.
constexpr std::int64_t kMinElementsPerThread = 16 * 1024;

// A memory-bound kernel's span in a trace ("kernel"), with the bytes it moves at least: each
// operand read or written once per pass the algorithm makes over it (batch norm reads its input
// twice: statistics, then normalisation), as towerflow_bench_kernels counts them. The trace's
// bandwidth table (trace::bandwidth_rows) sets them against the machine's STREAM bandwidth.
// Nothing is recorded, or counted, unless a trace is on.
trace::Span kernel_span(const char* name, double floats) {
  return trace::Span("kernel", name, {},
                     trace::enabled() ? static_cast<std::int64_t>(floats * sizeof(float)) : 0);
}

// Note [Convolution and pool in chunks of the batch]
// A convolution followed by a max pool (Conv2DMaxPoolRelu) writes its output to memory and the pool
// reads it back, where the output outgrows the caches: 32 MiB for tfcnn's conv1 at batch 128. Run
// on chunks of images, one after the other, each chunk's convolution writes into the same buffer of
// about kConvPoolChunkBytes, which stays in cache, and the pool reads it from there. Outputs of up
// to kConvPoolWholeBytes run whole: there the caches hold the output anyway, and the convolution
// kernels run a smaller batch no better or worse (tfcnn's conv2, 8 MiB, took 13.0 ms per bf16 step
// whole, 13.2 in chunks of 64 images, 14.9 in chunks of 16). A chunk is a problem of its own to the
// kernel choice ("16x32x32x3 -> 64, ..."), which may choose other kernels than for the whole batch;
// towerflow's kernels give each image the bits they give it in any batch, oneDNN's may sum in
// another order for another batch. On a 2-core Zen 4 EPYC, tfcnn's conv1 and pool1 forward took 3.6
// + 1.0 ms per bf16 step in chunks of 16 images against 4.4 + 1.6 whole, and the step went from
// 2077-2120 to 2151-2160 img/s (`towerflow_bench_train --model tfcnn --precision bf16 --trace`,
// three alternating runs; chunks of 8 images: 2149-2158). With two towers of 64 images, whose conv1
// outputs (16 MiB each) share the caches, conv1 and pool1 took 3.6 + 1.0 ms per bf16 step against
// 4.4 + 1.3-1.6, and the step went from 1984-2055 to 2058-2099 img/s in bf16 and from 1203-1236 to
// 1247-1250 in fp32 (`--devices 2 --threads 1`).
constexpr std::int64_t kConvPoolWholeBytes = std::int64_t{8} << 20;
constexpr std::int64_t kConvPoolChunkBytes = std::int64_t{4} << 20;

class CpuBackend final : public Backend {
 public:
  CpuBackend(const Device& device, Allocator& allocator, int threads, std::vector<OpKind> missing)
      : device_(device), allocator_(allocator), ctx_(threads), missing_(std::move(missing)) {}

  const Device& device() const override { return device_; }
  Allocator& allocator() const override { return allocator_; }
  std::string name() const override {
    return str("CPU (", ctx_.threads(), " threads, Eigen)");
  }
  std::string describe_kernels() const override { return cpu::describe_active_isa(); }
  bool supports(OpKind op) const override {
    if (op == OpKind::kBf16Products && !cpu::bf16_products_in_kernels(cpu::active_bf16_kernels()))
      return false;  // bf16 is emulated: ops.cc rounds the operands (Note [bf16 kernels])
    if (op == OpKind::kFp16Products) return false;  // fp16 is always emulated on CPUs
    return std::find(missing_.begin(), missing_.end(), op) == missing_.end();
  }
  std::string describe_products(Precision p) const override {
    return p == Precision::Bf16 ? cpu::describe_bf16_kernels() : Backend::describe_products(p);
  }
  const cpu::CpuContext& context() const { return ctx_; }

  // ---- memory ----------------------------------------------------------------------------
  void copy_from_host(void* dst, const void* src, std::size_t bytes) override {
    parallel_copy(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, std::size_t bytes) override {
    parallel_copy(dst, src, bytes);
  }
  void copy(void* dst, const void* src, std::size_t bytes) override {
    const auto span = kernel_span("copy", 2.0 * static_cast<double>(bytes) / sizeof(float));
    parallel_copy(dst, src, bytes);
  }
  void copy_from_device(void* dst, Backend& src_backend, const void* src,
                        std::size_t bytes) override {
    if (src_backend.device().is_cpu() || dynamic_cast<CpuBackend*>(&src_backend))
      parallel_copy(dst, src, bytes);
    else src_backend.copy_to_host(dst, src, bytes);  // our memory is host memory
  }
  void synchronize() override {}

  void round_to_bf16(std::int64_t n, const float* x, float* y) override {
    const auto span = kernel_span("round_to_bf16", 2.0 * n);
    each(n, [&](std::int64_t b, std::int64_t e) { towerflow::round_to_bf16(e - b, x + b, y + b); });
  }

  void widen_bf16(std::int64_t n, const bfloat16* x, float* y) override {
    const auto span = kernel_span("widen_bf16", 1.5 * n);  // 2 bytes read, 4 written
    const auto* bits = reinterpret_cast<const std::uint16_t*>(x);
    each(n, [&](std::int64_t b, std::int64_t e) { cpu::widen_bf16(e - b, bits + b, y + b); });
  }

  void round_to_fp16(std::int64_t n, const float* x, float* y) override {
    const auto span = kernel_span("round_to_fp16", 2.0 * n);
    each(n, [&](std::int64_t b, std::int64_t e) { towerflow::round_to_fp16(e - b, x + b, y + b); });
  }

  // ---- fused optimizer updates ---------------------------------------------------------------
  // Float arithmetic term for term as PyTorch's CPU single-tensor kernels evaluate it, so updates
  // agree with torch.optim to the last bit or two (tests/optim, against its fixtures). Each
  // element is independent: the split across threads does not change a bit.
  void sgd_update(std::int64_t n, float* p, const float* g, float* buf,
                  const SgdUpdate& u) override {
    check_sgd_update(u);
    if (u.momentum != 0.0f && buf == nullptr)
      raise<InvalidArgument>("SGD with momentum ", u.momentum,
                             " needs a momentum buffer (momentum_buf is null)");
    const float lr = u.lr, wd = u.weight_decay, mu = u.momentum, keep = 1.0f - u.dampening;
    // p read and written, g read; the momentum buffer read (after the first step) and written.
    const auto span = kernel_span("sgd_update", (mu == 0 ? 3.0 : u.first_step ? 4.0 : 5.0) * n);
    // One loop per combination of the options, over restrict pointers, so that each vectorises
    // (with the options tested per element and p, g, buf possibly aliased, the loop stayed
    // scalar at twice its bandwidth bound).
    auto run = [&]<bool kMomentum, bool kDecay, bool kFirst, bool kNesterov>() {
      each(n, [&](std::int64_t b, std::int64_t e) {
        sgd_chunk<kMomentum, kDecay, kFirst, kNesterov>(p + b, g + b, kMomentum ? buf + b : nullptr, e - b,
                                                        lr, wd, mu, keep);
      });
    };
    const bool decay = wd != 0;
    if (mu == 0) {
      if (decay) run.template operator()<false, true, false, false>();
      else run.template operator()<false, false, false, false>();
      return;
    }
    const int variant = (decay ? 4 : 0) + (u.first_step ? 2 : 0) + (u.nesterov ? 1 : 0);
    switch (variant) {
      case 0: run.template operator()<true, false, false, false>(); break;
      case 1: run.template operator()<true, false, false, true>(); break;
      case 2: run.template operator()<true, false, true, false>(); break;
      case 3: run.template operator()<true, false, true, true>(); break;
      case 4: run.template operator()<true, true, false, false>(); break;
      case 5: run.template operator()<true, true, false, true>(); break;
      case 6: run.template operator()<true, true, true, false>(); break;
      default: run.template operator()<true, true, true, true>(); break;
    }
  }
  // PyTorch's _single_tensor_sgd term for term: d = g + wd p; m = first ? d : mu m + (1 -
  // dampening) d; p -= lr (nesterov ? d + mu m : m).
  template <bool kMomentum, bool kDecay, bool kFirst, bool kNesterov>
  static void sgd_chunk(float* __restrict p, const float* __restrict g, float* __restrict buf,
                        std::int64_t n, float lr, float wd, float mu, float keep) {
    for (std::int64_t i = 0; i < n; ++i) {
      const float d = kDecay ? g[i] + wd * p[i] : g[i];
      if constexpr (kMomentum) {
        const float m = kFirst ? d : buf[i] * mu + keep * d;
        buf[i] = m;
        p[i] -= lr * (kNesterov ? d + mu * m : m);
      } else {
        p[i] -= lr * d;
      }
    }
  }
  // The bias corrections in double, the element-wise work in float (torch.optim.Adam).
  void adam_update(std::int64_t n, float* p, const float* g, float* m, float* v,
                   const AdamUpdate& u) override {
    check_adam_update(u);
    const auto span = kernel_span("adam_update", 7.0 * n);  // p, m, v read and written; g read
    const double t = static_cast<double>(u.step);
    const double bc1 = 1 - std::pow(static_cast<double>(u.beta1), t);
    const double bc2 = 1 - std::pow(static_cast<double>(u.beta2), t);
    const float step_size = static_cast<float>(u.lr / bc1);
    const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
    const float b1 = u.beta1, b2 = u.beta2, one_m_b1 = 1.0f - u.beta1, one_m_b2 = 1.0f - u.beta2;
    const float eps = u.eps, wd = u.weight_decay;
    const float decay = static_cast<float>(1.0 - static_cast<double>(u.lr) * u.weight_decay);
    each(n, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t i = b; i < e; ++i) {
        float gi = g[i];
        if (wd != 0) {
          if (u.decoupled_weight_decay) p[i] *= decay;
          else gi = gi + wd * p[i];
        }
        m[i] = m[i] * b1 + one_m_b1 * gi;
        v[i] = v[i] * b2 + one_m_b2 * gi * gi;
        const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
        p[i] += -step_size * (m[i] / denom);
      }
    });
  }

  // ---- elementwise -------------------------------------------------------------------------
  void fill(std::int64_t n, float value, float* y) override {
    const auto span = kernel_span("fill", 1.0 * n);
    each(n, [&](std::int64_t b, std::int64_t e) { std::fill(y + b, y + e, value); });
  }
  void add(std::int64_t n, const float* a, const float* b, float* y) override {
    const auto span = kernel_span("add", 3.0 * n);
    cpu::add(ctx_, n, a, b, y);
  }
  void mul(std::int64_t n, const float* a, const float* b, float* y) override {
    const auto span = kernel_span("mul", 3.0 * n);
    cpu::mul(ctx_, n, a, b, y);
  }
  void scale(std::int64_t n, float alpha, const float* x, float* y) override {
    const auto span = kernel_span("scale", 2.0 * n);
    cpu::scale(ctx_, n, alpha, x, y);
  }
  void axpy(std::int64_t n, float alpha, const float* x, float* y) override {
    const auto span = kernel_span("axpy", 3.0 * n);
    cpu::axpy(ctx_, n, alpha, x, y);
  }
  void relu_forward(std::int64_t n, const float* x, float* y) override {
    const auto span = kernel_span("relu_forward", 2.0 * n);
    cpu::relu_forward(ctx_, n, x, y);
  }
  void relu_backward(std::int64_t n, const float* y, const float* dy, float* dx) override {
    const auto span = kernel_span("relu_backward", 3.0 * n);
    cpu::relu_backward(ctx_, n, y, dy, dx);
  }
  void gelu_forward(std::int64_t n, const float* x, float* y) override { cpu::gelu_forward(ctx_, n, x, y); }
  void gelu_backward(std::int64_t n, const float* x, const float* dy, float* dx) override {
    cpu::gelu_backward(ctx_, n, x, dy, dx);
  }
  void bias_add(std::int64_t rows, int c, const float* x, const float* bias, float* y) override {
    const auto span = kernel_span("bias_add", 2.0 * rows * c);
    cpu::bias_add(ctx_, rows, c, x, bias, y);
  }
  void sum_rows(std::int64_t rows, int c, const float* x, float* out) override {
    const auto span = kernel_span("sum_rows", 1.0 * rows * c);
    cpu::sum_rows(ctx_, rows, c, x, out);
  }
  void sum(std::int64_t n, const float* x, float* out) override {
    double total = 0;
    for (std::int64_t i = 0; i < n; ++i) total += x[i];
    out[0] = static_cast<float>(total);
  }
  void nhwc_to_nchw(std::int64_t n, std::int64_t hw, int c, const float* x, float* y) override {
    const auto span = kernel_span("nhwc_to_nchw", 2.0 * n * hw * c);
    cpu::transpose(ctx_, n, hw, c, x, y);
  }
  void nchw_to_nhwc(std::int64_t n, std::int64_t hw, int c, const float* x, float* y) override {
    const auto span = kernel_span("nchw_to_nhwc", 2.0 * n * hw * c);
    cpu::transpose(ctx_, n, c, hw, x, y);
  }

  // ---- convolution, pooling, batch norm, gemm: the core/cpu kernels ------------------------
  // For a MacCounter of this thread, if one lives (mac_counter.h).
  static double pool_in(const Pool2dShape& s) { return 1.0 * s.n * s.h * s.w * s.c; }
  static double pool_out(const Pool2dShape& s) { return 1.0 * s.n * s.out_h() * s.out_w() * s.c; }
  static void count_conv(const char* op, const Conv2dShape& s) {
    if (MacCounter::active()) MacCounter::count(op, s.describe(), s.macs());
  }
  static void count_gemm(bool trans_a, bool trans_b, int m, int n, int k) {
    if (MacCounter::active())
      MacCounter::count("matmul", describe_matmul(trans_a, trans_b, m, n, k), std::int64_t{m} * n * k);
  }
  void conv2d_forward(const Conv2dShape& s, const float* x, const float* w,
                      const float* bias, float* y) override {
    count_conv("conv forward", s);
    cpu::conv2d_forward_chosen(ctx_, s, x, w, bias, y, false, OpScope::current());
  }
  void conv2d_backward_input(const Conv2dShape& s, const float* dy, const float* w,
                             float* dx) override {
    count_conv("conv backward input", s);
    cpu::conv2d_backward_input_chosen(ctx_, s, dy, w, dx, false, OpScope::current());
  }
  // towerflow's kernels add as they store; where the problem's choice is oneDNN, the caller adds.
  bool conv2d_backward_input_add(const Conv2dShape& s, const float* dy, const float* w,
                                 float* dx) override {
    if (!cpu::conv2d_backward_input_add_chosen(ctx_, s, dy, w, dx, OpScope::current())) return false;
    count_conv("conv backward input", s);
    return true;
  }
  void conv2d_backward_weight(const Conv2dShape& s, const float* x, const float* dy,
                              float* dw) override {
    count_conv("conv backward weight", s);
    cpu::conv2d_backward_weight_chosen(ctx_, s, x, dy, dw, false, OpScope::current());
  }
  // bf16 only (supports(kFp16Products) is false).
  void conv2d_forward_half(Precision p, const Conv2dShape& s, const float* x, const float* w,
                           const float* bias, float* y) override {
    if (p != Precision::Bf16) no_half_products(p, "conv2d_forward_half");
    count_conv("conv forward", s);
    cpu::conv2d_forward_chosen(ctx_, s, x, w, bias, y, true, OpScope::current());
  }
  void conv2d_backward_input_half(Precision p, const Conv2dShape& s, const float* dy,
                                  const float* w, float* dx) override {
    if (p != Precision::Bf16) no_half_products(p, "conv2d_backward_input_half");
    count_conv("conv backward input", s);
    cpu::conv2d_backward_input_chosen(ctx_, s, dy, w, dx, true, OpScope::current());
  }
  // towerflow's bf16 kernels add as they store; where the problem's choice is oneDNN, the caller
  // adds.
  bool conv2d_backward_input_half_add(Precision p, const Conv2dShape& s, const float* dy,
                                      const float* w, float* dx) override {
    if (p != Precision::Bf16) return false;
    if (!cpu::conv2d_backward_input_bf16_add_chosen(ctx_, s, dy, w, dx, OpScope::current())) return false;
    count_conv("conv backward input", s);
    return true;
  }
  void conv2d_backward_weight_half(Precision p, const Conv2dShape& s, const float* x,
                                   const float* dy, float* dw) override {
    if (p != Precision::Bf16) no_half_products(p, "conv2d_backward_weight_half");
    count_conv("conv backward weight", s);
    cpu::conv2d_backward_weight_chosen(ctx_, s, x, dy, dw, true, OpScope::current());
  }
  void conv2d_forward_bf16_input(const Conv2dShape& s, const bfloat16* x, const float* w,
                                 const float* bias, float* y) override {
    count_conv("conv forward", s);
    cpu::conv2d_forward_bf16_input_chosen(ctx_, s, reinterpret_cast<const std::uint16_t*>(x), w,
                                          bias, y, OpScope::current());
  }
  void conv2d_backward_weight_bf16_input(const Conv2dShape& s, const bfloat16* x,
                                         const float* dy, float* dw) override {
    count_conv("conv backward weight", s);
    cpu::conv2d_backward_weight_bf16_input_chosen(
        ctx_, s, reinterpret_cast<const std::uint16_t*>(x), dy, dw, OpScope::current());
  }
  void conv2d_forward_bf16_output(const Conv2dShape& s, const float* x, const bfloat16* x_bf16,
                                  const float* w, const float* bias, bfloat16* y) override {
    count_conv("conv forward", s);
    auto* out = reinterpret_cast<std::uint16_t*>(y);
    if (x_bf16)
      return cpu::conv2d_forward_bf16_output_chosen(ctx_, s, reinterpret_cast<const std::uint16_t*>(x_bf16),
                                                    w, bias, out, OpScope::current());
    cpu::conv2d_forward_bf16_output_chosen(ctx_, s, x, w, bias, out, OpScope::current());
  }
  void gemm_half(Precision p, bool trans_a, bool trans_b, int m, int n, int k, const float* a,
                 int lda, const float* b, int ldb, float* c, int ldc) override {
    if (p != Precision::Bf16) no_half_products(p, "gemm_half");
    count_gemm(trans_a, trans_b, m, n, k);
    cpu::gemm_chosen(ctx_, trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc, true,
                     OpScope::current());
  }
  void conv2d_backward_bias(const Conv2dShape& s, const float* dy, float* db) override {
    const auto span = kernel_span("conv2d_backward_bias", 1.0 * s.n * s.out_h() * s.out_w() * s.c_out);
    cpu::conv2d_backward_bias(ctx_, s, dy, db);
  }
  void max_pool_forward(const Pool2dShape& s, const float* x, float* y, std::int32_t* argmax,
                        bool relu) override {
    const auto span = kernel_span(relu ? "max_pool_relu_forward" : "max_pool_forward",
                                  pool_in(s) + 2.0 * pool_out(s));  // x; y, argmax
    if (relu)
      cpu::max_pool_relu_forward(ctx_, s, x, y, argmax);
    else
      cpu::max_pool_forward(ctx_, s, x, y, argmax);
  }
  void max_pool_relu_forward_bf16(const Pool2dShape& s, const float* x, bfloat16* y,
                                  std::int32_t* argmax) override {
    const auto span = kernel_span("max_pool_relu_forward_bf16", pool_in(s) + 1.5 * pool_out(s));  // x; y, argmax
    cpu::max_pool_relu_forward_bf16(ctx_, s, x, reinterpret_cast<std::uint16_t*>(y), argmax);
  }
  void max_pool_backward(const Pool2dShape& s, const float* dy, const std::int32_t* argmax,
                         float* dx) override {
    const auto span = kernel_span("max_pool_backward", 2.0 * pool_out(s) + pool_in(s));  // dy, argmax; dx
    cpu::max_pool_backward(ctx_, s, dy, argmax, dx);
  }
  void max_pool_backward_channel_sums(const Pool2dShape& s, const float* dy, const std::int32_t* argmax,
                                      float* dx, float* sums) override {
    const auto span = kernel_span("max_pool_backward", 2.0 * pool_out(s) + pool_in(s));  // dy, argmax; dx
    cpu::max_pool_backward_channel_sums(ctx_, s, dy, argmax, dx, sums);
  }
  int conv_pool_chunk_images(const Conv2dShape& s) const override {
    const std::int64_t image = std::int64_t{s.out_h()} * s.out_w() * s.c_out * std::int64_t{sizeof(float)};
    if (s.n * image <= kConvPoolWholeBytes) return s.n;
    return static_cast<int>(std::clamp<std::int64_t>(kConvPoolChunkBytes / image, 1, s.n));
  }
  // In bf16, where the weight gradient's choice is settled on towerflow's pair kernels: the pool's
  // gradient is made a few rows at a time as the weight gradient's passes read them (Note [A pool
  // gradient inside the weight gradient]).
  bool conv2d_backward_weight_through_max_pool(Precision p, const Conv2dShape& cs, const float* x,
                                               const Pool2dShape& ps, const float* g, const std::int32_t* argmax,
                                               float* dw, float* sums) override {
    if (p != Precision::Bf16 || argmax == nullptr) return false;
    const std::int64_t rows = std::int64_t{ps.n} * ps.h;
    thread_local std::vector<float> row_sums;  // kept from step to step: the pass allocates nothing
    if (sums) row_sums.resize(static_cast<std::size_t>(rows * ps.c));
    float* row_sums_data = row_sums.data();
    const auto dy_rows = [&](int n, int row0, int count, float* buf, bool first) {
      const std::int64_t r = std::int64_t{n} * ps.h + row0;
      cpu::max_pool_backward_rows(ps, g, argmax, r, r + count, buf,
                                  sums && first ? row_sums_data + r * ps.c : nullptr);
      return static_cast<const float*>(buf);
    };
    if (!cpu::conv2d_backward_weight_bf16_dy_rows_chosen(ctx_, cs, x, dy_rows, dw)) return false;
    count_conv("conv backward weight", cs);
    if (sums) {
      // The rows' float sums in double, in row order: the same for any thread count.
      thread_local std::vector<double> total;
      total.assign(static_cast<std::size_t>(ps.c), 0.0);
      for (std::int64_t r = 0; r < rows; ++r)
        for (int ch = 0; ch < ps.c; ++ch) total[ch] += row_sums_data[r * ps.c + ch];
      for (int ch = 0; ch < ps.c; ++ch) sums[ch] = static_cast<float>(total[ch]);
    }
    return true;
  }
  void avg_pool_forward(const Pool2dShape& s, const float* x, float* y) override {
    const auto span = kernel_span("avg_pool_forward", pool_in(s) + pool_out(s));
    cpu::avg_pool_forward(ctx_, s, x, y);
  }
  void avg_pool_backward(const Pool2dShape& s, const float* dy, float* dx) override {
    const auto span = kernel_span("avg_pool_backward", pool_out(s) + pool_in(s));
    cpu::avg_pool_backward(ctx_, s, dy, dx);
  }

  void batch_norm_forward_training(std::int64_t rows, int c, const float* x,
                                   const float* residual, bool relu, const float* gamma,
                                   const float* beta, float eps, float momentum,
                                   float* running_mean, float* running_var, float* y,
                                   float* save_mean, float* save_invstd) override {
    // x read twice (statistics, then normalisation), the residual read, y written.
    const auto span = kernel_span(residual ? "batch_norm_add_relu_forward" : relu ? "batch_norm_relu_forward"
                                                                              : "batch_norm_forward",
                                  (residual ? 4.0 : 3.0) * rows * c);
    if (residual) {
      TW_CHECK(relu, "batch norm with a residual is only fused with relu");
      cpu::batch_norm_add_relu_forward_training(ctx_, rows, c, x, residual, gamma, beta, eps, y,
                                                save_mean, save_invstd);
    } else if (relu) {
      cpu::batch_norm_relu_forward_training(ctx_, rows, c, x, gamma, beta, eps, y, save_mean,
                                            save_invstd);
    } else {
      cpu::batch_norm_forward_training(ctx_, rows, c, x, gamma, beta, eps, y, save_mean,
                                       save_invstd);
    }
    update_running(rows, c, eps, momentum, save_mean, save_invstd, running_mean, running_var);
  }
  void batch_norm_relu_forward_training_bf16(std::int64_t rows, int c, const float* x,
                                             const float* gamma, const float* beta, float eps,
                                             float momentum, float* running_mean,
                                             float* running_var, bfloat16* y, float* save_mean,
                                             float* save_invstd) override {
    // x read twice, y written in half a float each.
    const auto span = kernel_span("batch_norm_relu_forward_bf16", 2.5 * rows * c);
    cpu::batch_norm_relu_forward_training_bf16(ctx_, rows, c, x, gamma, beta, eps,
                                               reinterpret_cast<std::uint16_t*>(y), save_mean,
                                               save_invstd);
    update_running(rows, c, eps, momentum, save_mean, save_invstd, running_mean, running_var);
  }
  void batch_norm_forward_training_bf16_input(std::int64_t rows, int c, const bfloat16* xb,
                                              const float* residual, const bfloat16* residual_bf16,
                                              bool relu, const float* gamma, const float* beta,
                                              float eps, float momentum, float* running_mean,
                                              float* running_var, float* y, bfloat16* y_bf16,
                                              float* save_mean, float* save_invstd) override {
    // x read twice in half a float each, the residual read (in half a float as bf16), y written
    // (in half a float as bf16).
    const bool add = residual || residual_bf16;
    const auto span = kernel_span(add      ? "batch_norm_add_relu_forward_bf16_input"
                                  : y_bf16 ? "batch_norm_relu_forward_bf16_io"
                                  : relu   ? "batch_norm_relu_forward_bf16_input"
                                           : "batch_norm_forward_bf16_input",
                                  (1.0 + (residual ? 1.0 : residual_bf16 ? 0.5 : 0.0) + (y_bf16 ? 0.5 : 1.0)) *
                                      rows * c);
    const auto* x = reinterpret_cast<const std::uint16_t*>(xb);
    TW_CHECK(!(residual && residual_bf16), "batch norm takes one residual, float32 or bf16");
    TW_CHECK(!y_bf16 || (relu && !y), "batch norm stores bf16 only after a ReLU, and one output");
    if (add) {
      TW_CHECK(relu, "batch norm with a residual is only fused with relu");
      cpu::batch_norm_add_relu_forward_training_bf16_input(
          ctx_, rows, c, x, residual, reinterpret_cast<const std::uint16_t*>(residual_bf16), gamma, beta,
          eps, y, reinterpret_cast<std::uint16_t*>(y_bf16), save_mean, save_invstd);
    } else if (y_bf16) {
      cpu::batch_norm_relu_forward_training_bf16_io(ctx_, rows, c, x, gamma, beta, eps,
                                                    reinterpret_cast<std::uint16_t*>(y_bf16),
                                                    save_mean, save_invstd);
    } else if (relu) {
      cpu::batch_norm_relu_forward_training_bf16_input(ctx_, rows, c, x, gamma, beta, eps, y,
                                                       save_mean, save_invstd);
    } else {
      cpu::batch_norm_forward_training_bf16_input(ctx_, rows, c, x, gamma, beta, eps, y,
                                                  save_mean, save_invstd);
    }
    update_running(rows, c, eps, momentum, save_mean, save_invstd, running_mean, running_var);
  }
  // The running statistics (where running_mean is not null) from a training forward's.
  static void update_running(std::int64_t rows, int c, float eps, float momentum,
                             const float* save_mean, const float* save_invstd,
                             float* running_mean, float* running_var) {
    if (!running_mean) return;
    // PyTorch updates the running variance with the unbiased batch variance.
    const double unbias = rows > 1 ? static_cast<double>(rows) / (rows - 1) : 1.0;
    for (int j = 0; j < c; ++j) {
      const double invstd = save_invstd[j];
      const double var = (1.0 / (invstd * invstd) - eps) * unbias;
      running_mean[j] = static_cast<float>((1.0 - momentum) * running_mean[j] +
                                           momentum * static_cast<double>(save_mean[j]));
      running_var[j] = static_cast<float>((1.0 - momentum) * running_var[j] + momentum * var);
    }
  }
  void batch_norm_forward_inference(std::int64_t rows, int c, const float* x, const float* gamma,
                                    const float* beta, const float* running_mean,
                                    const float* running_var, float eps, float* y) override {
    const auto span = kernel_span("batch_norm_inference", 2.0 * rows * c);
    cpu::batch_norm_forward_inference(ctx_, rows, c, x, gamma, beta, running_mean, running_var,
                                      eps, y);
  }
  void batch_norm_moments(std::int64_t rows, int c, const float* x, double* host_mean,
                          double* host_m2) override {
    const auto span = kernel_span("batch_norm_moments", 1.0 * rows * c);
    cpu::batch_norm_moments(ctx_, rows, c, x, host_mean, host_m2);
  }
  void batch_norm_forward_apply(std::int64_t rows, int c, const float* x, const float* residual,
                                bool relu, const float* gamma, const float* beta,
                                const float* mean, const float* invstd, float* y) override {
    const auto span = kernel_span("batch_norm_forward_apply", (residual ? 3.0 : 2.0) * rows * c);
    cpu::batch_norm_forward_apply(ctx_, rows, c, x, residual, relu, gamma, beta, mean, invstd, y);
  }
  void batch_norm_backward_reduce(std::int64_t rows, int c, const float* x, const float* y,
                                  bool relu, const float* dy, const float* mean,
                                  double* host_sum_g, double* host_sum_gxc,
                                  float* d_pre_relu) override {
    // x, dy (and y) read; the gradient before the ReLU written where asked for.
    const auto span = kernel_span("batch_norm_backward_reduce",
                                  (2.0 + (relu ? 1 : 0) + (d_pre_relu ? 1 : 0)) * rows * c);
    cpu::batch_norm_backward_reduce(ctx_, rows, c, x, relu ? y : nullptr, dy, mean, host_sum_g,
                                    host_sum_gxc, d_pre_relu);
  }
  void batch_norm_backward_apply(std::int64_t rows, int c, const float* x, const float* y,
                                 bool relu, const float* dy, const float* gamma,
                                 const float* mean, const float* invstd, const float* mean_g,
                                 const float* mean_gxhat, float* dx) override {
    const auto span = kernel_span("batch_norm_backward_apply", (3.0 + (relu ? 1 : 0)) * rows * c);
    cpu::batch_norm_backward_apply(ctx_, rows, c, x, relu ? y : nullptr, dy, gamma, mean, invstd,
                                   mean_g, mean_gxhat, dx);
  }
  // core/cpu/batch_norm.h's kernels read each element of dy before they write dx, or d_pre_relu,
  // there.
  bool batch_norm_backward_in_place() const override { return true; }
  void batch_norm_backward(std::int64_t rows, int c, const float* x, const float* y, bool relu,
                           const float* dy, const float* gamma, const float* beta,
                           const float* save_mean, const float* save_invstd, float /*eps*/,
                           float* dx, float* dgamma, float* dbeta, float* d_pre_relu) override {
    // Two passes (reduce, then apply): x and dy read in each, dx written. Under a ReLU without a
    // residual the mask is recomputed from x (Note [The ReLU mask from x]); with the residual
    // the reduce reads y and writes the masked gradient, which the apply reads instead of dy.
    const auto span = kernel_span(!relu ? "batch_norm_backward"
                                  : d_pre_relu ? "batch_norm_add_relu_backward" : "batch_norm_relu_backward",
                                  (relu && d_pre_relu ? 7.0 : 5.0) * rows * c);
    // The CPU kernels read 1/sqrt(var + eps) from save_invstd and need eps no further.
    if (relu) {
      cpu::batch_norm_relu_backward(ctx_, rows, c, x, d_pre_relu ? y : nullptr, dy, gamma, beta,
                                    save_mean, save_invstd, dx, dgamma, dbeta, d_pre_relu);
    } else {
      cpu::batch_norm_backward(ctx_, rows, c, x, dy, gamma, save_mean, save_invstd, dx, dgamma,
                               dbeta);
    }
  }

  void batch_norm_backward_bf16_input(std::int64_t rows, int c, const bfloat16* xb, const float* y,
                                      const bfloat16* y_bf16, bool relu, const float* dy,
                                      const float* gamma, const float* beta,
                                      const float* save_mean, const float* save_invstd,
                                      float /*eps*/, float* dx, float* dgamma, float* dbeta,
                                      float* d_pre_relu) override {
    // batch_norm_backward's passes, x read in half a float each time (and y, where the reduce
    // reads it, in half a float as bf16).
    const auto span = kernel_span(!relu ? "batch_norm_backward_bf16_input"
                                  : d_pre_relu ? "batch_norm_add_relu_backward_bf16_input"
                                               : "batch_norm_relu_backward_bf16_input",
                                  (relu && d_pre_relu ? (y_bf16 ? 5.5 : 6.0) : 4.0) * rows * c);
    const auto* x = reinterpret_cast<const std::uint16_t*>(xb);
    if (relu) {
      cpu::batch_norm_relu_backward_bf16_input(ctx_, rows, c, x, d_pre_relu ? y : nullptr,
                                               d_pre_relu ? reinterpret_cast<const std::uint16_t*>(y_bf16) : nullptr,
                                               dy, gamma, beta, save_mean, save_invstd, dx, dgamma,
                                               dbeta, d_pre_relu);
    } else {
      cpu::batch_norm_backward_bf16_input(ctx_, rows, c, x, dy, gamma, save_mean, save_invstd, dx,
                                          dgamma, dbeta);
    }
  }

  void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
            const float* b, int ldb, float beta, float* c, int ldc) override {
    count_gemm(trans_a, trans_b, m, n, k);
    if (alpha == 1.0f && beta == 0.0f)
      return cpu::gemm_chosen(ctx_, trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc, false,
                              OpScope::current());
    cpu::gemm(ctx_, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }

  // ---- dropout -------------------------------------------------------------------------------
  void dropout_forward(std::int64_t n, float p, std::uint64_t seed, std::uint64_t offset,
                       const float* x, float* y, std::uint8_t* mask) override {
    const auto span = kernel_span("dropout_forward", 2.25 * n);  // x, y and a byte of mask each
    const float keep_scale = 1.0f / (1.0f - p);
    each(n, [&](std::int64_t s, std::int64_t e) {
      for (std::int64_t i = s; i < e; ++i) {
        const bool keep = dropout_keeps(seed, offset + static_cast<std::uint64_t>(i), p);
        mask[i] = keep ? 1 : 0;
        y[i] = keep ? x[i] * keep_scale : 0.0f;
      }
    });
  }
  void dropout_backward(std::int64_t n, float p, const std::uint8_t* mask, const float* dy,
                        float* dx) override {
    const auto span = kernel_span("dropout_backward", 2.25 * n);
    const float keep_scale = 1.0f / (1.0f - p);
    each(n, [&](std::int64_t s, std::int64_t e) {
      for (std::int64_t i = s; i < e; ++i) dx[i] = mask[i] ? dy[i] * keep_scale : 0.0f;
    });
  }

  // ---- loss and metrics ----------------------------------------------------------------------
  void softmax_cross_entropy_forward(std::int64_t rows, int classes, const float* logits,
                                     const std::int32_t* labels, float scale, float smoothing,
                                     float* loss_out, float* probs) override {
    check_labels(rows, classes, labels);
    // Rows are independent and few (a batch); the loss is summed in double in row order so it
    // does not depend on the thread count.
    std::vector<double> row_loss(static_cast<std::size_t>(rows));
    ctx_.parallel_for(rows, 64, [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r) {
        const float* z = logits + r * classes;
        float* p = probs + r * classes;
        const float zmax = *std::max_element(z, z + classes);
        double denom = 0, zsum = 0;
        for (int j = 0; j < classes; ++j) {
          p[j] = std::exp(z[j] - zmax);
          denom += p[j];
          zsum += z[j];
        }
        const float inv = static_cast<float>(1.0 / denom);
        for (int j = 0; j < classes; ++j) p[j] *= inv;
        const double lse = zmax + std::log(denom);
        // -sum_j q_j (z_j - lse) with q = (1 - s) onehot + s / classes.
        row_loss[static_cast<std::size_t>(r)] =
            lse - (1.0 - smoothing) * z[labels[r]] - smoothing * zsum / classes;
      }
    });
    double total = 0;
    for (double l : row_loss) total += l;
    loss_out[0] = static_cast<float>(total / scale);
  }
  void softmax_cross_entropy_backward(std::int64_t rows, int classes, const float* probs,
                                      const std::int32_t* labels, float scale, float smoothing,
                                      const float* dloss, float* dlogits) override {
    const float g = dloss[0] / scale;
    const float uniform = smoothing / static_cast<float>(classes);
    ctx_.parallel_for(rows, 64, [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r) {
        const float* p = probs + r * classes;
        float* d = dlogits + r * classes;
        for (int j = 0; j < classes; ++j) d[j] = g * (p[j] - uniform);
        d[labels[r]] -= g * (1.0f - smoothing);
      }
    });
  }
  void top_k_correct(std::int64_t rows, int classes, const float* logits,
                     const std::int32_t* labels, int k, std::int32_t* correct_out) override {
    check_labels(rows, classes, labels);
    std::int32_t correct = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* z = logits + r * classes;
      const int label = labels[r];
      // A row with a NaN or an infinity is never correct (TensorFlow's InTopK): nothing compares
      // greater than NaN, so its label would otherwise rank first.
      bool finite = true;
      int above = 0;  // entries ranked above the label
      for (int j = 0; j < classes; ++j) {
        finite = finite && std::isfinite(z[j]);
        if (z[j] > z[label] || (z[j] == z[label] && j < label)) ++above;
      }
      if (finite && above < k) ++correct;
    }
    correct_out[0] = correct;
  }

 private:
  template <typename Fn>
  void each(std::int64_t n, Fn&& fn) const {
    ctx_.parallel_for(n, kMinElementsPerThread, fn);
  }
  template <typename Fn>
  void rows_loop(std::int64_t rows, int c, Fn&& fn) const {
    ctx_.parallel_for(rows, std::max<std::int64_t>(1, kMinElementsPerThread / std::max(1, c)), fn);
  }
  void parallel_copy(void* dst, const void* src, std::size_t bytes) const {
    if (bytes == 0 || dst == src) return;
    auto* d = static_cast<char*>(dst);
    const auto* s = static_cast<const char*>(src);
    ctx_.parallel_for(static_cast<std::int64_t>(bytes), 256 * 1024,
                      [&](std::int64_t b, std::int64_t e) { std::memcpy(d + b, s + b, e - b); });
  }
  static void check_labels(std::int64_t rows, int classes, const std::int32_t* labels) {
    for (std::int64_t r = 0; r < rows; ++r)
      if (labels[r] < 0 || labels[r] >= classes)
        raise<InvalidArgument>("label ", labels[r], " at row ", r, " is outside [0, ", classes,
                               "); labels must be class indices of the ", classes,
                               "-class logits");
  }

  Device device_;
  Allocator& allocator_;
  cpu::CpuContext ctx_;
  std::vector<OpKind> missing_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const Device& device, Allocator& allocator,
                                          int threads, std::vector<OpKind> missing) {
  return std::make_unique<CpuBackend>(device, allocator, threads, std::move(missing));
}

const cpu::CpuContext& cpu_context_for(const Device& cpu_device) {
  if (!cpu_device.is_cpu())
    raise<InvalidArgument>("cpu_context_for(", cpu_device, "): not a CPU device");
  auto* be = dynamic_cast<CpuBackend*>(&backend_for(cpu_device));
  if (!be)
    raise<InvalidArgument>("cpu_context_for(", cpu_device,
                           "): the device's backend is not the CPU backend");
  return be->context();
}

}  // namespace towerflow
