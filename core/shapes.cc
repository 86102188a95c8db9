// The kernels' shapes (shapes.h): validation and printing.
#include "core/shapes.h"

#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "core/error.h"

namespace towerflow {

namespace {

// A field's lower bound: `value` >= `minimum`, else InvalidArgument naming the shape, the field
// and the fix.
class Bounds {
 public:
  Bounds(const char* kind, std::string shape) : kind_(kind), shape_(std::move(shape)) {}
  const Bounds& at_least(const char* field, int value, int minimum, const char* fix) const {
    if (value < minimum)
      raise<InvalidArgument>(kind_, " shape {", shape_, "}: ", field, " = ", value,
                             " must be at least ", minimum, "; ", fix);
    return *this;
  }

 private:
  const char* kind_;
  std::string shape_;
};

}  // namespace

// ---- convolution ---------------------------------------------------------------------------

std::string Conv2dShape::to_string() const {
  return str("n=", n, " h=", h, " w=", w, " c_in=", c_in, " c_out=", c_out, " k=", kh, "x", kw,
             " stride=", stride_h, "x", stride_w, " pad=", pad_h, "x", pad_w);
}

std::string Conv2dShape::describe() const {
  return str(n, "x", h, "x", w, "x", c_in, " -> ", c_out, ", ", kh, "x", kw, ", stride ", stride_h,
             stride_w != stride_h ? str("x", stride_w) : "", ", pad ", pad_h,
             pad_w != pad_h ? str("x", pad_w) : "");
}

std::string describe_matmul(bool trans_a, bool trans_b, int m, int n, int k) {
  return str(m, "x", k, trans_a ? " (a^T)" : "", " * ", k, "x", n, trans_b ? " (b^T)" : "");
}

std::int64_t Conv2dShape::macs() const {
  return std::int64_t{n} * out_h() * out_w() * c_out * c_in * kh * kw;
}

void Conv2dShape::validate() const {
  Bounds("conv2d", to_string())
      .at_least("n", n, 1, "pass the batch size")
      .at_least("h", h, 1, "pass the input height")
      .at_least("w", w, 1, "pass the input width")
      .at_least("c_in", c_in, 1, "pass the input channels")
      .at_least("c_out", c_out, 1, "pass the output channels")
      .at_least("kh", kh, 1, "pass the kernel height")
      .at_least("kw", kw, 1, "pass the kernel width")
      .at_least("stride_h", stride_h, 1, "strides start at 1")
      .at_least("stride_w", stride_w, 1, "strides start at 1")
      .at_least("pad_h", pad_h, 0, "padding cannot be negative")
      .at_least("pad_w", pad_w, 0, "padding cannot be negative");
  if (kh > h + 2 * pad_h)
    raise<InvalidArgument>("conv2d shape {", to_string(), "}: kernel height kh = ", kh,
                           " is larger than the padded input height h + 2*pad_h = ", h + 2 * pad_h,
                           "; use a smaller kernel or more padding");
  if (kw > w + 2 * pad_w)
    raise<InvalidArgument>("conv2d shape {", to_string(), "}: kernel width kw = ", kw,
                           " is larger than the padded input width w + 2*pad_w = ", w + 2 * pad_w,
                           "; use a smaller kernel or more padding");
  constexpr std::int64_t kMax = std::numeric_limits<std::int32_t>::max();
  const std::int64_t in = std::int64_t{n} * h * w * c_in;
  const std::int64_t out = std::int64_t{n} * out_h() * out_w() * c_out;
  const std::int64_t weights = std::int64_t{c_out} * c_in * kh * kw;
  if (in > kMax || out > kMax || weights > kMax)
    raise<InvalidArgument>("conv2d shape {", to_string(), "}: a tensor has more than 2^31 ",
                           "elements (input ", in, ", output ", out, ", weights ", weights,
                           "); split the batch");
}

// ---- pooling --------------------------------------------------------------------------------

std::string Pool2dShape::to_string() const {
  return str("n=", n, " h=", h, " w=", w, " c=", c, " k=", kh, "x", kw, " stride=", stride_h,
             "x", stride_w, " pad=", pad_h, "x", pad_w);
}

void Pool2dShape::validate() const {
  Bounds("pool2d", to_string())
      .at_least("n", n, 1, "pass the batch size")
      .at_least("h", h, 1, "pass the input height")
      .at_least("w", w, 1, "pass the input width")
      .at_least("c", c, 1, "pass the channels")
      .at_least("kh", kh, 1, "pass the window height")
      .at_least("kw", kw, 1, "pass the window width")
      .at_least("stride_h", stride_h, 1, "strides start at 1 (PyTorch's default stride is the window)")
      .at_least("stride_w", stride_w, 1, "strides start at 1 (PyTorch's default stride is the window)")
      .at_least("pad_h", pad_h, 0, "padding cannot be negative")
      .at_least("pad_w", pad_w, 0, "padding cannot be negative");
  if (2 * pad_h > kh || 2 * pad_w > kw)
    raise<InvalidArgument>("pool2d shape {", to_string(), "}: padding ", pad_h, "x", pad_w,
                           " is more than half the window ", kh, "x", kw,
                           "; use pad <= k/2 (PyTorch's rule)");
  if (kh > h + 2 * pad_h || kw > w + 2 * pad_w)
    raise<InvalidArgument>("pool2d shape {", to_string(), "}: window ", kh, "x", kw,
                           " is larger than the padded input ", h + 2 * pad_h, "x",
                           w + 2 * pad_w, "; use a smaller window or more padding");
  const std::int64_t in = std::int64_t{n} * h * w * c;
  if (in > std::numeric_limits<std::int32_t>::max() ||
      std::int64_t{h} * w > std::numeric_limits<std::int32_t>::max())
    raise<InvalidArgument>("pool2d shape {", to_string(), "}: the input has more than 2^31 ",
                           "elements; split the batch");
}

}  // namespace towerflow
