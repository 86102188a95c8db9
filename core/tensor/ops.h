#pragma once
// The op set: differentiable functions over Tensors.
//
// Contract (every op):
// - Runs on the device its inputs live on; inputs on different devices throw InvalidArgument
//   naming both devices. When that device's backend has no kernel for the op, the op runs on
//   /cpu:0 under allow_soft_placement (inputs copied there, outputs copied back, logged once per
//   op and device); without it, DeviceError naming the op, the device and the option.
//   With log_device_placement, each named op (see OpScope) is logged once, TensorFlow-style:
//   "layer1.0.conv1/Conv2D: (Conv2D): /job:localhost/replica:0/task:0/device:CPU:0".
// - Outputs are new contiguous tensors from the device's allocator.
// - Records autograd history when grad_enabled() and an input requires grad.
// - Shape mismatches throw InvalidArgument printing every shape involved.
// - Activations are NHWC [n, h, w, c]; conv weights OIHW; linear weights [out, in].

#include <cstdint>
#include <optional>
#include <string>

#include "core/tensor/tensor.h"
#include "core/trace.h"

namespace towerflow {

// ---- naming (for log_device_placement and the trace) ------------------------------------------
// Names the ops issued on this thread while it lives: "layer1.0.conv1" makes a convolution log
// as "layer1.0.conv1/Conv2D". Scopes nest by replacement (the innermost wins). While a trace is
// on (core/trace.h), a scope is also a "layer" span on the thread's track, and every op a span of
// category "op" (its gradient, "grad") detailed with the scope. The backward pass runs each op's
// gradient in the scope its forward ran in (without a span of its own: trace_span false), so that
// what the gradient's kernels report, such as the kernel choice's start-up block, names the layer.
class OpScope {
 public:
  explicit OpScope(std::string name, bool trace_span = true);
  ~OpScope();
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;
  static const std::string& current();

 private:
  std::string previous_;
  std::optional<trace::Span> span_;
};

// ---- layers' ops ------------------------------------------------------------------------------
// Which ops read an op's output: any (kAny), only convolutions (kConvolutions), only a batch
// norm (kBatchNorm), or only convolutions and fused batch norms that add it as their residual
// (kConvolutionsAndResidual: a ResNet block's output, read by the next block's convolutions and
// its batch_norm_add_relu).
enum class OutputReaders { kAny, kConvolutions, kBatchNorm, kConvolutionsAndResidual };

struct Conv2dOptions {
  int stride = 1;
  int padding = 0;
  // With kBatchNorm, conv2d stores its output as bfloat16 under bf16 precision, where the device
  // supports(kBf16Activations): each value its float32 output rounded to nearest even, as
  // PyTorch's autocast stores a convolution's output, for the batch norm that reads it (Note
  // [bf16 convolution outputs] in ops.cc). The batch norm computes in float32 from it.
  OutputReaders readers = OutputReaders::kAny;
};
// x [n, h, w, c_in], w [c_out, c_in, kh, kw], bias [c_out] or undefined -> [n, oh, ow, c_out].
// x float32, or bfloat16 (batch_norm_relu's output for a convolution, Note [bf16 activations] in
// ops.cc), read exactly; every gradient is float32.
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, Conv2dOptions opts = {});

// x [n, in], w [out, in], bias [out] or undefined -> x w^T + bias, [n, out].
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias);
// a [m, k], b [k, n] -> [m, n].
Tensor matmul(const Tensor& a, const Tensor& b);
// x [..., c] + bias [c].
Tensor bias_add(const Tensor& x, const Tensor& bias);

Tensor relu(const Tensor& x);
// GELU, exact (erf) form, as torch.nn.GELU(): x/2 * (1 + erf(x / sqrt 2)).
Tensor gelu(const Tensor& x);
Tensor add(const Tensor& a, const Tensor& b);  // same shapes
Tensor mul(const Tensor& a, const Tensor& b);  // same shapes, elementwise
Tensor scale(const Tensor& x, float alpha);    // alpha * x
Tensor sum(const Tensor& x);                   // a one-element tensor [1]

struct Pool2dOptions {
  int kernel = 2;
  int stride = 2;
  int padding = 0;
  // With kConvolutions, max_pool2d_relu stores its output as bfloat16 under bf16 precision, where
  // the device supports(kBf16Activations), as batch_norm_relu does (BatchNormOptions::readers).
  OutputReaders readers = OutputReaders::kAny;
};
// Floor mode; max pool pads with -inf, average pool counts padding (PyTorch's defaults).
Tensor max_pool2d(const Tensor& x, Pool2dOptions opts);
// max_pool2d(relu(x)), computed as relu(max_pool2d(x)): the same values and gradient bit for bit
// (ReLU is monotone, so the window's first largest element is the same; a window whose largest is
// not positive passes no gradient either way), with the ReLU and its gradient on the pooled tensor
// instead of passes over x. Op "MaxPoolRelu".
Tensor max_pool2d_relu(const Tensor& x, Pool2dOptions opts);
// max_pool2d_relu(conv2d(x, w, bias, conv), pool) as one op, "Conv2DMaxPoolRelu": the same values
// and gradients bit for bit, but the bias's, which is summed in the pool's backward pass as it
// writes the convolution's output gradient instead of in a pass of its own over that gradient: the
// same sum in another order, deterministic, equal to float rounding (core/cpu/pool.h).
Tensor conv2d_max_pool2d_relu(const Tensor& x, const Tensor& w, const Tensor& bias, Conv2dOptions conv,
                              Pool2dOptions pool);
