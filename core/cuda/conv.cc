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
// running them; every one that is supported (status CUDNN_STATUS_SUCCESS), deterministic
// (CUDNN_DETERMINISTIC: the README promises that only max-pool backward's atomics may vary, and
// cuDNN's backward-data and backward-filter ALGO_0 accumulate with atomics), fits
// kMaxWorkspaceBytes and obeys the math mode is kept, in rank order, in the context's plan for
// that shape, so the ranking runs once per shape per device. Each one's workspace is asked of
// cudnnGetConvolution*WorkspaceSize for that algorithm and math mode (the size the call itself
// checks against), not taken from the ranking's estimate.
// A ranking's status is the heuristic's verdict, not a run's result (cudnnConvolution*AlgoPerf_t
// in cuDNN's cudnn_cnn reference), and an algorithm it calls supported can still fail when it
// runs. So a call runs the best candidate; when cuDNN answers with a status of the categories
// NOT_SUPPORTED, BAD_PARAM or EXECUTION_FAILED (cudnn_graph.h: cuDNN 9 codes are a category
// plus a specific error, e.g. CUDNN_STATUS_NOT_SUPPORTED_SHAPE), it runs the next, and the one
// that ran is where later calls of that shape start (candidates.h). Other statuses (an internal
// error, an allocation cuDNN could not make) are raised at once: another algorithm would not
// cure them. When every candidate fails, the error names the shape, the precision and each
// algorithm's status. Unless allow_tf32 is set, the
// descriptors ask for FMA math (no TF32 tensor-core rounding) so float results match the CPU to
// rounding. The workspace comes from the device's allocator for the duration of the call
// (stream-ordered free, Note [Stream-ordered frees]); if that allocation fails, the call uses the
// best algorithm of the same ranking that is supported, deterministic and needs no workspace.
// No algorithm is hard-coded: which ones support NHWC float32 data with NHWC filters differs
// between cuDNN versions and GPUs, and a hard-coded one may return CUDNN_STATUS_NOT_SUPPORTED.
//
// Note [16-bit convolutions on tensor cores]
// Under bf16 and fp16 precision (conv2d_*_half) the operands are converted on the GPU to the
// 16-bit type (round to nearest even, float_to_half) and cuDNN convolves them in its
// "pseudo" configurations (PSEUDO_BFLOAT16_CONFIG, PSEUDO_HALF_CONFIG: x, w and y in the 16-bit
// type, the convolution descriptor's compute type float, so products accumulate in float32) with
// CUDNN_TENSOR_OP_MATH, which lets the ranking offer tensor-core algorithms. These configurations
// write y (dx, dw) in the 16-bit type too: the result is widened back to float32, and so carries
// one rounding to bf16 (at most 2^-8 relative) or fp16 (2^-11, and overflow past 65504, which
// fp16's loss scaling catches as a non-finite gradient) that the CPU's bf16 kernels, which write
// float32, do not. This is also what PyTorch's autocast does on a GPU. cuBLAS (gemm_half) writes float32.
// Each data type has its own plan per shape, ranked as above. Where cuDNN ranks no 16-bit
// algorithm for a shape (or cannot rank the configuration at all), that convolution runs the
// float32 algorithm on operands rounded to the type (the emulated path), and a warning says so
// once per shape and direction.

#include <cudnn.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/cuda/context_impl.h"
#include "core/cuda/ops.h"
#include "core/log.h"

