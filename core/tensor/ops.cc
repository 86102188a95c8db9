#include "core/tensor/ops.h"
#include "core/tensor/precision.h"

#include <cmath>
#include <mutex>
#include <set>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "core/trace.h"
#include "core/platform/registry.h"
#include "core/tensor/autograd.h"
#include "core/tensor/backend_impl.h"
#include "core/tensor/batch_norm_sync.h"

namespace towerflow {

// ---- naming and placement ---------------------------------------------------------------------

namespace {
thread_local std::string t_scope;
}

OpScope::OpScope(std::string name, bool trace_span) : previous_(std::move(t_scope)) {
  if (trace_span && trace::enabled()) span_.emplace("layer", name);
  t_scope = std::move(name);
}
OpScope::~OpScope() { t_scope = std::move(previous_); }
const std::string& OpScope::current() { return t_scope; }

namespace {


std::mutex g_log_mu;
std::set<std::string> g_logged;  // placement lines already printed

void log_once(const std::string& key, const std::string& message, bool warning) {
  {
    std::lock_guard lock(g_log_mu);
    if (!g_logged.insert(key).second) return;
  }
  if (warning) log_warning(message);
  else log_info(message);
}

// Note [Soft placement of ops]
// An op runs where its inputs live. When that device's backend has no kernel for the op, soft
// placement (TensorFlow's allow_soft_placement) runs it on /cpu:0 instead: the op is called again
// with its inputs copied to the CPU and its result copied back. Tensor::to() is differentiable,
// so gradients take the same way back. Without soft placement this is an error naming the op, the
// device and the option. Either way the decision is per call, so a backend that gains a kernel
// needs no change here.
//
// Returns true when the caller must run the op on the CPU instead.
bool run_on_cpu_instead(std::string_view op, OpKind kind, const Device& d) {
  Backend& be = backend_for(d);
  const ProcessOptions& opts = process_options();
  if (be.supports(kind)) {
    if (opts.log_device_placement.value_or(false)) {
      const std::string& scope = OpScope::current();
      std::string name = scope.empty() ? std::string(op) : str(scope, "/", op);
      log_once(str(name, "@", d), str(name, ": (", op, "): ", d.full_name()), false);
    }
    return false;
  }
  if (!opts.allow_soft_placement.value_or(false))
    raise<DeviceError>("op ", op, " has no ", to_string(kind), " kernel on ", d, " (", be.name(),
                       "); set ProcessOptions::allow_soft_placement = true to run it on "
                       "/cpu:0, or keep the model on a device that has one");
  log_once(str("fallback:", op, "@", d),
           str("op ", op, " has no kernel on ", d, "; running it on /cpu:0 (allow_soft_placement)"),
           true);
  return true;
}

// The one device all defined inputs live on.
const Device& common_device(std::string_view op, std::initializer_list<const Tensor*> inputs) {
  const Tensor* first = nullptr;
  for (const Tensor* t : inputs) {
    if (!t->defined()) continue;
    if (!first) {
      first = t;
    } else if (t->device() != first->device()) {
      raise<InvalidArgument>(op, ": inputs live on different devices: ", first->describe(),
                             " and ", t->describe(), "; copy one with .to(device)");
    }
    if (!t->is_contiguous())
      raise<InvalidArgument>(op, ": input ", t->describe(), " is not contiguous");
  }
  if (!first) raise<InvalidArgument>(op, ": no defined input");
  return first->device();
}

void check_float(std::string_view op, const char* what, const Tensor& t) {
  if (t.defined() && t.dtype() == DType::kBFloat16)
    raise<InvalidArgument>(op, ": ", what, " ", t.describe(), " must be float32: only Conv2D "
                           "and batch norm inputs read bfloat16 (an output stored for those readers "
                           "alone, BatchNormOptions::readers, Pool2dOptions::readers or "
                           "Conv2dOptions::readers); give this op's input OutputReaders::kAny");
  if (t.defined() && t.dtype() != DType::kFloat32)
    raise<InvalidArgument>(op, ": ", what, " ", t.describe(), " must be float32");
}

void check_ndim(std::string_view op, const char* what, const Tensor& t, int ndim,
                const char* layout) {
  if (t.ndim() != ndim)
    raise<InvalidArgument>(op, ": ", what, " must be ", ndim, "-D ", layout, ", got ",
                           t.describe());
}

Tensor to_cpu(const Tensor& t) { return t.defined() ? t.to(Device::cpu(0)) : Tensor(); }

float* fptr(const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; }

Tensor empty_like(const Tensor& t) { return Tensor::empty(t.shape(), t.device(), t.dtype()); }

// Where a backward whose kernel may write over its output gradient g writes its input's
// gradient: g itself where gradient_reusable(g) (Note [Gradients written over the output's] in
// autograd.cc), else a fresh tensor of g's shape.
Tensor gradient_over(const Tensor& g) { return gradient_reusable(g) ? g : empty_like(g); }

// How convolutions and matrix products on device d multiply under the thread's precision
// (precision.h): in fp32; in bf16 or fp16 by kernels that read those types themselves (the
// backend's *_half: oneDNN's bf16 kernels, cuDNN and cuBLAS on tensor cores); or in bf16 or fp16
// by rounding the operands here for the fp32 kernels.
enum class Products { Fp32, Bf16Kernels, Fp16Kernels, Bf16Rounded, Fp16Rounded };

Products products_on(const Device& d) {
  switch (current_precision()) {
    case Precision::Bf16:
      return backend_for(d).supports(OpKind::kBf16Products) ? Products::Bf16Kernels
                                                            : Products::Bf16Rounded;
    case Precision::Fp16:
      return backend_for(d).supports(OpKind::kFp16Products) ? Products::Fp16Kernels
                                                            : Products::Fp16Rounded;
    default: return Products::Fp32;
  }
}

bool half_kernels(Products p) { return p == Products::Bf16Kernels || p == Products::Fp16Kernels; }
// The type the *_half kernels read under p.
Precision half_type(Products p) {
  return p == Products::Fp16Kernels ? Precision::Fp16 : Precision::Bf16;
}

// An operand of a convolution or matrix product: with Bf16Rounded or Fp16Rounded a copy rounded
// on its device (not part of the graph: the gradient passes the rounding unchanged; the copy is
// what backward keeps), otherwise the tensor itself. Keeping the copies costs memory: ResNet-20
// at 64 images per tower peaked at 157 MiB per device against 104 MiB in fp32. Rounding the kept
// tensors again in backward instead measured 104 MiB but 0.96x the speed (ResNet-20 and tfcnn,
// three alternating rounds on a 2-core Ice Lake Xeon), so the copies stay.
Tensor operand(const Tensor& t, Products p) {
  if ((p != Products::Bf16Rounded && p != Products::Fp16Rounded) || !t.defined()) return t;
  Tensor r = Tensor::empty(t.shape(), t.device());
  if (p == Products::Bf16Rounded)
    backend_for(t.device()).round_to_bf16(t.numel(), t.data<float>(), r.data<float>());
  else
    backend_for(t.device()).round_to_fp16(t.numel(), t.data<float>(), r.data<float>());
  return r;
}

// Note [bf16 activations]
// Under bf16 precision a convolution rounds its input to bf16 before it multiplies, so a tensor
// that only convolutions read loses nothing when it is stored in bf16 in the first place.
// batch_norm_relu in training does that where its caller says only convolutions read its output
// (BatchNormOptions::readers: ResNet's blocks for bn1, which feeds conv2 alone) and the device
// supports(kBf16Activations), and so does max_pool2d_relu (Pool2dOptions::readers: tfcnn's
// pool1, which feeds conv2 alone; its backward reads argmax only). The pass then writes 2 bytes per value instead of 4, the
// convolution reads 2 instead of 4 (forward and weight gradient), and the graph keeps that bf16
// tensor where it kept the float32 one (the batch norm's backward no longer holds it: the ReLU's
// mask comes from x, Backend::batch_norm_backward). Every result is the same, bit for bit: the
// convolution multiplies the same bf16 values either way, and the gradients are float32. The
// convolution reads the tensor as it is where its kernels multiply in bf16 (the CPU's oneDNN,
// AMX and vdpbf16ps kernels, Backend::conv2d_forward_bf16_input), and elsewhere widens it into
// the float32 copy that it would otherwise have rounded (the CPU's emulated bf16). GPUs keep
// float32 activations (no kernels for bf16 storage there yet).

// Note [bf16 convolution outputs]
// PyTorch's autocast stores a convolution's output in bf16 and its batch norm reads that. Under
// bf16 precision conv2d does the same where its caller says only a batch norm reads the output
// (Conv2dOptions::readers = kBatchNorm: ResNet's conv1, conv2 and shortcut convolutions) and the
// device supports(kBf16Activations) and multiplies in bf16 (kBf16Products): the kernels round
// their float32 sums to bf16 as they store them (oneDNN's and the Winograd kernels; the others
// round their float32 output in a pass of their own, Backend::conv2d_forward_bf16_output), and
// the batch norm widens each value as it reads it (Backend::batch_norm_forward_training_bf16_input),
// computing in float32 as before, so that the convolution writes, the batch norm reads twice and
// the graph keeps half the bytes. Unlike bf16 activations (above), this is a rounding of its own:
// the batch norm normalises the rounded values, as on GPUs (whose convolutions round their
// outputs to bf16 and back, docs/precision.md) and under autocast. The gradients stay float32.
// A batch norm in inference, or synchronised over towers, widens such an input into a float32
// copy first. Where bf16 is emulated (operands rounded for the float32 kernels), outputs stay
// float32: rounding them, and the operands once more inside the bf16 call, cost more than the
// batch norm saved (ResNet-20 at 0.90x, TOWERFLOW_CPU_ISA=avx2 TOWERFLOW_BF16_KERNELS=emulated on
// a 2-core Zen 4 EPYC).

// Note [bf16 block outputs]
// A ResNet block's output, relu(bn2(conv2(.)) + shortcut), is read by the next block's
// convolutions, which round it to bf16 anyway, and by that block's batch_norm_add_relu as its
// residual. Under bf16 precision, where its caller says so (BatchNormOptions::readers =
// kConvolutionsAndResidual: every block but the network's last, and the stem's batch norm) and
// the batch norm reads a bf16 x (a convolution's bf16 output, above) or adds no residual, the
// batch norm stores it in bf16, rounded to nearest even, and the next batch_norm_add_relu widens
// the residual as it reads it. The convolutions multiply the same bf16 values as before; the
// residual sum is what changes: it adds the rounded block output, a relative error of at most
// 2^-9 per value, as Keras's mixed_bfloat16 policy stores every layer's output in bf16. The
// pass then writes 2 bytes a value instead of 4, the next one reads 2 instead of 4, the
// convolutions read them without a conversion of their own, and the backward reads the ReLU's
// mask from the bf16 output (zero where the rounding made a positive value zero, which is the
// derivative of what was stored). The gradients stay float32. Where no kernel reads bf16
// (inference, synchronised batch norm, a device without kBf16Activations), the residual is
// widened into a float32 copy first, as x is.

// A bfloat16 tensor widened to float32 on its device (exact: what rounding its float32
// original to bf16 would give).
Tensor widened(const Tensor& t) {
  Tensor r = Tensor::empty(t.shape(), t.device());
  backend_for(t.device()).widen_bf16(t.numel(), t.data<bfloat16>(), r.data<float>());
  return r;
}

// widened(t) in the graph: t's gradient is the copy's, unchanged (op "Cast").
Tensor widened_recorded(const Tensor& t) {
  Tensor r = widened(t);
  if (needs_grad({&t})) record(r, "Cast", {t}, [](const Tensor& g) { return std::vector<Tensor>{g}; });
  return r;
}

// A convolution's input x as its kernels read it under p: a bfloat16 x as it is where they read
// bf16 (reads_bf16), else widened (under bf16 precision that is its rounding already); a float32
// x as operand() gives it.
Tensor conv_input(const Tensor& x, Products p, bool reads_bf16) {
  if (x.dtype() != DType::kBFloat16) return operand(x, p);
  if (reads_bf16) return x;
  return operand(widened(x), p == Products::Bf16Rounded ? Products::Fp32 : p);
}

// c = op(a) op(b) (row-major, gemm.h's arguments with alpha 1 and beta 0) as p multiplies.
void product(Backend& be, Products p, bool trans_a, bool trans_b, int m, int n, int k,
             const float* a, int lda, const float* b, int ldb, float* c, int ldc) {
  if (half_kernels(p))
    be.gemm_half(half_type(p), trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc);
  else
    be.gemm(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
}

}  // namespace

// ---- convolution ------------------------------------------------------------------------------

namespace {

// A convolution's forward: its shape and the operands as its kernels read them.
struct ConvForward {
  Conv2dShape s;
  Tensor xo, wo;
  Products p;
  bool reads_bf16;
};

// The checks of op's inputs (Conv2D's rules).
void check_conv_inputs(std::string_view op, const Tensor& x, const Tensor& w, const Tensor& bias,
                       Conv2dOptions opts) {
  if (x.defined() && x.dtype() != DType::kBFloat16) check_float(op, "input", x);
  check_float(op, "weight", w);
  check_float(op, "bias", bias);
  check_ndim(op, "input", x, 4, "NHWC [n, h, w, c_in]");
  check_ndim(op, "weight", w, 4, "OIHW [c_out, c_in, kh, kw]");
  if (w.dim(1) != x.dim(3))
    raise<InvalidArgument>(op, ": input ", shape_str(x.shape()), " (NHWC) has ", x.dim(3),
                           " channels but weight ", shape_str(w.shape()), " (OIHW) expects ",
                           w.dim(1));
  if (bias.defined() && (bias.ndim() != 1 || bias.dim(0) != w.dim(0)))
    raise<InvalidArgument>(op, ": bias ", shape_str(bias.shape()), " does not match weight ",
                           shape_str(w.shape()), "; expected [", w.dim(0), "]");
  if (opts.stride < 1 || opts.padding < 0)
    raise<InvalidArgument>(op, ": stride ", opts.stride, " must be >= 1 and padding ",
                           opts.padding, " >= 0");
  if (x.dim(1) + 2 * opts.padding < w.dim(2) || x.dim(2) + 2 * opts.padding < w.dim(3))
    raise<InvalidArgument>(op, ": kernel ", w.dim(2), "x", w.dim(3), " is larger than the input ",
                           shape_str(x.shape()), " padded by ", opts.padding);
}

// The convolution of x and w on device d as its kernels read it: shape, products and operands,
// no output yet.
ConvForward conv_operands(const Device& d, const Tensor& x, const Tensor& w, Conv2dOptions opts) {
  ConvForward f;
  f.s = Conv2dShape{.n = static_cast<int>(x.dim(0)), .h = static_cast<int>(x.dim(1)),
                    .w = static_cast<int>(x.dim(2)), .c_in = static_cast<int>(x.dim(3)),
                    .c_out = static_cast<int>(w.dim(0)), .kh = static_cast<int>(w.dim(2)),
                    .kw = static_cast<int>(w.dim(3)), .stride_h = opts.stride,
                    .stride_w = opts.stride, .pad_h = opts.padding, .pad_w = opts.padding};
  f.p = products_on(d);
  f.reads_bf16 = x.dtype() == DType::kBFloat16 && f.p == Products::Bf16Kernels &&
                 backend_for(d).supports(OpKind::kBf16Activations);
  f.xo = conv_input(x, f.p, f.reads_bf16);
  f.wo = operand(w, f.p);
  return f;
}

// y = the convolution of f's images [begin, end) plus bias, into y (those images' outputs).
void conv_images(Backend& be, const ConvForward& f, int begin, int end, const Tensor& bias, float* y) {
  Conv2dShape s = f.s;
  s.n = end - begin;
  const std::int64_t offset = std::int64_t{begin} * s.h * s.w * s.c_in;
  if (f.reads_bf16)
    be.conv2d_forward_bf16_input(s, f.xo.data<bfloat16>() + offset, f.wo.data<float>(), fptr(bias), y);
  else if (half_kernels(f.p))
    be.conv2d_forward_half(half_type(f.p), s, f.xo.data<float>() + offset, f.wo.data<float>(), fptr(bias), y);
  else
    be.conv2d_forward(s, f.xo.data<float>() + offset, f.wo.data<float>(), fptr(bias), y);
}

// The gradients {dx, dw, db} of the convolution f (its y left out) for y's gradient g: dx where
// need_dx, dw where need_dw, and db where bias requires grad, from g unless computed is defined.
// partial_x: x's gradient so far, to add dx into (Note [Gradients summed in place] in
// autograd.cc), or undefined.
std::vector<Tensor> conv_backward(const ConvForward& f, const Tensor& bias, bool need_dx, bool need_dw,
                                  const Tensor& g, const Tensor& partial_x, Tensor computed_db) {
  const Conv2dShape& s = f.s;
  Backend& be = backend_for(g.device());
  const Tensor go = operand(g, f.p);
  const bool by_half_kernels = half_kernels(f.p);
  Tensor dx, dw, db;
  // x's gradient added to what its other consumers gave, where the backend adds as it stores.
  const auto added = [&] {
    float* sum = partial_x.data<float>();
    if (by_half_kernels)
      return be.conv2d_backward_input_half_add(half_type(f.p), s, go.data<float>(), f.wo.data<float>(), sum);
    return be.conv2d_backward_input_add(s, go.data<float>(), f.wo.data<float>(), sum);
  };
  if (need_dx && partial_x.defined() && partial_x.dtype() == DType::kFloat32 &&
      partial_x.is_contiguous() && partial_x.shape() == f.xo.shape() && added()) {
    dx = partial_x;
  } else if (need_dx) {
    dx = Tensor::empty(f.xo.shape(), g.device());  // float32 whatever x's type
    if (by_half_kernels)
      be.conv2d_backward_input_half(half_type(f.p), s, go.data<float>(), f.wo.data<float>(),
                                    dx.data<float>());
    else
      be.conv2d_backward_input(s, go.data<float>(), f.wo.data<float>(), dx.data<float>());
  }
  if (need_dw) {
    dw = empty_like(f.wo);
    if (f.reads_bf16)
      be.conv2d_backward_weight_bf16_input(s, f.xo.data<bfloat16>(), go.data<float>(), dw.data<float>());
    else if (by_half_kernels)
      be.conv2d_backward_weight_half(half_type(f.p), s, f.xo.data<float>(), go.data<float>(),
                                     dw.data<float>());
    else
      be.conv2d_backward_weight(s, f.xo.data<float>(), go.data<float>(), dw.data<float>());
  }
  if (bias.defined() && bias.requires_grad()) {
    if (computed_db.defined()) {
      db = std::move(computed_db);
    } else {
      db = empty_like(bias);
      be.conv2d_backward_bias(s, g.data<float>(), db.data<float>());
    }
  }
  return std::vector<Tensor>{dx, dw, db};
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, Conv2dOptions opts) {
  constexpr std::string_view kOp = "Conv2D";
  const trace::Span trace_span("op", kOp, OpScope::current());
  const Device d = common_device(kOp, {&x, &w, &bias});
  check_conv_inputs(kOp, x, w, bias, opts);
  if (run_on_cpu_instead(kOp, OpKind::kConv2d, d)) {
    Conv2dOptions on_cpu = opts;  // float32 for d, which may not read bf16
    on_cpu.readers = OutputReaders::kAny;
    return conv2d(to_cpu(x), to_cpu(w), to_cpu(bias), on_cpu).to(d);
  }
  ConvForward f = conv_operands(d, x, w, opts);
  Backend& be = backend_for(d);
  Tensor y;
  if (opts.readers == OutputReaders::kBatchNorm && f.p == Products::Bf16Kernels &&
      be.supports(OpKind::kBf16Activations)) {  // Note [bf16 convolution outputs]
    y = Tensor::empty({f.s.n, f.s.out_h(), f.s.out_w(), f.s.c_out}, d, DType::kBFloat16);
    be.conv2d_forward_bf16_output(f.s, f.reads_bf16 ? nullptr : f.xo.data<float>(),
                                  f.reads_bf16 ? f.xo.data<bfloat16>() : nullptr, f.wo.data<float>(),
                                  fptr(bias), y.data<bfloat16>());
  } else {
    y = Tensor::empty({f.s.n, f.s.out_h(), f.s.out_w(), f.s.c_out}, d);
    conv_images(be, f, 0, f.s.n, bias, y.data<float>());
  }
  if (needs_grad({&x, &w, &bias})) {
    record_summing(y, std::string(kOp), {x, w, bias},
                   [f = std::move(f), bias, need_dx = x.requires_grad(), need_dw = w.requires_grad()](
                       const Tensor& g, const std::vector<Tensor>& partial) {
      // x's gradient added to what its other consumers gave, where the backend adds as it
      // stores (Note [Gradients summed in place] in autograd.cc).
      return conv_backward(f, bias, need_dx, need_dw, g, partial[0], Tensor());
    });
  }
  return y;
}

// ---- matrix products ---------------------------------------------------------------------------

Tensor bias_add(const Tensor& x, const Tensor& bias) {
  constexpr std::string_view kOp = "BiasAdd";
  const trace::Span trace_span("op", kOp, OpScope::current());
  const Device d = common_device(kOp, {&x, &bias});
  check_float(kOp, "input", x);
  check_float(kOp, "bias", bias);
  if (x.ndim() < 1 || bias.ndim() != 1 || bias.dim(0) != x.dim(-1))
    raise<InvalidArgument>(kOp, ": bias ", shape_str(bias.shape()),
                           " must be 1-D with the input's last dimension; input ",
                           shape_str(x.shape()));
  if (run_on_cpu_instead(kOp, OpKind::kElementwise, d))
    return bias_add(to_cpu(x), to_cpu(bias)).to(d);
  const int c = static_cast<int>(bias.dim(0));
  const std::int64_t rows = c ? x.numel() / c : 0;
  Tensor y = empty_like(x);
  backend_for(d).bias_add(rows, c, x.data<float>(), bias.data<float>(), y.data<float>());
  if (needs_grad({&x, &bias})) {
    record(y, std::string(kOp), {x, bias}, [rows, c, bias](const Tensor& g) {
      Tensor db;
      if (bias.requires_grad()) {
        db = empty_like(bias);
        backend_for(g.device()).sum_rows(rows, c, g.data<float>(), db.data<float>());
      }
      return std::vector<Tensor>{g, db};
    });
  }
  return y;
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  constexpr std::string_view kOp = "MatMul";
  const trace::Span trace_span("op", kOp, OpScope::current());
  const Device d = common_device(kOp, {&x, &w, &bias});
  check_float(kOp, "input", x);
  check_float(kOp, "weight", w);
  check_float(kOp, "bias", bias);
  check_ndim(kOp, "input", x, 2, "[n, in]");
  check_ndim(kOp, "weight", w, 2, "[out, in]");
  if (w.dim(1) != x.dim(1))
    raise<InvalidArgument>(kOp, ": input ", shape_str(x.shape()), " has ", x.dim(1),
                           " features but weight ", shape_str(w.shape()), " ([out, in]) expects ",
                           w.dim(1));
  if (bias.defined() && (bias.ndim() != 1 || bias.dim(0) != w.dim(0)))
    raise<InvalidArgument>(kOp, ": bias ", shape_str(bias.shape()), " does not match weight ",
                           shape_str(w.shape()));
  if (run_on_cpu_instead(kOp, OpKind::kGemm, d))
    return linear(to_cpu(x), to_cpu(w), to_cpu(bias)).to(d);
  const int n = static_cast<int>(x.dim(0)), in = static_cast<int>(x.dim(1)),
            out = static_cast<int>(w.dim(0));
  Tensor y = Tensor::empty({n, out}, d);
  Backend& be = backend_for(d);
  const Products p = products_on(d);
  const Tensor xo = operand(x, p), wo = operand(w, p);
  product(be, p, false, true, n, out, in, xo.data<float>(), in, wo.data<float>(), in,
          y.data<float>(), out);
  if (bias.defined()) be.bias_add(n, out, y.data<float>(), bias.data<float>(), y.data<float>());
  if (needs_grad({&x, &w, &bias})) {
    record(y, std::string(kOp), {x, w, bias},
           [n, in, out, xo, wo, bias, p, need_dx = x.requires_grad(), need_dw = w.requires_grad()](const Tensor& g) {
      Backend& be = backend_for(g.device());
      const Tensor go = operand(g, p);
      Tensor dx, dw, db;
      if (need_dx) {  // dx = g w
        dx = empty_like(xo);
        product(be, p, false, false, n, in, out, go.data<float>(), out, wo.data<float>(), in,
                dx.data<float>(), in);
      }
      if (need_dw) {  // dw = g^T x
        dw = empty_like(wo);
        product(be, p, true, false, out, in, n, go.data<float>(), out, xo.data<float>(), in,
                dw.data<float>(), in);
      }
      if (bias.defined() && bias.requires_grad()) {
        db = empty_like(bias);
        be.sum_rows(n, out, g.data<float>(), db.data<float>());
      }
      return std::vector<Tensor>{dx, dw, db};
    });
  }
  return y;
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  constexpr std::string_view kOp = "MatMul";
  const trace::Span trace_span("op", kOp, OpScope::current());
  const Device d = common_device(kOp, {&a, &b});
  check_float(kOp, "a", a);
  check_float(kOp, "b", b);
  check_ndim(kOp, "a", a, 2, "[m, k]");
  check_ndim(kOp, "b", b, 2, "[k, n]");
  if (a.dim(1) != b.dim(0))
    raise<InvalidArgument>(kOp, ": shapes ", shape_str(a.shape()), " and ", shape_str(b.shape()),
                           " cannot be multiplied (inner dimensions ", a.dim(1), " != ", b.dim(0),
                           ")");
  if (run_on_cpu_instead(kOp, OpKind::kGemm, d)) return matmul(to_cpu(a), to_cpu(b)).to(d);
  const int m = static_cast<int>(a.dim(0)), k = static_cast<int>(a.dim(1)),
            n = static_cast<int>(b.dim(1));
  Tensor y = Tensor::empty({m, n}, d);
  const Products p = products_on(d);
  const Tensor ao = operand(a, p), bo = operand(b, p);
  product(backend_for(d), p, false, false, m, n, k, ao.data<float>(), k, bo.data<float>(), n,
          y.data<float>(), n);
  if (needs_grad({&a, &b})) {
    record(y, std::string(kOp), {a, b},
           [m, n, k, ao, bo, p, need_da = a.requires_grad(), need_db = b.requires_grad()](const Tensor& g) {
      Backend& be = backend_for(g.device());
      const Tensor go = operand(g, p);
      Tensor da, db;
      if (need_da) {  // da = g b^T
        da = empty_like(ao);
        product(be, p, false, true, m, k, n, go.data<float>(), n, bo.data<float>(), n,
                da.data<float>(), k);
      }
      if (need_db) {  // db = a^T g
        db = empty_like(bo);
        product(be, p, true, false, k, n, m, ao.data<float>(), k, go.data<float>(), n,
                db.data<float>(), n);
      }
      return std::vector<Tensor>{da, db};
    });
  }
  return y;
}

// ---- elementwise -------------------------------------------------------------------------------

Tensor relu(const Tensor& x) {
  constexpr std::string_view kOp = "Relu";
  const trace::Span trace_span("op", kOp, OpScope::current());
  const Device d = common_device(kOp, {&x});
  check_float(kOp, "input", x);
  if (run_on_cpu_instead(kOp, OpKind::kElementwise, d)) return relu(to_cpu(x)).to(d);
  Tensor y = empty_like(x);
  backend_for(d).relu_forward(x.numel(), x.data<float>(), y.data<float>());
  if (needs_grad({&x})) {
    // Keep y's data, not y itself: y owns this node, and a node holding y would be a cycle.
    record(y, std::string(kOp), {x}, [out = y.detach()](const Tensor& g) {
      Tensor dx = gradient_over(g);
      backend_for(g.device())
          .relu_backward(g.numel(), out.data<float>(), g.data<float>(), dx.data<float>());
      return std::vector<Tensor>{dx};
    });
  }
  return y;
}

Tensor gelu(const Tensor& x) {
  constexpr std::string_view kOp = "Gelu";
  const trace::Span trace_span("op", kOp, OpScope::current());
  const Device d = common_device(kOp, {&x});
  check_float(kOp, "input", x);
  if (run_on_cpu_instead(kOp, OpKind::kElementwise, d)) return gelu(to_cpu(x)).to(d);
  Tensor y = empty_like(x);
  backend_for(d).gelu_forward(x.numel(), x.data<float>(), y.data<float>());
  if (needs_grad({&x})) {
    record(y, std::string(kOp), {x}, [in = x.detach()](const Tensor& g) {
      Tensor dx = gradient_over(g);
      backend_for(g.device())
          .gelu_backward(g.numel(), in.data<float>(), g.data<float>(), dx.data<float>());
      return std::vector<Tensor>{dx};
    });
  }
  return y;
}

namespace {
void check_same_shape(std::string_view op, const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape())
    raise<InvalidArgument>(op, ": shapes differ: ", shape_str(a.shape()), " vs ",
                           shape_str(b.shape()));
}
}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  constexpr std::string_view kOp = "Add";
  const trace::Span trace_span("op", kOp, OpScope::current());
  const Device d = common_device(kOp, {&a, &b});
  check_float(kOp, "a", a);
  check_float(kOp, "b", b);
  check_same_shape(kOp, a, b);
  if (run_on_cpu_instead(kOp, OpKind::kElementwise, d)) return add(to_cpu(a), to_cpu(b)).to(d);
  Tensor y = empty_like(a);
  backend_for(d).add(a.numel(), a.data<float>(), b.data<float>(), y.data<float>());
  if (needs_grad({&a, &b}))
    record(y, std::string(kOp), {a, b},
           [](const Tensor& g) { return std::vector<Tensor>{g, g}; });
  return y;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  constexpr std::string_view kOp = "Mul";
  const trace::Span trace_span("op", kOp, OpScope::current());
  const Device d = common_device(kOp, {&a, &b});
  check_float(kOp, "a", a);
  check_float(kOp, "b", b);
  check_same_shape(kOp, a, b);
  if (run_on_cpu_instead(kOp, OpKind::kElementwise, d)) return mul(to_cpu(a), to_cpu(b)).to(d);
  Tensor y = empty_like(a);
  backend_for(d).mul(a.numel(), a.data<float>(), b.data<float>(), y.data<float>());
  if (needs_grad({&a, &b})) {
    record(y, std::string(kOp), {a, b}, [a, b](const Tensor& g) {
      Backend& be = backend_for(g.device());
      Tensor da, db;
      if (a.requires_grad()) {
        da = empty_like(g);
        be.mul(g.numel(), g.data<float>(), b.data<float>(), da.data<float>());
      }
      if (b.requires_grad()) {
        db = empty_like(g);
        be.mul(g.numel(), g.data<float>(), a.data<float>(), db.data<float>());
      }
      return std::vector<Tensor>{da, db};
    });
  }
  return y;
}

Tensor scale(const Tensor& x, float alpha) {
  constexpr std::string_view kOp = "Scale";
  const trace::Span trace_span("op", kOp, OpScope::current());
  const Device d = common_device(kOp, {&x});
  check_float(kOp, "input", x);
  if (run_on_cpu_instead(kOp, OpKind::kElementwise, d)) return scale(to_cpu(x), alpha).to(d);
  Tensor y = empty_like(x);
  backend_for(d).scale(x.numel(), alpha, x.data<float>(), y.data<float>());
  if (needs_grad({&x})) {
    record(y, std::string(kOp), {x}, [alpha](const Tensor& g) {
      Tensor dx = gradient_over(g);
      backend_for(g.device()).scale(g.numel(), alpha, g.data<float>(), dx.data<float>());
      return std::vector<Tensor>{dx};
    });
  }
  return y;
}

Tensor sum(const Tensor& x) {
  constexpr std::string_view kOp = "Sum";
  const trace::Span trace_span("op", kOp, OpScope::current());
  const Device d = common_device(kOp, {&x});
  check_float(kOp, "input", x);
  if (run_on_cpu_instead(kOp, OpKind::kElementwise, d)) return sum(to_cpu(x)).to(d);
  Tensor y = Tensor::empty({1}, d);
  backend_for(d).sum(x.numel(), x.data<float>(), y.data<float>());
  if (needs_grad({&x})) {
    record(y, std::string(kOp), {x}, [shape = x.shape()](const Tensor& g) {
      return std::vector<Tensor>{Tensor::full(shape, g.item(), g.device())};
    });
  }
  return y;
}

// ---- pooling -----------------------------------------------------------------------------------

namespace {
// The pool o over an NHWC input of shape `shape`.
Pool2dShape pool_shape(std::string_view op, const Shape& shape, Pool2dOptions o) {
  if (o.kernel < 1 || o.stride < 1 || o.padding < 0 || 2 * o.padding > o.kernel)
    raise<InvalidArgument>(op, ": kernel ", o.kernel, ", stride ", o.stride, ", padding ",
                           o.padding, " are invalid (kernel, stride >= 1; 0 <= padding <= kernel/2)");
  if (shape[1] + 2 * o.padding < o.kernel || shape[2] + 2 * o.padding < o.kernel)
    raise<InvalidArgument>(op, ": window ", o.kernel, "x", o.kernel,
                           " is larger than the padded input ", shape_str(shape));
  return Pool2dShape{.n = static_cast<int>(shape[0]), .h = static_cast<int>(shape[1]),
                     .w = static_cast<int>(shape[2]), .c = static_cast<int>(shape[3]),
                     .kh = o.kernel, .kw = o.kernel, .stride_h = o.stride, .stride_w = o.stride,
                     .pad_h = o.padding, .pad_w = o.padding};
}
Pool2dShape pool_shape(std::string_view op, const Tensor& x, Pool2dOptions o) {
  check_float(op, "input", x);
  check_ndim(op, "input", x, 4, "NHWC [n, h, w, c]");
  return pool_shape(op, x.shape(), o);
}
}  // namespace

namespace {
// A max pool's forward on d, unrecorded: y and argmax. With `relu`, max_pool2d_relu's: the ReLU on
// the pooled tensor, in the pool's pass each way (the forward marks the outputs the ReLU zeroes
// with argmax -1, which the pool's backward skips).
struct MaxPoolForward {
  Tensor y, argmax;
};
// Whether a max pool on d stores its output as bf16: where only convolutions read it (Note [bf16
// activations]); the backward reads argmax alone.
bool max_pool_stores_bf16(Backend& be, Pool2dOptions opts, bool relu) {
  return relu && opts.readers == OutputReaders::kConvolutions && current_precision() == Precision::Bf16 &&
         be.supports(OpKind::kBf16Activations);
}
// The output and argmax of a max pool s on d.
MaxPoolForward max_pool_outputs(const Device& d, const Pool2dShape& s, bool bf16_out) {
  MaxPoolForward f;
  f.y = Tensor::empty({s.n, s.out_h(), s.out_w(), s.c}, d, bf16_out ? DType::kBFloat16 : DType::kFloat32);
  f.argmax = Tensor::empty(f.y.shape(), d, DType::kInt32);
  return f;
}
// The pool s of x (s.n images) into images [begin, begin + s.n) of f.
void max_pool_images(Backend& be, const Pool2dShape& s, const float* x, bool relu, MaxPoolForward& f, int begin) {
  const std::int64_t offset = std::int64_t{begin} * s.out_h() * s.out_w() * s.c;
  std::int32_t* argmax = f.argmax.data<std::int32_t>() + offset;
  if (f.y.dtype() == DType::kBFloat16)
    be.max_pool_relu_forward_bf16(s, x, f.y.data<bfloat16>() + offset, argmax);
  else
    be.max_pool_forward(s, x, f.y.data<float>() + offset, argmax, relu);
}
MaxPoolForward max_pool_forward_on(const Device& d, const Tensor& x, const Pool2dShape& s,
                                   Pool2dOptions opts, bool relu) {
  Backend& be = backend_for(d);
  MaxPoolForward f = max_pool_outputs(d, s, max_pool_stores_bf16(be, opts, relu));
  max_pool_images(be, s, x.data<float>(), relu, f, 0);
  return f;
}

Tensor max_pool_impl(std::string_view op, const Tensor& x, Pool2dOptions opts, bool relu) {
  const trace::Span trace_span("op", op, OpScope::current());
  const Device d = common_device(op, {&x});
  const Pool2dShape s = pool_shape(op, x, opts);
  if (run_on_cpu_instead(op, OpKind::kMaxPool, d)) {
    Pool2dOptions on_cpu = opts;  // float32 for d, which may not read bf16 (Note [bf16 activations])
    on_cpu.readers = OutputReaders::kAny;
    return max_pool_impl(op, to_cpu(x), on_cpu, relu).to(d);
  }
  MaxPoolForward f = max_pool_forward_on(d, x, s, opts, relu);
  if (needs_grad({&x})) {
    record(f.y, std::string(op), {x}, [s, argmax = f.argmax, xs = x.shape()](const Tensor& g) {
      Tensor dx = Tensor::empty(xs, g.device());
      backend_for(g.device()).max_pool_backward(s, g.data<float>(), argmax.data<std::int32_t>(),
                                                dx.data<float>());
      return std::vector<Tensor>{dx};
    });
  }
  return f.y;
}
}  // namespace

Tensor max_pool2d(const Tensor& x, Pool2dOptions opts) { return max_pool_impl("MaxPool", x, opts, false); }

Tensor max_pool2d_relu(const Tensor& x, Pool2dOptions opts) {
  return max_pool_impl("MaxPoolRelu", x, opts, true);
}

// Note [A pool gradient inside the weight gradient]
// Where the convolution's input needs no gradient (a network's first layer: tfcnn's conv1), the
// weight gradient is the only reader of the convolution's output gradient, and that gradient is
// the pool's backward: at batch 128, tfcnn's is 32 MiB, written by the pool and read back from
// memory by the weight gradient. Backend::conv2d_backward_weight_through_max_pool lets a backend
// make it inside the weight gradient instead, a few rows at a time as the kernel's passes read
// them, while they are in cache. The CPU does so in bf16 where the weight gradient's kernel
// choice is settled on towerflow's pair kernels (core/cpu/bf16.h's DyRows; the first step, which
// measures the candidates, stores the gradient): the pool's gather (core/cpu/pool.h's
// max_pool_backward_rows) fills each pass's rows and their per-row channel sums, which the bias
// gradient adds in double in row order. The weight gradient has the bits of the stored
// gradient's; the bias gradient equals the other paths' to float rounding and is the same for
// any thread count. On a 2-core Zen 4 EPYC, tfcnn's conv1 gradient took 5.97-6.49 ms per bf16
// step against 6.44-6.69 through the stored gradient (`towerflow_bench_train --model tfcnn
// --precision bf16 --trace`, four alternating runs).
Tensor conv2d_max_pool2d_relu(const Tensor& x, const Tensor& w, const Tensor& bias, Conv2dOptions conv,
                              Pool2dOptions pool) {
  constexpr std::string_view kOp = "Conv2DMaxPoolRelu";
  const Device d = common_device(kOp, {&x, &w, &bias});
  check_conv_inputs(kOp, x, w, bias, conv);
  Backend& be = backend_for(d);
  if (!be.supports(OpKind::kConv2d) || !be.supports(OpKind::kMaxPool))
    return max_pool2d_relu(conv2d(x, w, bias, conv), pool);  // each on the device that can run it
  run_on_cpu_instead(kOp, OpKind::kConv2d, d);  // logs the placement where asked
  // Chunks of images whose convolution outputs the pool reads from cache (Note [Convolution and
  // pool in chunks of the batch]); the backward needs argmax, not the convolution's output.
  ConvForward f = conv_operands(d, x, w, conv);
  f.s.validate();  // an empty batch, before any chunk
  const int n = f.s.n, chunk = std::clamp(be.conv_pool_chunk_images(f.s), 1, n);
  const Pool2dShape s = pool_shape(kOp, Shape{n, f.s.out_h(), f.s.out_w(), f.s.c_out}, pool);
  const Tensor y = Tensor::empty({chunk, f.s.out_h(), f.s.out_w(), f.s.c_out}, d);  // each chunk's
  MaxPoolForward pooled = max_pool_outputs(d, s, max_pool_stores_bf16(be, pool, true));
  for (int begin = 0; begin < n; begin += chunk) {
    const int end = std::min(n, begin + chunk);
    {
      const trace::Span trace_span("op", "Conv2D", OpScope::current());
      conv_images(be, f, begin, end, bias, y.data<float>());
    }
    const trace::Span trace_span("op", "MaxPoolRelu", OpScope::current());
    Pool2dShape part = s;
    part.n = end - begin;
    max_pool_images(be, part, y.data<float>(), true, pooled, begin);
  }
  if (needs_grad({&x, &w, &bias})) {
    record_summing(pooled.y, std::string(kOp), {x, w, bias},
                   [f = std::move(f), s, argmax = pooled.argmax, bias, need_dx = x.requires_grad(),
                    need_dw = w.requires_grad()](const Tensor& g, const std::vector<Tensor>& partial) {
      Backend& gb = backend_for(g.device());
      const bool need_db = bias.defined() && bias.requires_grad();
      // Where x needs no gradient, the weight gradient alone reads the convolution's output
      // gradient: the backend may make it inside the weight gradient's passes (Note [A pool
      // gradient inside the weight gradient]).
      if (!need_dx && need_dw && half_kernels(f.p) && !f.reads_bf16) {
        Tensor dw = empty_like(f.wo);
        Tensor db = need_db ? empty_like(bias) : Tensor();
        if (gb.conv2d_backward_weight_through_max_pool(half_type(f.p), f.s, f.xo.data<float>(), s, g.data<float>(),
                                                       argmax.data<std::int32_t>(), dw.data<float>(),
                                                       need_db ? db.data<float>() : nullptr))
          return std::vector<Tensor>{Tensor(), dw, db};
      }
      // The convolution's output gradient, and its channel sums, the bias's gradient, in the
      // pool's pass (Note [Channel sums of a pool gradient] in core/cpu/pool.cc).
      Tensor dy = Tensor::empty({s.n, s.h, s.w, s.c}, g.device());
      Tensor db;
      if (need_db) {
        db = empty_like(bias);
        gb.max_pool_backward_channel_sums(s, g.data<float>(), argmax.data<std::int32_t>(), dy.data<float>(),
                                          db.data<float>());
      } else {
        gb.max_pool_backward(s, g.data<float>(), argmax.data<std::int32_t>(), dy.data<float>());
      }
      return conv_backward(f, bias, need_dx, need_dw, dy, partial[0], std::move(db));
    });
  }
  return pooled.y;
}

namespace {
Tensor avg_pool_impl(std::string_view op, const Tensor& x, const Pool2dShape& s) {
  const trace::Span trace_span("op", op, OpScope::current());
  const Device d = x.device();
  Tensor y = Tensor::empty({s.n, s.out_h(), s.out_w(), s.c}, d);
  backend_for(d).avg_pool_forward(s, x.data<float>(), y.data<float>());
  if (needs_grad({&x})) {
    record(y, std::string(op), {x}, [s, xs = x.shape()](const Tensor& g) {
      Tensor dx = Tensor::empty(xs, g.device());
      backend_for(g.device()).avg_pool_backward(s, g.data<float>(), dx.data<float>());
      return std::vector<Tensor>{dx};
    });
  }
  return y;
}
}  // namespace

Tensor avg_pool2d(const Tensor& x, Pool2dOptions opts) {
  constexpr std::string_view kOp = "AvgPool";
  const trace::Span trace_span("op", kOp, OpScope::current());
  const Device d = common_device(kOp, {&x});
  const Pool2dShape s = pool_shape(kOp, x, opts);
  if (run_on_cpu_instead(kOp, OpKind::kAvgPool, d)) return avg_pool2d(to_cpu(x), opts).to(d);
  return avg_pool_impl(kOp, x, s);
}

Tensor global_avg_pool(const Tensor& x) {
  constexpr std::string_view kOp = "Mean";
  const trace::Span trace_span("op", kOp, OpScope::current());
  const Device d = common_device(kOp, {&x});
  check_float(kOp, "input", x);
  check_ndim(kOp, "input", x, 4, "NHWC [n, h, w, c]");
  if (run_on_cpu_instead(kOp, OpKind::kAvgPool, d)) return global_avg_pool(to_cpu(x)).to(d);
  const int h = static_cast<int>(x.dim(1)), w = static_cast<int>(x.dim(2));
  const Pool2dShape s{.n = static_cast<int>(x.dim(0)), .h = h, .w = w,
                      .c = static_cast<int>(x.dim(3)), .kh = h, .kw = w, .stride_h = h,
                      .stride_w = w};
  return avg_pool_impl(kOp, x, s).view({x.dim(0), x.dim(3)});
}

// ---- batch norm --------------------------------------------------------------------------------

// Note [Synchronised batch norm]
// With BatchNormOptions::sync, every member of the group (one per tower) normalises with the
// statistics of all the members' rows together, so N towers train exactly as one tower over the
// global batch. Forward: each member computes its slice's per-channel mean and M2 (the sum of
// squared deviations from that mean), the members all-gather (rows, mean, M2), and each merges
// them in member order with Chan's pairwise formula: no sum x^2 - n mean^2 cancellation, the
// slices weighted by their row counts (so a 3:1 split is exact), and the same bits on every
// member. The global mean and biased variance normalise; the unbiased variance with the global
// count updates the running averages, which stay identical on every replica. Backward: each
// member reduces sum(g) and sum(g (x - mean)) over its rows, the members add them up (gathered,
// in member order), and dx uses the global means: exactly batch norm's input gradient over the
// global batch. dgamma and dbeta remain the member's own sums, because the gradient reduction that
// follows (all-reduce, parameter device) adds them up like every other parameter's gradient.
// The exchanged vectors are tiny (2c + 1 doubles forward, 2c backward) and pass through the host.

namespace {

Tensor batch_norm_sync_training(std::string_view op, const Device& d, std::int64_t rows, int c,
                                const Tensor& x, const Tensor& residual, bool relu_on,
                                const Tensor& gamma, const Tensor& beta,
                                const Tensor& running_mean, const Tensor& running_var,
                                BatchNormOptions opts) {
  Backend& be = backend_for(d);
  BatchNormSync* sync = opts.sync;
  const int members = sync->size();
  const std::size_t cs = static_cast<std::size_t>(c);

  // (rows, mean[c], M2[c]) of every member, merged in member order.
  std::vector<double> send(1 + 2 * cs), all(static_cast<std::size_t>(members) * (1 + 2 * cs));
  send[0] = static_cast<double>(rows);
  be.batch_norm_moments(rows, c, x.data<float>(), send.data() + 1, send.data() + 1 + cs);
  sync->all_gather(send, all);
  double count = 0;
  std::vector<double> mean(cs, 0.0), m2(cs, 0.0);
  for (int j = 0; j < members; ++j) {
    const double* p = all.data() + static_cast<std::size_t>(j) * (1 + 2 * cs);
    const double nj = p[0];
    if (nj <= 0) continue;
    const double total = count + nj;
    for (std::size_t ch = 0; ch < cs; ++ch) {
      const double delta = p[1 + ch] - mean[ch];
      mean[ch] += delta * (nj / total);
      m2[ch] += p[1 + cs + ch] + delta * delta * (count * nj / total);
    }
    count = total;
  }
  if (count < 2)  // the same decision on every member: no one is left waiting
    raise<InvalidArgument>(op, ": training needs more than one value per channel, got ", count,
                           " over the ", members, " towers of synchronised batch norm (input ",
                           shape_str(x.shape()), " on this one)");
  std::vector<float> mean_f(cs), invstd_f(cs);
  for (std::size_t ch = 0; ch < cs; ++ch) {
    mean_f[ch] = static_cast<float>(mean[ch]);
    invstd_f[ch] = static_cast<float>(1.0 / std::sqrt(m2[ch] / count + opts.eps));
  }
  Tensor save_mean = Tensor::from_host(mean_f, {c}, d);
  Tensor save_invstd = Tensor::from_host(invstd_f, {c}, d);
  Tensor y = empty_like(x);
  be.batch_norm_forward_apply(rows, c, x.data<float>(), fptr(residual), relu_on,
                              gamma.data<float>(), beta.data<float>(), save_mean.data<float>(),
                              save_invstd.data<float>(), y.data<float>());
  if (running_mean.defined()) {
    NoGradGuard no_grad;  // running statistics are state, not part of the graph
    std::vector<float> rm = running_mean.to_host(), rv = running_var.to_host();
    const double m = opts.momentum;
    for (std::size_t ch = 0; ch < cs; ++ch) {
      rm[ch] = static_cast<float>((1.0 - m) * rm[ch] + m * mean[ch]);
      rv[ch] = static_cast<float>((1.0 - m) * rv[ch] + m * (m2[ch] / (count - 1)));
    }
    Tensor(running_mean).copy_from_host(rm);
    Tensor(running_var).copy_from_host(rv);
  }

  if (needs_grad({&x, &residual, &gamma, &beta})) {
    record(y, std::string(op), {x, gamma, beta, residual},
           [rows, c, cs, members, count, relu_on, sync, x, gamma, save_mean, save_invstd,
            invstd_f = std::move(invstd_f), out = y.detach(),
            has_residual = residual.defined()](const Tensor& g) {
             Backend& be = backend_for(g.device());
             const Device& dev = g.device();
             Tensor dres = has_residual ? empty_like(x) : Tensor();
             const float* y_or_null = relu_on ? out.data<float>() : nullptr;
             // (sum g[c], sum g (x - mean)[c]) of every member, added up in member order.
             std::vector<double> send(2 * cs), all(static_cast<std::size_t>(members) * 2 * cs);
             be.batch_norm_backward_reduce(rows, c, x.data<float>(), y_or_null, relu_on,
                                           g.data<float>(), save_mean.data<float>(), send.data(),
                                           send.data() + cs, fptr(dres));
             std::vector<float> dgamma_h(cs), dbeta_h(cs);
             for (std::size_t ch = 0; ch < cs; ++ch) {
               dbeta_h[ch] = static_cast<float>(send[ch]);
               dgamma_h[ch] = static_cast<float>(send[cs + ch] * invstd_f[ch]);
             }
             sync->all_gather(send, all);
             std::vector<double> sum_g(cs, 0.0), sum_gxc(cs, 0.0);
             for (int j = 0; j < members; ++j)
               for (std::size_t ch = 0; ch < cs; ++ch) {
                 sum_g[ch] += all[static_cast<std::size_t>(j) * 2 * cs + ch];
                 sum_gxc[ch] += all[static_cast<std::size_t>(j) * 2 * cs + cs + ch];
               }
             std::vector<float> mean_g(cs), mean_gxhat(cs);
             for (std::size_t ch = 0; ch < cs; ++ch) {
               mean_g[ch] = static_cast<float>(sum_g[ch] / count);
               mean_gxhat[ch] = static_cast<float>(sum_gxc[ch] * invstd_f[ch] / count);
             }
             Tensor mg = Tensor::from_host(mean_g, {c}, dev);
             Tensor mgx = Tensor::from_host(mean_gxhat, {c}, dev);
             Tensor dx = empty_like(x);
             be.batch_norm_backward_apply(rows, c, x.data<float>(), y_or_null, relu_on,
                                          g.data<float>(), gamma.data<float>(),
                                          save_mean.data<float>(), save_invstd.data<float>(),
                                          mg.data<float>(), mgx.data<float>(), dx.data<float>());
             return std::vector<Tensor>{dx, Tensor::from_host(dgamma_h, {c}, dev),
                                        Tensor::from_host(dbeta_h, {c}, dev), dres};
           });
  }
  return y;
}

Tensor batch_norm_impl(std::string_view op, const Tensor& x, const Tensor& residual, bool relu_on,
                       const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                       const Tensor& running_var, BatchNormOptions opts) {
  const trace::Span trace_span("op", op, OpScope::current());
  const Device d = common_device(op, {&x, &residual, &gamma, &beta, &running_mean, &running_var});
  if (x.dtype() != DType::kBFloat16) check_float(op, "input", x);  // Note [bf16 convolution outputs]
  // A bf16 residual: a block's output (Note [bf16 block outputs]).
  if (!residual.defined() || residual.dtype() != DType::kBFloat16) check_float(op, "residual", residual);
  for (const Tensor* t : {&gamma, &beta, &running_mean, &running_var})
    check_float(op, "argument", *t);
  if (x.ndim() < 1 || x.numel() == 0)
    raise<InvalidArgument>(op, ": input ", x.describe(), " must be non-empty [..., c]");
  const std::int64_t c64 = x.dim(-1);
  for (const Tensor* t : {&gamma, &beta, &running_mean, &running_var})
    if (t->defined() && (t->ndim() != 1 || t->dim(0) != c64))
      raise<InvalidArgument>(op, ": per-channel tensor ", shape_str(t->shape()),
                             " does not match the input ", shape_str(x.shape()), "; expected [",
                             c64, "]");
  if (!gamma.defined() || !beta.defined())
    raise<InvalidArgument>(op, ": gamma and beta are required");
  if (residual.defined()) check_same_shape(op, x, residual);
  if (running_mean.defined() != running_var.defined())
    raise<InvalidArgument>(op, ": running_mean and running_var must both be given or neither");
  if (!opts.training && !running_mean.defined())
    raise<InvalidArgument>(op, ": inference mode (training = false) needs running statistics");
  if (!(opts.eps > 0.0f) || !(opts.momentum >= 0.0f && opts.momentum <= 1.0f))
    raise<InvalidArgument>(op, ": eps ", opts.eps, " must be > 0 and momentum ", opts.momentum,
                           " in [0, 1]");
  const std::int64_t rows = x.numel() / c64;
  const int c = static_cast<int>(c64);
  const bool synced = opts.training && opts.sync != nullptr;
  if (opts.training && rows < 2 && !synced)  // synchronised: checked over the group's rows
    raise<InvalidArgument>(op, ": training needs more than one value per channel, got input ",
                           shape_str(x.shape()), " (PyTorch's rule; use eval mode for batch 1 "
                           "of 1x1 inputs)");

  if (run_on_cpu_instead(op, synced ? OpKind::kBatchNormSync : OpKind::kBatchNorm, d)) {
    Tensor rm = to_cpu(running_mean), rv = to_cpu(running_var);
    BatchNormOptions on_cpu = opts;  // float32 for d, which may not read bf16 (Note [bf16 activations])
    on_cpu.readers = OutputReaders::kAny;
    Tensor y = batch_norm_impl(op, to_cpu(x), to_cpu(residual), relu_on, to_cpu(gamma),
                               to_cpu(beta), rm, rv, on_cpu)
                   .to(d);
    if (running_mean.defined() && opts.training) {  // the running statistics changed on the CPU
      NoGradGuard no_grad;
      running_mean.copy_(rm);
      running_var.copy_(rv);
    }
    return y;
  }

  Backend& be = backend_for(d);
  const bool bf16_in = x.dtype() == DType::kBFloat16;
  const bool bf16_residual = residual.defined() && residual.dtype() == DType::kBFloat16;
  // A bf16 input or residual where no kernel reads it as it is: widened (Notes [bf16 convolution
  // outputs] and [bf16 block outputs]). The kernels that read a bf16 residual read a bf16 x.
  const bool reads_bf16 = opts.training && !synced && be.supports(OpKind::kBf16Activations);
  const bool widen_x = bf16_in && !reads_bf16, widen_residual = bf16_residual && (widen_x || !bf16_in);
  if (widen_x || widen_residual)
    return batch_norm_impl(op, widen_x ? widened_recorded(x) : x,
                           widen_residual ? widened_recorded(residual) : residual, relu_on, gamma, beta,
                           running_mean, running_var, opts);
  if (!opts.training) {
    Tensor y = empty_like(x);
    be.batch_norm_forward_inference(rows, c, x.data<float>(), gamma.data<float>(),
                                    beta.data<float>(), running_mean.data<float>(),
                                    running_var.data<float>(), opts.eps, y.data<float>());
    if (needs_grad({&x, &gamma, &beta})) {
      // Eval-mode gradients flow to the input only: dx = dy * gamma / sqrt(var + eps), which is
      // the inference transform of dy with mean 0 and beta 0.
      record(y, std::string(op), {x}, [rows, c, gamma, running_var, eps = opts.eps](const Tensor& g) {
        Backend& be = backend_for(g.device());
        Tensor zeros = Tensor::zeros({c}, g.device());
        Tensor dx = empty_like(g);
        be.batch_norm_forward_inference(rows, c, g.data<float>(), gamma.data<float>(),
                                        zeros.data<float>(), zeros.data<float>(),
                                        running_var.data<float>(), eps, dx.data<float>());
        return std::vector<Tensor>{dx};
      });
    }
    if (residual.defined()) y = add(y, residual);
    if (relu_on) y = relu(y);
    return y;
  }

  if (synced)
    return batch_norm_sync_training(op, d, rows, c, x, residual, relu_on, gamma, beta,
                                    running_mean, running_var, opts);

  Tensor save_mean = Tensor::empty({c}, d), save_invstd = Tensor::empty({c}, d);
  // bf16 outputs: Notes [bf16 activations] and [bf16 block outputs]; with a residual, from a bf16
  // x (the kernels that store them read one).
  const bool bf16_out = relu_on &&
                        (opts.readers == OutputReaders::kConvolutions ||
                         opts.readers == OutputReaders::kConvolutionsAndResidual) &&
                        (!residual.defined() || bf16_in) && current_precision() == Precision::Bf16 &&
                        be.supports(OpKind::kBf16Activations);
  Tensor y = Tensor::empty(x.shape(), d, bf16_out ? DType::kBFloat16 : DType::kFloat32);
  {
    NoGradGuard no_grad;  // running statistics are state, not part of the graph
    if (bf16_in) {
      be.batch_norm_forward_training_bf16_input(
          rows, c, x.data<bfloat16>(), bf16_residual ? nullptr : fptr(residual),
          bf16_residual ? residual.data<bfloat16>() : nullptr, relu_on, gamma.data<float>(),
          beta.data<float>(), opts.eps, opts.momentum, fptr(running_mean), fptr(running_var),
          bf16_out ? nullptr : y.data<float>(), bf16_out ? y.data<bfloat16>() : nullptr,
          save_mean.data<float>(), save_invstd.data<float>());
    } else if (bf16_out) {
      be.batch_norm_relu_forward_training_bf16(
          rows, c, x.data<float>(), gamma.data<float>(), beta.data<float>(), opts.eps,
          opts.momentum, fptr(running_mean), fptr(running_var), y.data<bfloat16>(),
          save_mean.data<float>(), save_invstd.data<float>());
    } else {
      be.batch_norm_forward_training(rows, c, x.data<float>(), fptr(residual), relu_on,
                                     gamma.data<float>(), beta.data<float>(), opts.eps,
                                     opts.momentum, fptr(running_mean), fptr(running_var),
                                     y.data<float>(), save_mean.data<float>(),
                                     save_invstd.data<float>());
    }
  }
  if (needs_grad({&x, &residual, &gamma, &beta})) {
    // The backward reads the forward's output for the ReLU's mask, except from a backend with
    // bf16 activations, which recomputes it from x (Backend::batch_norm_backward) where there is
    // no residual: a bf16 output is then not kept. With a residual it reads y, bf16 or not.
    const bool keep_y = residual.defined() || !bf16_out;
    record(y, std::string(op), {x, gamma, beta, residual},
           [rows, c, relu_on, x, gamma, beta, save_mean, save_invstd, eps = opts.eps,
            out = keep_y ? y.detach() : Tensor(), has_residual = residual.defined()](const Tensor& g) {
             Backend& be = backend_for(g.device());
             // Over g where the backend's kernels allow it (Note [Gradients written over the
             // output's] in autograd.cc): dx, or with a residual the masked gradient, which is
             // the one the first pass writes as it reads g.
             const bool over_g = be.batch_norm_backward_in_place() && gradient_reusable(g);
             Tensor dres = has_residual ? (over_g ? g : empty_like(g)) : Tensor();
             Tensor dx = over_g && !has_residual ? g : empty_like(g);  // float32 whatever x's type
             Tensor dgamma = empty_like(gamma), dbeta = empty_like(gamma);
             const bool out_bf16 = out.defined() && out.dtype() == DType::kBFloat16;
             if (x.dtype() == DType::kBFloat16)
               be.batch_norm_backward_bf16_input(
                   rows, c, x.data<bfloat16>(), relu_on && !out_bf16 ? fptr(out) : nullptr,
                   relu_on && out_bf16 ? out.data<bfloat16>() : nullptr, relu_on, g.data<float>(),
                   gamma.data<float>(), beta.data<float>(), save_mean.data<float>(),
                   save_invstd.data<float>(), eps, dx.data<float>(), dgamma.data<float>(),
                   dbeta.data<float>(), fptr(dres));
             else
               be.batch_norm_backward(rows, c, x.data<float>(), relu_on ? fptr(out) : nullptr,
                                      relu_on, g.data<float>(), gamma.data<float>(), beta.data<float>(),
                                      save_mean.data<float>(), save_invstd.data<float>(), eps,
                                      dx.data<float>(), dgamma.data<float>(), dbeta.data<float>(),
                                      fptr(dres));
             return std::vector<Tensor>{dx, dgamma, dbeta, dres};
           });
  }
  return y;
}

}  // namespace

Tensor batch_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                  const Tensor& running_mean, const Tensor& running_var, BatchNormOptions opts) {
  return batch_norm_impl("FusedBatchNorm", x, Tensor(), false, gamma, beta, running_mean,
                         running_var, opts);
}

