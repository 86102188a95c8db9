#include "core/tensor/tensor.h"

#include <cstring>
#include <sstream>

#include "core/error.h"
#include "core/memory/allocator.h"
#include "core/tensor/autograd.h"
#include "core/tensor/backend_impl.h"

namespace towerflow {

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << '[';
  for (std::size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
  return os.str();
}

std::int64_t shape_numel(const Shape& s) {
  std::int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

namespace {

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  std::int64_t s = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

void check_shape(const Shape& shape) {
  for (auto d : shape)
    if (d < 0) raise<InvalidArgument>("tensor shape ", shape_str(shape), " has a negative size");
}

}  // namespace

// ---- Storage --------------------------------------------------------------------------------

Storage::Storage(const Device& device, Allocator& allocator, std::size_t bytes)
    : device_(device), allocator_(&allocator), data_(allocator.allocate(bytes)), bytes_(bytes) {}

Storage::~Storage() {
  try {
    allocator_->deallocate(data_);
  } catch (...) {
    // Deallocation of our own pointer cannot fail unless the allocator is corrupt; a destructor
    // must not throw, and the memory is unrecoverable either way.
  }
}

// ---- creation -------------------------------------------------------------------------------

Tensor Tensor::empty(const Shape& shape, const Device& device, DType dtype) {
  check_shape(shape);
  auto impl = std::make_shared<TensorImpl>();
  Backend& be = backend_for(device);
  impl->storage = std::make_shared<Storage>(device, be.allocator(),
                                            static_cast<std::size_t>(shape_numel(shape)) *
                                                dtype_size(dtype));
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  impl->device = device;
  return Tensor(std::move(impl));
}

Tensor Tensor::zeros(const Shape& shape, const Device& device, DType dtype) {
  Tensor t = empty(shape, device, dtype);
  if (dtype == DType::kFloat32) {
    backend_for(device).fill(t.numel(), 0.0f, t.data<float>());
  } else {
    // Every dtype's zero is all-zero bits; go through the host for the rare non-float case.
    std::vector<unsigned char> zeros(t.nbytes(), 0);
    backend_for(device).copy_from_host(t.raw_data(), zeros.data(), zeros.size());
  }
  return t;
}

Tensor Tensor::full(const Shape& shape, float value, const Device& device) {
  Tensor t = empty(shape, device);
  backend_for(device).fill(t.numel(), value, t.data<float>());
  return t;
}

Tensor Tensor::from_host(std::span<const float> data, const Shape& shape, const Device& device) {
  Tensor t = empty(shape, device);
  t.copy_from_host(data);
  return t;
}

Tensor Tensor::from_host(std::span<const std::int32_t> data, const Shape& shape,
                         const Device& device) {
  Tensor t = empty(shape, device, DType::kInt32);
  t.copy_from_host(data);
  return t;
}

// ---- copies ---------------------------------------------------------------------------------

namespace {
void check_host_span(const Tensor& t, std::size_t count, DType dtype, const char* what) {
  if (t.dtype() != dtype)
    raise<InvalidArgument>(what, ": the tensor ", t.describe(), " holds ", t.dtype(), ", not ",
                           dtype);
  if (static_cast<std::int64_t>(count) != t.numel())
    raise<InvalidArgument>(what, ": the host buffer has ", count, " elements but the tensor ",
                           t.describe(), " has ", t.numel());
  if (!t.is_contiguous())
    raise<InvalidArgument>(what, ": the tensor ", t.describe(), " is not contiguous");
}
}  // namespace

void Tensor::copy_from_host(std::span<const float> data) {
  check_defined();
  check_host_span(*this, data.size(), DType::kFloat32, "copy_from_host");
  backend_for(device()).copy_from_host(raw_data(), data.data(), nbytes());
}

void Tensor::copy_from_host(std::span<const std::int32_t> data) {
  check_defined();
  check_host_span(*this, data.size(), DType::kInt32, "copy_from_host");
  backend_for(device()).copy_from_host(raw_data(), data.data(), nbytes());
}

void Tensor::to_host(std::span<float> out) const {
  check_defined();
  check_host_span(*this, out.size(), DType::kFloat32, "to_host");
  backend_for(device()).copy_to_host(out.data(), raw_data(), nbytes());
}

void Tensor::to_host(std::span<std::int32_t> out) const {
  check_defined();
  check_host_span(*this, out.size(), DType::kInt32, "to_host");
  backend_for(device()).copy_to_host(out.data(), raw_data(), nbytes());
}

std::vector<float> Tensor::to_host() const {
  std::vector<float> v(static_cast<std::size_t>(numel()));
  to_host(std::span<float>(v));
  return v;
}

std::vector<std::int32_t> Tensor::to_host_int32() const {
  std::vector<std::int32_t> v(static_cast<std::size_t>(numel()));
  to_host(std::span<std::int32_t>(v));
  return v;
}

float Tensor::item() const {
  check_defined();
  if (numel() != 1)
    raise<InvalidArgument>("item() needs a one-element tensor, got ", describe());
  float v = 0;
  to_host(std::span<float>(&v, 1));
  return v;
}

void Tensor::copy_(const Tensor& src) const {
  check_defined();
  src.check_defined();
  if (src.shape() != shape() || src.dtype() != dtype())
    raise<InvalidArgument>("copy_: source ", src.describe(), " does not match destination ",
                           describe());
  if (!is_contiguous() || !src.is_contiguous())
    raise<InvalidArgument>("copy_ needs contiguous tensors, got ", src.describe(), " -> ",
                           describe());
  if (nbytes() == 0) return;
  Backend& dst_be = backend_for(device());
  if (src.device() == device()) {
    if (src.raw_data() != raw_data()) dst_be.copy(raw_data(), src.raw_data(), nbytes());
  } else {
    dst_be.copy_from_device(raw_data(), backend_for(src.device()), src.raw_data(), nbytes());
  }
}

Tensor Tensor::to(const Device& target) const {
  check_defined();
  Tensor out = empty(shape(), target, dtype());
  out.copy_(*this);
  if (needs_grad({this})) {
    const Device source = device();
    record(out, "Copy", {*this}, [source](const Tensor& g) {
      return std::vector<Tensor>{g.to(source)};
    });
  }
  return out;
}

Tensor Tensor::clone() const { return to(device()); }

// ---- metadata -------------------------------------------------------------------------------

void Tensor::check_defined() const {
  if (!impl_) raise<InvalidArgument>("use of an undefined tensor (default-constructed Tensor)");
}

void Tensor::check_dtype(DType t) const {
  check_defined();
  if (impl_->dtype != t)
    raise<InvalidArgument>("tensor ", describe(), " accessed as ", t);
}

const Shape& Tensor::shape() const {
  check_defined();
  return impl_->shape;
}
const Shape& Tensor::strides() const {
  check_defined();
  return impl_->strides;
}
std::int64_t Tensor::dim(int i) const {
  const int n = ndim();
  const int j = i < 0 ? i + n : i;
  if (j < 0 || j >= n)
    raise<InvalidArgument>("dimension ", i, " is out of range for ", describe());
  return impl_->shape[static_cast<std::size_t>(j)];
}
std::int64_t Tensor::numel() const { return shape_numel(shape()); }
DType Tensor::dtype() const {
  check_defined();
  return impl_->dtype;
}
const Device& Tensor::device() const {
  check_defined();
  return impl_->device;
}
bool Tensor::is_contiguous() const { return strides() == contiguous_strides(shape()); }

std::string Tensor::describe() const {
  if (!impl_) return "undefined tensor";
  return str(impl_->dtype, shape_str(impl_->shape), " on ", impl_->device);
}

void* Tensor::raw_data() const {
  check_defined();
  return static_cast<char*>(impl_->storage->data()) +
         impl_->offset * static_cast<std::int64_t>(dtype_size(impl_->dtype));
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.describe(); }

// ---- views ----------------------------------------------------------------------------------

Tensor Tensor::view(const Shape& new_shape) const {
  check_defined();
  if (!is_contiguous()) raise<InvalidArgument>("view of a non-contiguous tensor ", describe());
  Shape s = new_shape;
  int inferred = -1;
  std::int64_t known = 1;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      if (inferred >= 0) raise<InvalidArgument>("view ", shape_str(new_shape), " has two -1 dims");
      inferred = static_cast<int>(i);
    } else {
      if (s[i] < 0) raise<InvalidArgument>("view ", shape_str(new_shape), " has a negative size");
      known *= s[i];
    }
  }
  if (inferred >= 0) {
    if (known == 0 || numel() % known != 0)
      raise<InvalidArgument>("cannot view ", describe(), " as ", shape_str(new_shape));
    s[static_cast<std::size_t>(inferred)] = numel() / known;
  }
  if (shape_numel(s) != numel())
    raise<InvalidArgument>("cannot view ", describe(), " as ", shape_str(new_shape),
                           ": the element counts differ");
  auto impl = std::make_shared<TensorImpl>(*impl_);
  impl->shape = s;
  impl->strides = contiguous_strides(s);
  impl->grad.reset();
  impl->grad_fn.reset();
  impl->requires_grad = false;
  Tensor out(std::move(impl));
  if (needs_grad({this})) {
    const Shape original = shape();
    record(out, "Reshape", {*this}, [original](const Tensor& g) {
      return std::vector<Tensor>{g.view(original)};
    });
  }
  return out;
}