namespace towerflow::gpu {

namespace {

constexpr std::size_t kMaxWorkspaceBytes = std::size_t{1} << 30;

ConvKey key_of(const Conv2dShape& s, cudnnDataType_t type) {
  return {s.n,        s.h,        s.w,     s.c_in,  s.c_out, s.kh, s.kw,
          s.stride_h, s.stride_w, s.pad_h, s.pad_w, static_cast<int>(type)};
}

cudnnDataType_t cudnn_type(Half t) {
  return t == Half::Bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
}

ConvPlan& plan_for(const GpuContext& ctx, const Conv2dShape& s, cudnnDataType_t type) {
  GpuContext::Impl& m = ctx.impl();
  auto& slot = m.conv_plans[key_of(s, type)];
  if (slot) return *slot;
  auto plan = std::make_unique<ConvPlan>();
  const bool half = type != CUDNN_DATA_FLOAT;
  plan->data_type = type;
  TW_CUDNN_CHECK(cudnnCreateTensorDescriptor(&plan->x_desc));
  TW_CUDNN_CHECK(cudnnCreateTensorDescriptor(&plan->y_desc));
  TW_CUDNN_CHECK(cudnnCreateFilterDescriptor(&plan->w_desc));
  TW_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&plan->conv_desc));
  TW_CUDNN_CHECK(cudnnSetTensor4dDescriptor(plan->x_desc, CUDNN_TENSOR_NHWC, type, s.n, s.c_in,
                                            s.h, s.w));
  TW_CUDNN_CHECK(cudnnSetTensor4dDescriptor(plan->y_desc, CUDNN_TENSOR_NHWC, type, s.n, s.c_out,
                                            s.out_h(), s.out_w()));
  TW_CUDNN_CHECK(cudnnSetFilter4dDescriptor(plan->w_desc, type, CUDNN_TENSOR_NHWC, s.c_out,
                                            s.c_in, s.kh, s.kw));
  // Float accumulation for every data type (Note [16-bit convolutions on tensor cores]).
  TW_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(plan->conv_desc, s.pad_h, s.pad_w, s.stride_h,
                                                 s.stride_w, 1, 1, CUDNN_CROSS_CORRELATION,
                                                 CUDNN_DATA_FLOAT));
  plan->base_math = half              ? CUDNN_TENSOR_OP_MATH
                    : ctx.allow_tf32() ? CUDNN_DEFAULT_MATH
                                       : CUDNN_FMA_MATH;
  plan->tensor_ops = half || ctx.allow_tf32();
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

// Whether a ranked algorithm may be used (see Note [Choosing convolution algorithms]).
template <typename Perf>
bool usable(const Perf& perf, bool tensor_ops, bool need_no_workspace) {
  return perf.status == CUDNN_STATUS_SUCCESS && perf.determinism == CUDNN_DETERMINISTIC &&
         perf.memory <= (need_no_workspace ? 0 : kMaxWorkspaceBytes) &&
         (tensor_ops || perf.mathType != CUDNN_TENSOR_OP_MATH);
}

const char* type_name(cudnnDataType_t type) {
  return type == CUDNN_DATA_BFLOAT16 ? "bf16" : type == CUDNN_DATA_HALF ? "fp16" : "float32";
}

// Keeps the usable algorithms of a ranking call's result, best first, each with its workspace
// (workspace(algo, &bytes) with the descriptor set to the algorithm's math mode; one whose size
// query fails is left out: it could not run either). A float plan that cuDNN cannot rank is an
// error; a 16-bit one runs emulated (Note [16-bit convolutions on tensor cores]), said once here.
template <typename Perf, typename Workspace>
void keep_choice(const GpuContext& ctx, const Conv2dShape& s, const ConvPlan& p, ConvChoice& c,
                 cudnnStatus_t status, const char* call, const char* what, const Perf* perf,
                 int count, Workspace workspace) {
  c.ranked = true;
  if (status != CUDNN_STATUS_SUCCESS && p.data_type == CUDNN_DATA_FLOAT)
    detail::raise_cudnn(status, call);
  if (status == CUDNN_STATUS_SUCCESS) {
    std::vector<ConvAlgo> ranked;
    for (int i = 0; i < count; ++i) {
      if (!usable(perf[i], p.tensor_ops, false)) continue;
      ConvAlgo a{static_cast<int>(perf[i].algo), perf[i].mathType, 0};
      TW_CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv_desc, a.math));
      if (workspace(a.algo, &a.workspace) != CUDNN_STATUS_SUCCESS) continue;
      if (!c.have_zero && usable(perf[i], p.tensor_ops, true) && a.workspace == 0) {
        c.have_zero = true;
        c.zero = a;
      }
      ranked.push_back(a);
    }
    c.candidates = Candidates<ConvAlgo>(std::move(ranked));
  }
  if (!c.found() && p.data_type != CUDNN_DATA_FLOAT)
    log_warning(str("cuDNN offers no deterministic ", type_name(p.data_type), " ", what,
                    " algorithm for ", s.to_string(), " on ", ctx.device(),
                    status == CUDNN_STATUS_SUCCESS ? "" : str(" (", call, ": ",
                                                              cudnnGetErrorString(status), ")"),
                    "; that convolution runs the float32 algorithm on operands rounded to ",
                    type_name(p.data_type), " (slower)"));
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