Tensor batch_norm_relu(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                       const Tensor& running_mean, const Tensor& running_var,
                       BatchNormOptions opts) {
  return batch_norm_impl("FusedBatchNormRelu", x, Tensor(), true, gamma, beta, running_mean,
                         running_var, opts);
}

Tensor batch_norm_add_relu(const Tensor& x, const Tensor& residual, const Tensor& gamma,
                           const Tensor& beta, const Tensor& running_mean,
                           const Tensor& running_var, BatchNormOptions opts) {
  if (!residual.defined())
    raise<InvalidArgument>("FusedBatchNormAddRelu: the residual is undefined");
  return batch_norm_impl("FusedBatchNormAddRelu", x, residual, true, gamma, beta, running_mean,
                         running_var, opts);
}

// ---- shape ops ---------------------------------------------------------------------------------

Tensor flatten(const Tensor& x) {
  constexpr std::string_view kOp = "Flatten";
  const trace::Span trace_span("op", kOp, OpScope::current());
  const Device d = common_device(kOp, {&x});
  if (x.ndim() < 1) raise<InvalidArgument>(kOp, ": input ", x.describe(), " has no batch dim");
  if (x.ndim() != 4 || (x.dim(1) == 1 && x.dim(2) == 1)) return x.view({x.dim(0), -1});
  check_float(kOp, "input", x);
  if (run_on_cpu_instead(kOp, OpKind::kElementwise, d)) return flatten(to_cpu(x)).to(d);
  const std::int64_t n = x.dim(0), hw = x.dim(1) * x.dim(2);
  const int c = static_cast<int>(x.dim(3));
  Tensor y = Tensor::empty({n, hw * c}, d);
  backend_for(d).nhwc_to_nchw(n, hw, c, x.data<float>(), y.data<float>());
  if (needs_grad({&x})) {
    record(y, std::string(kOp), {x}, [n, hw, c, xs = x.shape()](const Tensor& g) {
      Tensor dx = Tensor::empty(xs, g.device());
      backend_for(g.device()).nchw_to_nhwc(n, hw, c, g.data<float>(), dx.data<float>());
      return std::vector<Tensor>{dx};
    });
  }
  return y;
}

