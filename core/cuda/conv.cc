// Convolutions through cuDNN, NHWC activations, algorithm chosen once per shape.
//
// Note [Filter layout for cuDNN]
// The CPU path keeps weights OIHW (PyTorch's layout, so checkpoints and the flat parameter buffer
// are the same on every device) and activations NHWC. cuDNN's NHWC convolutions are documented
// and fast with NHWC ("KRSC", here O,H,W,I) filters; mixing NHWC data with NCHW filters is
// supported by fewer algorithms. So the weights, which are small (at most 64*64*3*3 floats in a
// ResNet-20), are transposed OIHW -> OHWI into a workspace before each call (and dw back
// OHWI -> OIHW after backward_weight); the activations, which are large, are never converted.
//
// Note [Choosing convolution algorithms]
// cuDNN's heuristics (cudnnGetConvolution*Algorithm_v7) rank the algorithms for a shape without
// running them; the first one that is supported (status CUDNN_STATUS_SUCCESS), deterministic
// (CUDNN_DETERMINISTIC: the README promises that only max-pool backward's atomics may vary, and
// cuDNN's backward-data and backward-filter ALGO_0 accumulate with atomics), fits
// kMaxWorkspaceBytes and obeys the math mode is kept in the context's plan for that shape, so the
// ranking runs once per shape per device. Its workspace is asked of
// cudnnGetConvolution*WorkspaceSize for that algorithm and math mode (the size the call itself
// checks against), not taken from the ranking's estimate. Unless allow_tf32 is set, the
// descriptors ask for FMA math (no TF32 tensor-core rounding) so float results match the CPU to
// rounding. The workspace comes from the device's allocator for the duration of the call
// (stream-ordered free, Note [Stream-ordered frees]); if that allocation fails, the call uses the
// best algorithm of the same ranking that is supported, deterministic and needs no workspace.
// No algorithm is hard-coded: which ones support NHWC float32 data with NHWC filters differs
// between cuDNN versions and GPUs, and a hard-coded one may return CUDNN_STATUS_NOT_SUPPORTED.

#include <cudnn.h>

#include <mutex>

#include "core/cuda/context_impl.h"
#include "core/cuda/ops.h"
#include "core/log.h"

namespace towerflow::gpu {

namespace {

constexpr std::size_t kMaxWorkspaceBytes = std::size_t{1} << 30;

ConvKey key_of(const Conv2dShape& s) {
  return {s.n, s.h, s.w, s.c_in, s.c_out, s.kh, s.kw, s.stride_h, s.stride_w, s.pad_h, s.pad_w};
}

ConvPlan& plan_for(const GpuContext& ctx, const Conv2dShape& s) {
  GpuContext::Impl& m = ctx.impl();
  auto& slot = m.conv_plans[key_of(s)];
  if (slot) return *slot;
  auto plan = std::make_unique<ConvPlan>();
  TW_CUDNN_CHECK(cudnnCreateTensorDescriptor(&plan->x_desc));
  TW_CUDNN_CHECK(cudnnCreateTensorDescriptor(&plan->y_desc));
  TW_CUDNN_CHECK(cudnnCreateFilterDescriptor(&plan->w_desc));
  TW_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&plan->conv_desc));
  TW_CUDNN_CHECK(cudnnSetTensor4dDescriptor(plan->x_desc, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT,
                                            s.n, s.c_in, s.h, s.w));
  TW_CUDNN_CHECK(cudnnSetTensor4dDescriptor(plan->y_desc, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT,
                                            s.n, s.c_out, s.out_h(), s.out_w()));
  TW_CUDNN_CHECK(cudnnSetFilter4dDescriptor(plan->w_desc, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NHWC,
                                            s.c_out, s.c_in, s.kh, s.kw));
  TW_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(plan->conv_desc, s.pad_h, s.pad_w, s.stride_h,
                                                 s.stride_w, 1, 1, CUDNN_CROSS_CORRELATION,
                                                 CUDNN_DATA_FLOAT));
  plan->base_math = ctx.allow_tf32() ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
  TW_CUDNN_CHECK(cudnnSetConvolutionMathType(plan->conv_desc, plan->base_math));
  int dims[4] = {0, 0, 0, 0};
  TW_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(plan->conv_desc, plan->x_desc,
                                                       plan->w_desc, &dims[0], &dims[1], &dims[2],
                                                       &dims[3]));
  TW_CHECK(dims[0] == s.n && dims[1] == s.c_out && dims[2] == s.out_h() && dims[3] == s.out_w(),
           "cuDNN computes output ", dims[0], "x", dims[1], "x", dims[2], "x", dims[3], " for ",
           s.to_string());
  slot = std::move(plan);
  return *slot;
}