// Ranks one direction's algorithms once per plan (rank: cuDNN's ranking call; workspace: its
// workspace-size call for an algorithm); false when cuDNN offers none (keep_choice).
template <typename Perf, int kCount, typename Rank, typename Workspace>
bool ready(const GpuContext& ctx, const Conv2dShape& s, ConvPlan& p, ConvChoice& c,
           const char* call, const char* what, Rank rank, Workspace workspace) {
  if (c.ranked) return c.found();
  Perf perf[kCount];
  int count = 0;
  TW_CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv_desc, p.base_math));
  const cudnnStatus_t status = rank(perf, &count);
  keep_choice(ctx, s, p, c, status, call, what, perf, count, workspace);
  return c.found();
}

bool ready_forward(const GpuContext& ctx, const Conv2dShape& s, ConvPlan& p) {
  const cudnnHandle_t h = ctx.impl().cudnn;
  return ready<cudnnConvolutionFwdAlgoPerf_t, CUDNN_CONVOLUTION_FWD_ALGO_COUNT>(
      ctx, s, p, p.fwd, "cudnnGetConvolutionForwardAlgorithm_v7", "forward convolution",
      [&](cudnnConvolutionFwdAlgoPerf_t* perf, int* count) {
        return cudnnGetConvolutionForwardAlgorithm_v7(h, p.x_desc, p.w_desc, p.conv_desc, p.y_desc,
                                                      CUDNN_CONVOLUTION_FWD_ALGO_COUNT, count,
                                                      perf);
      },
      [&](int algo, std::size_t* bytes) {
        return cudnnGetConvolutionForwardWorkspaceSize(
            h, p.x_desc, p.w_desc, p.conv_desc, p.y_desc,
            static_cast<cudnnConvolutionFwdAlgo_t>(algo), bytes);
      });
}

bool ready_backward_data(const GpuContext& ctx, const Conv2dShape& s, ConvPlan& p) {
  const cudnnHandle_t h = ctx.impl().cudnn;
  return ready<cudnnConvolutionBwdDataAlgoPerf_t, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT>(
      ctx, s, p, p.bwd_data, "cudnnGetConvolutionBackwardDataAlgorithm_v7",
      "backward-data convolution",
      [&](cudnnConvolutionBwdDataAlgoPerf_t* perf, int* count) {
        return cudnnGetConvolutionBackwardDataAlgorithm_v7(h, p.w_desc, p.y_desc, p.conv_desc,
                                                           p.x_desc,
                                                           CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
                                                           count, perf);
      },
      [&](int algo, std::size_t* bytes) {
        return cudnnGetConvolutionBackwardDataWorkspaceSize(
            h, p.w_desc, p.y_desc, p.conv_desc, p.x_desc,
            static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), bytes);
      });
}

bool ready_backward_filter(const GpuContext& ctx, const Conv2dShape& s, ConvPlan& p) {
  const cudnnHandle_t h = ctx.impl().cudnn;
  return ready<cudnnConvolutionBwdFilterAlgoPerf_t, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT>(
      ctx, s, p, p.bwd_filter, "cudnnGetConvolutionBackwardFilterAlgorithm_v7",
      "backward-filter convolution",
      [&](cudnnConvolutionBwdFilterAlgoPerf_t* perf, int* count) {
        return cudnnGetConvolutionBackwardFilterAlgorithm_v7(
            h, p.x_desc, p.y_desc, p.conv_desc, p.w_desc, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
            count, perf);
      },
      [&](int algo, std::size_t* bytes) {
        return cudnnGetConvolutionBackwardFilterWorkspaceSize(
            h, p.x_desc, p.y_desc, p.conv_desc, p.w_desc,
            static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), bytes);
      });
}