Tensor dropout(const Tensor& x, float p, bool training, std::uint64_t seed,
               std::uint64_t offset) {
  constexpr std::string_view kOp = "Dropout";
  const trace::Span trace_span("op", kOp, OpScope::current());
  const Device d = common_device(kOp, {&x});
  check_float(kOp, "input", x);
  if (!(p >= 0.0f && p < 1.0f))
    raise<InvalidArgument>(kOp, ": drop probability p = ", p, " must be in [0, 1)");
  if (!training || p == 0.0f) return x;
  if (run_on_cpu_instead(kOp, OpKind::kDropout, d))
    return dropout(to_cpu(x), p, training, seed, offset).to(d);
  Tensor y = empty_like(x);
  Tensor mask = Tensor::empty(x.shape(), d, DType::kUInt8);
  backend_for(d).dropout_forward(x.numel(), p, seed, offset, x.data<float>(), y.data<float>(),
                                 mask.data<std::uint8_t>());
  if (needs_grad({&x})) {
    record(y, std::string(kOp), {x}, [p, mask](const Tensor& g) {
      Tensor dx = gradient_over(g);
      backend_for(g.device())
          .dropout_backward(g.numel(), p, mask.data<std::uint8_t>(), g.data<float>(),
                            dx.data<float>());
      return std::vector<Tensor>{dx};
    });
  }
  return y;
}

