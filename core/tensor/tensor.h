#pragma once
// Tensor: an n-dimensional array on one device, with reverse-mode autograd.
//
// A Tensor is a cheap handle (a shared pointer) to a TensorImpl: shape, strides, dtype, an offset
// into a Storage (memory from the device's allocator, returned when the last view dies), and the
// autograd state. Copying a Tensor copies the handle; clone() copies the data.
//
// Conventions:
// - 4-D activations are NHWC ([n, h, w, c], channels-last); conv weights OIHW; linear weights
//   [out, in]. Why NHWC: see Note [Channels-last on the CPU] in core/cpu/conv.cc; in short, the
//   channel loop is the contiguous one, so every kernel vectorises over channels and the 3x3
//   convolutions become GEMMs without a layout change.
// - Ops need contiguous inputs (every op output and every view made here is contiguous);
//   strides exist so that non-contiguous views can be added without changing the layout.
// - Element access from the host goes through to_host / copy_from_host (the memory may be a
//   GPU's); data<T>() is a device pointer for kernels.
//
// Thread-safety: a Tensor may be read from several threads; writing the same tensor from two
// threads at once is a data race, as for any container. Autograd state is per tensor, and
// no_grad is per thread, so distinct models on distinct threads are independent.
//
// Errors: a shape, dtype or device that does not fit raises InvalidArgument printing the
// shapes involved; out of memory raises OutOfMemory from the device's allocator.

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/tensor/dtype.h"

namespace towerflow {

using Shape = std::vector<std::int64_t>;
std::string shape_str(const Shape& s);  // "[128, 32, 32, 16]"
std::int64_t shape_numel(const Shape& s);

class Allocator;
class Backend;
struct Node;

// A block of one device's memory. Freed to its allocator when the last holder lets go.
class Storage {
 public:
  Storage(const Device& device, Allocator& allocator, std::size_t bytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  const Device& device() const { return device_; }

 private:
  Device device_;
  Allocator* allocator_;
  void* data_;
  std::size_t bytes_;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  std::int64_t offset = 0;  // in elements
  Shape shape;
  Shape strides;
  DType dtype = DType::kFloat32;
  Device device;
  // autograd
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;  // accumulated by backward() for leaves that require grad
  std::shared_ptr<Node> grad_fn;     // the op that produced this tensor (null for leaves)
};

class Tensor {
 public:
  Tensor() = default;  // undefined: defined() is false
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- creation (memory from the device's allocator) -------------------------------------
  static Tensor empty(const Shape& shape, const Device& device, DType dtype = DType::kFloat32);
  static Tensor zeros(const Shape& shape, const Device& device, DType dtype = DType::kFloat32);
  static Tensor full(const Shape& shape, float value, const Device& device);
  // Copies host data (numel(shape) elements) onto the device. A size mismatch throws
  // InvalidArgument naming both sizes.
  static Tensor from_host(std::span<const float> data, const Shape& shape, const Device& device);
  static Tensor from_host(std::span<const std::int32_t> data, const Shape& shape,
                          const Device& device);

  // ---- copies ----------------------------------------------------------------------------
  // Overwrites this tensor's elements from host memory without allocating; the element count
  // and dtype must match (InvalidArgument otherwise). For loaders: host batch -> device tensor.
  void copy_from_host(std::span<const float> data);
  void copy_from_host(std::span<const std::int32_t> data);
  // Copies the elements to host memory (waits for the device). Size/dtype checked.
  void to_host(std::span<float> out) const;
  void to_host(std::span<std::int32_t> out) const;
  std::vector<float> to_host() const;              // float32 tensors
  std::vector<std::int32_t> to_host_int32() const;  // int32 tensors
  float item() const;  // the value of a one-element float32 tensor
  // Overwrites this tensor's elements with src's (any device, same shape and dtype).
  void copy_(const Tensor& src) const;  // writes the elements, not the handle
  // A copy on `device` (the same data, not a view; a new tensor even on the same device).
  Tensor to(const Device& device) const;
  Tensor clone() const;

  // ---- metadata --------------------------------------------------------------------------
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  const Shape& strides() const;
  int ndim() const { return static_cast<int>(shape().size()); }
  std::int64_t dim(int i) const;  // negative counts from the end
  std::int64_t numel() const;
  DType dtype() const;
  const Device& device() const;
  bool is_contiguous() const;
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype()); }
  std::string describe() const;  // "float32[128, 32, 32, 16] on /cpu:0"

  // Device pointer to the first element. T must match the dtype (InvalidArgument otherwise).
  template <typename T>
  T* data() const {
    check_dtype(dtype_of<T>());
    return static_cast<T*>(raw_data());
  }
  void* raw_data() const;

  // ---- views (no copy; share storage and, for autograd, are leaves of their own) ---------
  // The same elements with a new shape (one dim may be -1). Needs a contiguous tensor.
  Tensor view(const Shape& shape) const;
  // Rows [begin, end) of dim 0.
  Tensor slice(std::int64_t begin, std::int64_t end) const;

  // ---- autograd --------------------------------------------------------------------------
  bool requires_grad() const;
  Tensor& set_requires_grad(bool on);
  // The accumulated gradient (undefined until a backward() reached this leaf, or set_grad()).
  Tensor grad() const;
  // Makes `g` (same shape, dtype and device) this leaf's gradient buffer: later backward()
  // calls accumulate into g's memory (how Module keeps gradients in one flat buffer).
  void set_grad(const Tensor& g);
  // Reverse-mode differentiation from this scalar (numel 1): accumulates d(this)/d(leaf) into
  // every leaf that requires grad, then frees the graph (a second backward() through the same
  // graph throws InvalidArgument). Throws InvalidArgument for a non-scalar or a tensor that does
  // not require grad.
  void backward() const;
  // The same data without autograd history.
  Tensor detach() const;
  const std::shared_ptr<Node>& grad_fn() const;

  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

 private:
  void check_dtype(DType t) const;
  void check_defined() const;
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);  // describe()

// ---- no_grad --------------------------------------------------------------------------------
// While a NoGradGuard lives, ops on this thread record no autograd history (evaluation).
bool grad_enabled();
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace towerflow