// Picks from cuDNN's ranking (see Note [Choosing convolution algorithms]).
template <typename Perf>
const Perf* choose(const Perf* perf, int count, bool allow_tf32, bool need_no_workspace) {
  for (int i = 0; i < count; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
    if (perf[i].determinism != CUDNN_DETERMINISTIC) continue;
    if (perf[i].memory > (need_no_workspace ? 0 : kMaxWorkspaceBytes)) continue;
    if (!allow_tf32 && perf[i].mathType == CUDNN_TENSOR_OP_MATH) continue;
    return &perf[i];
  }
  return nullptr;
}

[[noreturn]] void no_algorithm(const GpuContext& ctx, const Conv2dShape& s, const char* what) {
  raise<DeviceError>("cuDNN offers no deterministic ", what, " algorithm for ", s.to_string(),
                     " on ", ctx.device(), " within ", kMaxWorkspaceBytes >> 20,
                     " MiB of workspace and the requested math mode");
}

[[noreturn]] void no_fallback(const GpuContext& ctx, const Conv2dShape& s, const char* what,
                              std::size_t workspace) {
  raise<OutOfMemory>("the ", workspace, "-byte cuDNN workspace of the ", what, " for ",
                     s.to_string(), " does not fit on ", ctx.device(),
                     ", and cuDNN ranks no deterministic algorithm without workspace for it; free "
                     "memory (a smaller batch) or raise the device's memory limit");
}

// Allocates the workspace, or returns an empty buffer when the device is out of memory (the
// caller then uses its no-workspace algorithm).
DeviceBuffer try_workspace(const GpuContext& ctx, std::size_t bytes, bool* ok) {
  *ok = true;
  if (bytes == 0) return {};
  try {
    return DeviceBuffer(ctx, bytes);
  } catch (const OutOfMemory& e) {
    static std::once_flag logged;
    std::call_once(logged, [&] {
      log_warning(str("cuDNN workspace of ", bytes, " bytes does not fit on ", ctx.device(),
                      "; falling back to algorithms without workspace (slower). ", e.what()));
    });
    *ok = false;
    return {};
  }
}

// OIHW <-> OHWI: see Note [Filter layout for cuDNN].
void oihw_to_ohwi(const GpuContext& ctx, const Conv2dShape& s, const float* w, float* out) {
  transpose_batched(ctx, s.c_out, s.c_in, static_cast<std::int64_t>(s.kh) * s.kw, w, out);
}
void ohwi_to_oihw(const GpuContext& ctx, const Conv2dShape& s, const float* w, float* out) {
  transpose_batched(ctx, s.c_out, static_cast<std::int64_t>(s.kh) * s.kw, s.c_in, w, out);
}

std::size_t weight_bytes(const Conv2dShape& s) {
  return static_cast<std::size_t>(s.c_out) * s.c_in * s.kh * s.kw * sizeof(float);
}

const float kOne = 1.0f;
const float kZero = 0.0f;

}  // namespace

void conv2d_forward(const GpuContext& ctx, const Conv2dShape& s, const float* x, const float* w,
                    float* y) {
  s.validate();
  GpuContext::Impl& m = ctx.impl();
  auto scope = m.scope();
  ConvPlan& p = plan_for(ctx, s);
  if (!p.have_fwd) {
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int count = 0;
    TW_CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv_desc, p.base_math));
    TW_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(m.cudnn, p.x_desc, p.w_desc,
                                                          p.conv_desc, p.y_desc,
                                                          CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count,
                                                          perf));
    const auto* best = choose(perf, count, ctx.allow_tf32(), false);
    if (best == nullptr) no_algorithm(ctx, s, "forward convolution");
    p.fwd = best->algo;
    p.fwd_math = best->mathType;
    TW_CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv_desc, p.fwd_math));
    TW_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(m.cudnn, p.x_desc, p.w_desc,
                                                           p.conv_desc, p.y_desc, p.fwd,
                                                           &p.fwd_workspace));
    if (const auto* zero = choose(perf, count, ctx.allow_tf32(), true)) {
      p.fwd0 = zero->algo;
      p.fwd0_math = zero->mathType;
      p.have_fwd0 = true;
    }
    p.have_fwd = true;
  }
  DeviceBuffer w_ohwi(ctx, weight_bytes(s));
  oihw_to_ohwi(ctx, s, w, w_ohwi.as<float>());
  bool ok = true;
  DeviceBuffer ws = try_workspace(ctx, p.fwd_workspace, &ok);
  if (!ok && !p.have_fwd0) no_fallback(ctx, s, "forward convolution", p.fwd_workspace);
  const cudnnConvolutionFwdAlgo_t algo = ok ? p.fwd : p.fwd0;
  TW_CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv_desc, ok ? p.fwd_math : p.fwd0_math));
  TW_CUDNN_CHECK(cudnnConvolutionForward(m.cudnn, &kOne, p.x_desc, x, p.w_desc, w_ohwi.data(),
                                         p.conv_desc, algo, ws.data(), ok ? ws.size() : 0, &kZero,
                                         p.y_desc, y));
}