// ---- loss and metrics --------------------------------------------------------------------------

namespace {
void check_logits_labels(std::string_view op, const Tensor& logits, const Tensor& labels) {
  check_float(op, "logits", logits);
  check_ndim(op, "logits", logits, 2, "[n, classes]");
  if (labels.dtype() != DType::kInt32 || labels.ndim() != 1 || labels.dim(0) != logits.dim(0))
    raise<InvalidArgument>(op, ": labels ", labels.describe(), " must be int32 [",
                           logits.dim(0), "] to match logits ", shape_str(logits.shape()));
  if (logits.dim(1) < 1) raise<InvalidArgument>(op, ": logits ", logits.describe(), " has no class");
}
}  // namespace

Tensor softmax_cross_entropy(const Tensor& logits, const Tensor& labels,
                             SoftmaxCrossEntropyOptions opts) {
  constexpr std::string_view kOp = "SoftmaxCrossEntropyWithLogits";
  const trace::Span trace_span("op", kOp, OpScope::current());
  const Device d = common_device(kOp, {&logits, &labels});
  check_logits_labels(kOp, logits, labels);
  if (!(opts.label_smoothing >= 0.0f && opts.label_smoothing < 1.0f))
    raise<InvalidArgument>(kOp, ": label_smoothing ", opts.label_smoothing, " must be in [0, 1)");
  if (!(opts.scale >= 0.0f) || std::isinf(opts.scale))
    raise<InvalidArgument>(kOp, ": scale ", opts.scale,
                           " must be positive (the global batch size), or 0 for the batch mean");
  if (run_on_cpu_instead(kOp, OpKind::kSoftmaxXent, d))
    return softmax_cross_entropy(to_cpu(logits), to_cpu(labels), opts).to(d);
  const std::int64_t rows = logits.dim(0);
  const int classes = static_cast<int>(logits.dim(1));
  const float scale = opts.scale > 0.0f ? opts.scale : static_cast<float>(rows);
  Tensor loss = Tensor::empty({1}, d);
  Tensor probs = empty_like(logits);
  backend_for(d).softmax_cross_entropy_forward(rows, classes, logits.data<float>(),
                                               labels.data<std::int32_t>(), scale,
                                               opts.label_smoothing, loss.data<float>(),
                                               probs.data<float>());
  if (needs_grad({&logits})) {
    record(loss, std::string(kOp), {logits},
           [rows, classes, scale, s = opts.label_smoothing, probs, labels](const Tensor& g) {
             Tensor dlogits = empty_like(probs);
             backend_for(g.device())
                 .softmax_cross_entropy_backward(rows, classes, probs.data<float>(),
                                                 labels.data<std::int32_t>(), scale, s,
                                                 g.data<float>(), dlogits.data<float>());
             return std::vector<Tensor>{dlogits};
           });
  }
  return loss;
}