Tensor Tensor::slice(std::int64_t begin, std::int64_t end) const {
  check_defined();
  if (ndim() < 1 || begin < 0 || end < begin || end > dim(0))
    raise<InvalidArgument>("slice [", begin, ", ", end, ") is out of range for ", describe());
  if (!is_contiguous()) raise<InvalidArgument>("slice of a non-contiguous tensor ", describe());
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->offset = impl_->offset + begin * impl_->strides[0];
  impl->shape = impl_->shape;
  impl->shape[0] = end - begin;
  impl->strides = contiguous_strides(impl->shape);
  impl->dtype = impl_->dtype;
  impl->device = impl_->device;
  return Tensor(std::move(impl));
}

// ---- autograd -------------------------------------------------------------------------------

bool Tensor::requires_grad() const {
  check_defined();
  return impl_->requires_grad || impl_->grad_fn != nullptr;
}

Tensor& Tensor::set_requires_grad(bool on) {
  check_defined();
  if (impl_->grad_fn)
    raise<InvalidArgument>("set_requires_grad on ", describe(),
                           ", which an op produced; only leaves can be marked (use detach())");
  impl_->requires_grad = on;
  return *this;
}

Tensor Tensor::grad() const {
  check_defined();
  return Tensor(impl_->grad);
}

void Tensor::set_grad(const Tensor& g) {
  check_defined();
  if (g.defined() && (g.shape() != shape() || g.dtype() != dtype() || g.device() != device()))
    raise<InvalidArgument>("set_grad: gradient ", g.describe(), " does not match ", describe());
  impl_->grad = g.impl_ptr();
}

Tensor Tensor::detach() const {
  check_defined();
  auto impl = std::make_shared<TensorImpl>(*impl_);
  impl->grad.reset();
  impl->grad_fn.reset();
  impl->requires_grad = false;
  return Tensor(std::move(impl));
}

const std::shared_ptr<Node>& Tensor::grad_fn() const {
  check_defined();
  return impl_->grad_fn;
}

// ---- no_grad --------------------------------------------------------------------------------

namespace {
thread_local bool t_grad_enabled = true;
}

bool grad_enabled() { return t_grad_enabled; }

NoGradGuard::NoGradGuard() : previous_(t_grad_enabled) { t_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { t_grad_enabled = previous_; }

}  // namespace towerflow
