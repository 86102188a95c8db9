#pragma once
// The shapes of the convolution and pooling kernels, shared by every device's kernels (the CPU's
// in core/cpu, the GPU's in core/cuda) and the op set that validates them (core/tensor/ops.cc).
// NHWC activations, OIHW weights; out_h/out_w use floor mode (PyTorch's).

#include <cstdint>
#include <string>

namespace towerflow {

struct Conv2dShape {
  int n, h, w, c_in, c_out, kh, kw, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  int out_h() const { return (h + 2 * pad_h - kh) / stride_h + 1; }
  int out_w() const { return (w + 2 * pad_w - kw) / stride_w + 1; }

  // Throws InvalidArgument when the shape cannot describe a convolution.
  void validate() const;
  // "n=128 h=32 w=32 c_in=16 c_out=16 k=3x3 stride=1x1 pad=1x1", for messages and benchmarks.
  std::string to_string() const;
  // "128x32x32x3 -> 64, 5x5, stride 1, pad 2": for reports (kernel choice, MAC counts).
  std::string describe() const;
  // Multiply-adds of one forward pass (each of the three kernels does this many).
  std::int64_t macs() const;
};

struct Pool2dShape {
  int n, h, w, c, kh, kw, stride_h, stride_w, pad_h = 0, pad_w = 0;
  int out_h() const { return (h + 2 * pad_h - kh) / stride_h + 1; }
  int out_w() const { return (w + 2 * pad_w - kw) / stride_w + 1; }

  void validate() const;
  std::string to_string() const;
};

// "128x4096 * 4096x384 (b^T)": c[m, n] = op(a) op(b), for reports.
std::string describe_matmul(bool trans_a, bool trans_b, int m, int n, int k);

}  // namespace towerflow