std::int64_t top_k_correct(const Tensor& logits, const Tensor& labels, int k) {
  constexpr std::string_view kOp = "InTopK";
  const trace::Span trace_span("op", kOp, OpScope::current());
  const Device d = common_device(kOp, {&logits, &labels});
  check_logits_labels(kOp, logits, labels);
  if (k < 1 || k > logits.dim(1))
    raise<InvalidArgument>(kOp, ": k = ", k, " must be in [1, ", logits.dim(1), "] (the classes)");
  if (run_on_cpu_instead(kOp, OpKind::kTopK, d))
    return top_k_correct(to_cpu(logits), to_cpu(labels), k);
  Tensor correct = Tensor::empty({1}, d, DType::kInt32);
  backend_for(d).top_k_correct(logits.dim(0), static_cast<int>(logits.dim(1)),
                               logits.data<float>(), labels.data<std::int32_t>(), k,
                               correct.data<std::int32_t>());
  return correct.to_host_int32()[0];
}

double accuracy(const Tensor& logits, const Tensor& labels, int k) {
  const std::int64_t n = logits.defined() && logits.ndim() >= 1 ? logits.dim(0) : 0;
  const std::int64_t correct = top_k_correct(logits, labels, k);
  return n ? static_cast<double>(correct) / static_cast<double>(n) : 0.0;
}

}  // namespace towerflow