Tensor avg_pool2d(const Tensor& x, Pool2dOptions opts);
// [n, h, w, c] -> [n, c]: the mean over h and w.
Tensor global_avg_pool(const Tensor& x);

class BatchNormSync;  // core/tensor/batch_norm_sync.h

struct BatchNormOptions {
  bool training = true;   // batch statistics (and running-average update) vs running statistics
  float momentum = 0.1f;  // PyTorch's convention: running = (1 - m) * running + m * batch
  float eps = 1e-5f;
  // Synchronised batch norm: in training, the statistics are those of the rows of every member
  // of this group together (each member calling with its own x), forward and backward; see
  // batch_norm_sync.h. Null: x's own rows. Ignored in inference.
  BatchNormSync* sync = nullptr;
  // With kConvolutions, batch_norm_relu in training stores its output as bfloat16 under bf16
  // precision, where the device supports(kBf16Activations) and sync is null: the convolutions
  // round their input to bf16 anyway, so every result is the same, bit for bit, while the pass
  // writes, the convolution reads and the graph keeps half the bytes (Note [bf16 activations]
  // in ops.cc). Ops other than conv2d and the batch norms reject a bfloat16 input.
  // batch_norm_add_relu does the same where x is bfloat16 (a convolution's output stored for it).
  // With kConvolutionsAndResidual, batch_norm_relu and batch_norm_add_relu store their output as
  // bfloat16 under the same conditions, and the next batch_norm_add_relu reads such a residual
  // as it is: the residual's rounding is one of its own (Note [bf16 block outputs]).
  OutputReaders readers = OutputReaders::kAny;
};
// Over the last dimension (channels) of x [..., c]; gamma, beta, running_mean, running_var [c].
// x float32, or bfloat16 (a convolution's output stored for it, Conv2dOptions::readers), read
// exactly and computed on in float32; the residual float32 or bfloat16 (a block's output,
// above), read exactly; y and every gradient float32 (but the bf16 outputs above).
// In training, running_mean / running_var (if defined) are updated in place, with the unbiased
// variance (PyTorch's rule; with sync, of the whole group's rows, so every member gets the same
// values); they are never differentiated. With sync, dgamma and dbeta are this member's share
// (summed over members they are the group's), and dx is the exact input gradient of batch norm
// over the group's rows. Training needs more than one row per channel (over the group, with
// sync); on a device whose backend has no kBatchNormSync kernels, sync follows soft placement.
Tensor batch_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                  const Tensor& running_mean, const Tensor& running_var, BatchNormOptions opts);
// relu(batch_norm(x)) in one pass (forward and backward).
Tensor batch_norm_relu(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                       const Tensor& running_mean, const Tensor& running_var,
                       BatchNormOptions opts);
// relu(batch_norm(x) + residual) in one pass: the tail of a ResNet basic block.
Tensor batch_norm_add_relu(const Tensor& x, const Tensor& residual, const Tensor& gamma,
                           const Tensor& beta, const Tensor& running_mean,
                           const Tensor& running_var, BatchNormOptions opts);

// [n, ...] -> [n, prod(...)]. A 4-D NHWC tensor is flattened in PyTorch's (c, h, w) order, so a
// following linear layer has PyTorch's weight layout; when h = w = 1 this is a view.
Tensor flatten(const Tensor& x);

// Inverted dropout with drop probability p in [0, 1): in training, element i is kept iff
// dropout_keeps(seed, offset + i, p) (backend_impl.h) and scaled by 1/(1-p); otherwise (or p = 0)
// returns x itself. p outside [0, 1) throws InvalidArgument.
Tensor dropout(const Tensor& x, float p, bool training, std::uint64_t seed,
               std::uint64_t offset = 0);

// ---- loss and metrics ------------------------------------------------------------------------
struct SoftmaxCrossEntropyOptions {
  // The loss is sum over the rows / scale. 0 means the number of rows (the mean over the batch).
  // Towers pass the global batch size: see Note [Why towers scale loss by B] in tower/.
  float scale = 0.0f;
  float label_smoothing = 0.0f;  // in [0, 1): targets (1 - s) * onehot + s / classes
};
// logits [n, classes] float32, labels [n] int32 in [0, classes) -> a one-element tensor.
// A label out of range throws InvalidArgument naming it.
Tensor softmax_cross_entropy(const Tensor& logits, const Tensor& labels,
                             SoftmaxCrossEntropyOptions opts = {});

// The number of rows whose label is among the k largest logits (no autograd). A row whose logits
// are not all finite (NaN, +-inf) is never counted, as in TensorFlow's in_top_k: a diverged
// model scores 0, not 100%.
std::int64_t top_k_correct(const Tensor& logits, const Tensor& labels, int k = 1);
// top_k_correct / n.
double accuracy(const Tensor& logits, const Tensor& labels, int k = 1);

}  // namespace towerflow