// Whether a failed run is worth trying the next candidate for: Note [Choosing convolution
// algorithms].
bool worth_next_candidate(cudnnStatus_t status) {
  const int category = CUDNN_STATUS_CATEGORY(static_cast<int>(status));
  return category == CUDNN_STATUS_NOT_SUPPORTED || category == CUDNN_STATUS_BAD_PARAM ||
         category == CUDNN_STATUS_EXECUTION_FAILED;
}

// Runs one direction's convolution: launch(algo, workspace, bytes) makes the cuDNN call with the
// descriptor already in the algorithm's math mode. Candidates in rank order from the one that ran
// last (candidates.h); each with its workspace, or the no-workspace algorithm when the workspace
// cannot be allocated.
template <typename Launch>
void run_candidates(const GpuContext& ctx, const Conv2dShape& s, ConvPlan& p, ConvChoice& c,
                    const char* what, const char* call, Launch launch) {
  c.candidates.run(
      [&](const ConvAlgo& a) -> std::optional<std::string> {
        bool ok = true;
        DeviceBuffer ws = try_workspace(ctx, a.workspace, &ok);
        if (!ok && !c.have_zero) no_fallback(ctx, s, what, a.workspace);
        const ConvAlgo& use = ok ? a : c.zero;
        TW_CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv_desc, use.math));
        const cudnnStatus_t status = launch(use.algo, ws.data(), ws.size());
        if (status == CUDNN_STATUS_SUCCESS) return std::nullopt;
        if (!worth_next_candidate(status)) detail::raise_cudnn(status, call);
        cudaGetLastError();  // a failed launch's (non-sticky) error must not reach the next call
        return std::string(cudnnGetErrorString(status));
      },
      [](const ConvAlgo& a) {
        return str("algo ", a.algo, a.math == CUDNN_TENSOR_OP_MATH ? " (tensor-op math)" : "");
      },
      str("cuDNN ", what, " of ", s.to_string(), " in ", type_name(p.data_type), " on ",
          ctx.device(), " (", call, ")"),
      str("no ranked algorithm runs for this shape and precision with cuDNN ",
          cudnnGetVersion(), "; try another batch size",
          p.data_type == CUDNN_DATA_FLOAT ? "" : " or float32 precision",
          ", or run this model on the CPU"));
}

const float kOne = 1.0f;  // float scaling factors for float and 16-bit data alike
const float kZero = 0.0f;

// The three convolutions in plan p's data type, on buffers of that type (filters OHWI), after
// ready_*() returned true.
void run_forward(const GpuContext& ctx, const Conv2dShape& s, ConvPlan& p, const void* x,
                 const void* w, void* y) {
  run_candidates(ctx, s, p, p.fwd, "forward convolution", "cudnnConvolutionForward",
                 [&](int algo, void* ws, std::size_t bytes) {
                   return cudnnConvolutionForward(
                       ctx.impl().cudnn, &kOne, p.x_desc, x, p.w_desc, w, p.conv_desc,
                       static_cast<cudnnConvolutionFwdAlgo_t>(algo), ws, bytes, &kZero, p.y_desc,
                       y);
                 });
}
void run_backward_data(const GpuContext& ctx, const Conv2dShape& s, ConvPlan& p, const void* dy,
                       const void* w, void* dx) {
  run_candidates(ctx, s, p, p.bwd_data, "backward-data convolution",
                 "cudnnConvolutionBackwardData", [&](int algo, void* ws, std::size_t bytes) {
                   return cudnnConvolutionBackwardData(
                       ctx.impl().cudnn, &kOne, p.w_desc, w, p.y_desc, dy, p.conv_desc,
                       static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), ws, bytes, &kZero,
                       p.x_desc, dx);
                 });
}
void run_backward_filter(const GpuContext& ctx, const Conv2dShape& s, ConvPlan& p, const void* x,
                         const void* dy, void* dw) {
  run_candidates(ctx, s, p, p.bwd_filter, "backward-filter convolution",
                 "cudnnConvolutionBackwardFilter", [&](int algo, void* ws, std::size_t bytes) {
                   return cudnnConvolutionBackwardFilter(
                       ctx.impl().cudnn, &kOne, p.x_desc, x, p.y_desc, dy, p.conv_desc,
                       static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), ws, bytes, &kZero,
                       p.w_desc, dw);
                 });
}

