#pragma once
// 2-D max and average pooling on the CPU, NHWC (channels-last), dense buffers.
//
// Contract:
// - Output sizes use floor mode (PyTorch's default): out = (in + 2*pad - k) / stride + 1.
// - Max pool counts padding as -inf (PyTorch); average pool counts padding as zeros and always
//   divides by kh*kw (count_include_pad = true, PyTorch's default).
// - Ties in max pool go to the first element in (row, column) order; a NaN in a window wins and
//   propagates (PyTorch's rule).
// - Results are bitwise identical for any number of threads.
// - Backward kernels overwrite dx. Inputs and outputs must not overlap. Work runs on ctx's
//   threads; the call returns when it is done.
// - A shape with a non-positive size or stride, a negative padding, padding larger than half the
//   kernel (PyTorch's rule), or a window larger than the padded input throws
//   towerflow::InvalidArgument naming the field.

#include <cstdint>
#include <string>

#include "core/cpu/context.h"
#include "core/shapes.h"

namespace towerflow::cpu {

// Max pool. argmax (nullable) receives, per output element, the flat input index h*w_in + w of
// the chosen element within its image and channel (what PyTorch's return_indices gives).
void max_pool_forward(const CpuContext& ctx, const Pool2dShape& s, const float* x, float* y,
                      std::int32_t* argmax);
// dx[argmax] += dy for every output element, in output order, over a zeroed dx; outputs whose
// argmax is -1 pass nothing. Overwrites dx. argmax is the (non-null) output of max_pool_forward or
// max_pool_relu_forward for the same shape.
void max_pool_backward(const CpuContext& ctx, const Pool2dShape& s, const float* dy,
                       const std::int32_t* argmax, float* dx);
// max_pool_backward, and sums[ch] = the sum of dx over every pixel for each channel ch, in the
// same pass: the bias gradient of a convolution whose output the pool read. Summed in float over
// each row's pixels and in double beyond, in a fixed order: the same bits for any thread count,
// and conv2d_backward_bias's sum (conv.h) to float rounding (Note [Channel sums of a pool
// gradient] in pool.cc).
void max_pool_backward_channel_sums(const CpuContext& ctx, const Pool2dShape& s, const float* dy,
                                    const std::int32_t* argmax, float* dx, float* sums);

// max_pool_backward for input rows [r0, r1) of the batch alone (row r is row r % s.h of image
// r / s.h), on the calling thread: row r's gradient goes to dx_rows + (r - r0) * s.w * s.c, the
// bits max_pool_backward gives it, and where row_sums is not null, row_sums[(r - r0) * s.c + ch]
// = the sum of that row's gradient of channel ch, in float in pixel order. For a reader of the
// gradient that wants it a few rows at a time, while they are in cache (a convolution's weight
// gradient, bf16.h's conv2d_backward_weight_bf16_dy_rows_with). Rows outside the batch are the
// caller's error (InternalError).
void max_pool_backward_rows(const Pool2dShape& s, const float* dy, const std::int32_t* argmax,
                            std::int64_t r0, std::int64_t r1, float* dx_rows, float* row_sums);

// max_pool2d followed by a ReLU in one pass: y = relu(max pool of x), where relu(v) = v < 0 ? 0 : v
// (NaN stays NaN). argmax (non-null) is max_pool_forward's where y > 0 and -1 elsewhere, where
// the ReLU passes no gradient: max_pool_backward with it gives the bits of relu_backward followed
// by max_pool_backward, in one pass.
void max_pool_relu_forward(const CpuContext& ctx, const Pool2dShape& s, const float* x, float* y,
                           std::int32_t* argmax);
// max_pool_relu_forward with y stored as bf16 bits (bf16.h's bf16 inputs): each value the float
// one rounded to nearest even (NaN stays NaN), argmax the same.
void max_pool_relu_forward_bf16(const CpuContext& ctx, const Pool2dShape& s, const float* x,
                                std::uint16_t* y, std::int32_t* argmax);

// Average pool, count_include_pad = true.
void avg_pool_forward(const CpuContext& ctx, const Pool2dShape& s, const float* x, float* y);
// Overwrites dx.
void avg_pool_backward(const CpuContext& ctx, const Pool2dShape& s, const float* dy, float* dx);

}  // namespace towerflow::cpu