void conv2d_backward_input(const GpuContext& ctx, const Conv2dShape& s, const float* dy,
                           const float* w, float* dx) {
  s.validate();
  GpuContext::Impl& m = ctx.impl();
  auto scope = m.scope();
  ConvPlan& p = plan_for(ctx, s);
  if (!p.have_bwd_data) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    int count = 0;
    TW_CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv_desc, p.base_math));
    TW_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
        m.cudnn, p.w_desc, p.y_desc, p.conv_desc, p.x_desc, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
        &count, perf));
    const auto* best = choose(perf, count, ctx.allow_tf32(), false);
    if (best == nullptr) no_algorithm(ctx, s, "backward-data convolution");
    p.bwd_data = best->algo;
    p.bwd_data_math = best->mathType;
    TW_CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv_desc, p.bwd_data_math));
    TW_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(m.cudnn, p.w_desc, p.y_desc,
                                                                p.conv_desc, p.x_desc, p.bwd_data,
                                                                &p.bwd_data_workspace));
    if (const auto* zero = choose(perf, count, ctx.allow_tf32(), true)) {
      p.bwd_data0 = zero->algo;
      p.bwd_data0_math = zero->mathType;
      p.have_bwd_data0 = true;
    }
    p.have_bwd_data = true;
  }
  DeviceBuffer w_ohwi(ctx, weight_bytes(s));
  oihw_to_ohwi(ctx, s, w, w_ohwi.as<float>());
  bool ok = true;
  DeviceBuffer ws = try_workspace(ctx, p.bwd_data_workspace, &ok);
  if (!ok && !p.have_bwd_data0)
    no_fallback(ctx, s, "backward-data convolution", p.bwd_data_workspace);
  const cudnnConvolutionBwdDataAlgo_t algo = ok ? p.bwd_data : p.bwd_data0;
  TW_CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv_desc, ok ? p.bwd_data_math : p.bwd_data0_math));
  TW_CUDNN_CHECK(cudnnConvolutionBackwardData(m.cudnn, &kOne, p.w_desc, w_ohwi.data(), p.y_desc,
                                              dy, p.conv_desc, algo, ws.data(),
                                              ok ? ws.size() : 0, &kZero, p.x_desc, dx));
}

void conv2d_backward_weight(const GpuContext& ctx, const Conv2dShape& s, const float* x,
                            const float* dy, float* dw) {
  s.validate();
  GpuContext::Impl& m = ctx.impl();
  auto scope = m.scope();
  ConvPlan& p = plan_for(ctx, s);
  if (!p.have_bwd_filter) {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    int count = 0;
    TW_CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv_desc, p.base_math));
    TW_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        m.cudnn, p.x_desc, p.y_desc, p.conv_desc, p.w_desc,
        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count, perf));
    const auto* best = choose(perf, count, ctx.allow_tf32(), false);
    if (best == nullptr) no_algorithm(ctx, s, "backward-filter convolution");
    p.bwd_filter = best->algo;
    p.bwd_filter_math = best->mathType;
    TW_CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv_desc, p.bwd_filter_math));
    TW_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(
        m.cudnn, p.x_desc, p.y_desc, p.conv_desc, p.w_desc, p.bwd_filter,
        &p.bwd_filter_workspace));
    if (const auto* zero = choose(perf, count, ctx.allow_tf32(), true)) {
      p.bwd_filter0 = zero->algo;
      p.bwd_filter0_math = zero->mathType;
      p.have_bwd_filter0 = true;
    }
    p.have_bwd_filter = true;
  }
  DeviceBuffer dw_ohwi(ctx, weight_bytes(s));
  bool ok = true;
  DeviceBuffer ws = try_workspace(ctx, p.bwd_filter_workspace, &ok);
  if (!ok && !p.have_bwd_filter0)
    no_fallback(ctx, s, "backward-filter convolution", p.bwd_filter_workspace);
  const cudnnConvolutionBwdFilterAlgo_t algo = ok ? p.bwd_filter : p.bwd_filter0;
  TW_CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv_desc,
                                             ok ? p.bwd_filter_math : p.bwd_filter0_math));
  TW_CUDNN_CHECK(cudnnConvolutionBackwardFilter(m.cudnn, &kOne, p.x_desc, x, p.y_desc, dy,
                                                p.conv_desc, algo, ws.data(), ok ? ws.size() : 0,
                                                &kZero, p.w_desc, dw_ohwi.data()));
  ohwi_to_oihw(ctx, s, dw_ohwi.as<float>(), dw);
}

void conv2d_forward_bias(const GpuContext& ctx, const Conv2dShape& s, const float* x,
                         const float* w, const float* bias, float* y) {
  conv2d_forward(ctx, s, x, w, y);
  if (bias != nullptr)
    bias_add(ctx, static_cast<std::int64_t>(s.n) * s.out_h() * s.out_w(), s.c_out, y, bias, y);
}

void conv2d_backward_bias(const GpuContext& ctx, const Conv2dShape& s, const float* dy,
                          float* db) {
  s.validate();
  sum_rows(ctx, static_cast<std::int64_t>(s.n) * s.out_h() * s.out_w(), s.c_out, dy, db);
}

}  // namespace towerflow::gpu