std::int64_t input_count(const Conv2dShape& s) {
  return static_cast<std::int64_t>(s.n) * s.h * s.w * s.c_in;
}
std::int64_t output_count(const Conv2dShape& s) {
  return static_cast<std::int64_t>(s.n) * s.out_h() * s.out_w() * s.c_out;
}
std::int64_t weight_count(const Conv2dShape& s) {
  return static_cast<std::int64_t>(s.c_out) * s.c_in * s.kh * s.kw;
}
std::size_t bytes_of(std::int64_t count, std::size_t element) {
  return static_cast<std::size_t>(std::max<std::int64_t>(count, 1)) * element;
}

// OIHW <-> OHWI: see Note [Filter layout for cuDNN].
DeviceBuffer to_ohwi(const GpuContext& ctx, const Conv2dShape& s, const float* w) {
  DeviceBuffer out(ctx, bytes_of(weight_count(s), sizeof(float)));
  transpose_batched(ctx, s.c_out, s.c_in, static_cast<std::int64_t>(s.kh) * s.kw, w,
                    out.as<float>());
  return out;
}
void ohwi_to_oihw(const GpuContext& ctx, const Conv2dShape& s, const float* w, float* out) {
  transpose_batched(ctx, s.c_out, static_cast<std::int64_t>(s.kh) * s.kw, s.c_in, w, out);
}

// count floats converted to t, in a buffer of their own.
DeviceBuffer to_half(const GpuContext& ctx, Half t, std::int64_t count, const float* x) {
  DeviceBuffer out(ctx, bytes_of(count, 2));
  float_to_half(ctx, t, count, x, out.data());
  return out;
}
// count floats rounded to t, as floats: the emulated path's operands.
DeviceBuffer rounded(const GpuContext& ctx, Half t, std::int64_t count, const float* x) {
  DeviceBuffer out(ctx, bytes_of(count, sizeof(float)));
  if (t == Half::Bf16)
    round_to_bf16(ctx, count, x, out.as<float>());
  else
    round_to_fp16(ctx, count, x, out.as<float>());
  return out;
}

}  // namespace

void conv2d_forward(const GpuContext& ctx, const Conv2dShape& s, const float* x, const float* w,
                    float* y) {
  s.validate();
  auto scope = ctx.impl().scope();
  ConvPlan& p = plan_for(ctx, s, CUDNN_DATA_FLOAT);
  if (!ready_forward(ctx, s, p)) no_algorithm(ctx, s, "forward convolution");
  const DeviceBuffer w_ohwi = to_ohwi(ctx, s, w);
  run_forward(ctx, s, p, x, w_ohwi.data(), y);
}

void conv2d_backward_input(const GpuContext& ctx, const Conv2dShape& s, const float* dy,
                           const float* w, float* dx) {
  s.validate();
  auto scope = ctx.impl().scope();
  ConvPlan& p = plan_for(ctx, s, CUDNN_DATA_FLOAT);
  if (!ready_backward_data(ctx, s, p)) no_algorithm(ctx, s, "backward-data convolution");
  const DeviceBuffer w_ohwi = to_ohwi(ctx, s, w);
  run_backward_data(ctx, s, p, dy, w_ohwi.data(), dx);
}

