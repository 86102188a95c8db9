#pragma once
// 2-D convolution kernels on the CPU: forward, gradient of the input, gradient of the weights.
//
// Layouts: activations are NHWC (channels-last), weights are OIHW (PyTorch's state_dict layout),
// all buffers dense. Why NHWC: see Note [Channels-last on the CPU] in conv.cc.
//
// Contract:
// - Every kernel overwrites its output (unless named *_accumulate) and reads nothing from it.
// - Inputs and outputs must not overlap.
// - The work runs on ctx's threads; the call returns when it is done. One context is used by one
//   caller at a time (CpuContext's rule); distinct contexts may run these kernels concurrently.
// - Every output element is summed by one thread in a fixed order: results are bitwise identical
//   for any number of threads.
// - Scratch memory is per thread and grows once to the largest shape seen; steady-state calls do
//   not allocate.
// - A shape with a non-positive size, a negative padding, a kernel larger than the padded input,
//   or an output larger than 2^31 elements throws towerflow::InvalidArgument naming the field.

#include <cstdint>
#include <string>

#include "core/cpu/context.h"
#include "core/shapes.h"

namespace towerflow::cpu {

// y[n, oh, ow, c_out] = sum_{ci, i, j} x[n, oh*sh - ph + i, ow*sw - pw + j, ci] * w[c_out, ci, i, j]
// (no bias; positions outside the input count as zero).
void conv2d_forward(const CpuContext& ctx, const Conv2dShape& s, const float* x, const float* w,
                    float* y);

// dx = conv_transpose(dy, w): the gradient of conv2d_forward with respect to x. Overwrites dx.
void conv2d_backward_input(const CpuContext& ctx, const Conv2dShape& s, const float* dy,
                           const float* w, float* dx);

// dx += conv_transpose(dy, w): each element dx + the value conv2d_backward_input gives, rounded
// once (the same bits as that result added afterwards), without writing it anywhere first. For a
// gradient summed over several consumers of x (Note [Gradients summed in place] in
// core/tensor/autograd.cc).
void conv2d_backward_input_add(const CpuContext& ctx, const Conv2dShape& s, const float* dy,
                               const float* w, float* dx);

// dw = correlate(x, dy): the gradient of conv2d_forward with respect to w. Overwrites dw
// [c_out, c_in, kh, kw].
void conv2d_backward_weight(const CpuContext& ctx, const Conv2dShape& s, const float* x,
                            const float* dy, float* dw);

// ---- Winograd F(2x2, 3x3) -------------------------------------------------------------------

// The forward, backward input, backward input added and backward weight (as above) by
// Winograd's F(2x2, 3x3) (Note [Winograd convolution] in conv.cc): 3x3 kernels at stride 1,
// padding at most 2, channel counts multiples of 8. Each returns false, writing nothing, for any
// other shape. The values are within fp32 rounding of the direct kernels' but not bitwise the
// same; they do not depend on the thread count. bias may be null.
bool conv2d_forward_winograd(const CpuContext& ctx, const Conv2dShape& s, const float* x,
                             const float* w, const float* bias, float* y);
bool conv2d_backward_input_winograd(const CpuContext& ctx, const Conv2dShape& s, const float* dy,
                                    const float* w, float* dx);
bool conv2d_backward_input_add_winograd(const CpuContext& ctx, const Conv2dShape& s,
                                        const float* dy, const float* w, float* dx);
bool conv2d_backward_weight_winograd(const CpuContext& ctx, const Conv2dShape& s, const float* x,
                                     const float* dy, float* dw);

// ---- fused variants ------------------------------------------------------------------------

// As conv2d_forward, then y[..., co] += bias[co] (bias may be null: then exactly conv2d_forward).
void conv2d_forward_bias(const CpuContext& ctx, const Conv2dShape& s, const float* x,
                         const float* w, const float* bias, float* y);

// db[co] = sum over n, oh, ow of dy[n, oh, ow, co]: the gradient of the bias. Overwrites db.
void conv2d_backward_bias(const CpuContext& ctx, const Conv2dShape& s, const float* dy, float* db);

}  // namespace towerflow::cpu