void conv2d_backward_weight(const GpuContext& ctx, const Conv2dShape& s, const float* x,
                            const float* dy, float* dw) {
  s.validate();
  auto scope = ctx.impl().scope();
  ConvPlan& p = plan_for(ctx, s, CUDNN_DATA_FLOAT);
  if (!ready_backward_filter(ctx, s, p)) no_algorithm(ctx, s, "backward-filter convolution");
  DeviceBuffer dw_ohwi(ctx, bytes_of(weight_count(s), sizeof(float)));
  run_backward_filter(ctx, s, p, x, dy, dw_ohwi.data());
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

// ---- 16-bit (Note [16-bit convolutions on tensor cores]) --------------------------------------

void conv2d_forward_half(const GpuContext& ctx, Half t, const Conv2dShape& s, const float* x,
                         const float* w, float* y) {
  s.validate();
  auto scope = ctx.impl().scope();
  ConvPlan& p = plan_for(ctx, s, cudnn_type(t));
  if (!ready_forward(ctx, s, p)) {
    const DeviceBuffer xr = rounded(ctx, t, input_count(s), x);
    const DeviceBuffer wr = rounded(ctx, t, weight_count(s), w);
    return conv2d_forward(ctx, s, xr.as<float>(), wr.as<float>(), y);
  }
  const DeviceBuffer xh = to_half(ctx, t, input_count(s), x);
  const DeviceBuffer w_ohwi = to_ohwi(ctx, s, w);
  const DeviceBuffer wh = to_half(ctx, t, weight_count(s), w_ohwi.as<float>());
  DeviceBuffer yh(ctx, bytes_of(output_count(s), 2));
  run_forward(ctx, s, p, xh.data(), wh.data(), yh.data());
  half_to_float(ctx, t, output_count(s), yh.data(), y);
}

void conv2d_backward_input_half(const GpuContext& ctx, Half t, const Conv2dShape& s,
                                const float* dy, const float* w, float* dx) {
  s.validate();
  auto scope = ctx.impl().scope();
  ConvPlan& p = plan_for(ctx, s, cudnn_type(t));
  if (!ready_backward_data(ctx, s, p)) {
    const DeviceBuffer dyr = rounded(ctx, t, output_count(s), dy);
    const DeviceBuffer wr = rounded(ctx, t, weight_count(s), w);
    return conv2d_backward_input(ctx, s, dyr.as<float>(), wr.as<float>(), dx);
  }
  const DeviceBuffer dyh = to_half(ctx, t, output_count(s), dy);
  const DeviceBuffer w_ohwi = to_ohwi(ctx, s, w);
  const DeviceBuffer wh = to_half(ctx, t, weight_count(s), w_ohwi.as<float>());
  DeviceBuffer dxh(ctx, bytes_of(input_count(s), 2));
  run_backward_data(ctx, s, p, dyh.data(), wh.data(), dxh.data());
  half_to_float(ctx, t, input_count(s), dxh.data(), dx);
}

void conv2d_backward_weight_half(const GpuContext& ctx, Half t, const Conv2dShape& s,
                                 const float* x, const float* dy, float* dw) {
  s.validate();
  auto scope = ctx.impl().scope();
  ConvPlan& p = plan_for(ctx, s, cudnn_type(t));
  if (!ready_backward_filter(ctx, s, p)) {
    const DeviceBuffer xr = rounded(ctx, t, input_count(s), x);
    const DeviceBuffer dyr = rounded(ctx, t, output_count(s), dy);
    return conv2d_backward_weight(ctx, s, xr.as<float>(), dyr.as<float>(), dw);
  }
  const DeviceBuffer xh = to_half(ctx, t, input_count(s), x);
  const DeviceBuffer dyh = to_half(ctx, t, output_count(s), dy);
  DeviceBuffer dwh(ctx, bytes_of(weight_count(s), 2));
  run_backward_filter(ctx, s, p, xh.data(), dyh.data(), dwh.data());
  DeviceBuffer dw_ohwi(ctx, bytes_of(weight_count(s), sizeof(float)));
  half_to_float(ctx, t, weight_count(s), dwh.data(), dw_ohwi.as<float>());
  ohwi_to_oihw(ctx, s, dw_ohwi.as<float>(), dw);
}

}  // namespace towerflow::gpu
