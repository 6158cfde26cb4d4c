// Tensor handles, storage and factories.
#include "framework/tensor.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <new>
#include <sstream>
#include <type_traits>

#include "framework/allocator.h"
#include "framework/autograd.h"
#include "framework/copy.h"
#include "framework/error.h"
#include "framework/random.h"
#include "framework/tensor_impl.h"

namespace ampgrad {

Storage::Storage(size_t nbytes_in, Device device_in)
    : allocator(&allocator_for(device_in)), data(allocator->allocate(nbytes_in)), nbytes(nbytes_in), device(device_in) {}

Storage::Storage(size_t nbytes_in, Allocator& pinned_host)
    : allocator(&pinned_host), data(allocator->allocate(nbytes_in)), nbytes(nbytes_in), pinned(true) {}

Storage::Storage(std::shared_ptr<Storage> of, size_t offset, size_t nbytes_in)
    : nbytes(nbytes_in), device(of->device), pinned(of->pinned) {
  AG_CHECK(offset + nbytes_in <= of->nbytes, "an alias of bytes [", offset, ", ", offset + nbytes_in,
           ") runs past the end of a storage of ", of->nbytes, " bytes");
  data = static_cast<char*>(of->data) + offset;
  base = of->base ? of->base : std::move(of);  // an alias of an alias lies in the first one's base
}

Storage::~Storage() {
  if (allocator != nullptr) allocator->deallocate(data, nbytes);
}

TensorImpl::~TensorImpl() { release_node(grad_fn); }

int64_t shape_numel(const Shape& shape) {
  AG_CHECK(shape.size() <= static_cast<size_t>(kMaxDims), "shape ", shape_to_string(shape), " has ", shape.size(),
           " dimensions, more than the ", kMaxDims, " a tensor may have; hint: merge dimensions with reshape");
  bool empty = false;
  for (int64_t d : shape) {
    AG_CHECK(d >= 0, "shape ", shape_to_string(shape), " has a negative dimension");
    empty = empty || d == 0;
  }
  if (empty) return 0;  // whatever the other dimensions are
  int64_t n = 1;
  for (int64_t d : shape) {
    // Bound by 2^63 / 8 so that the byte count of any dtype fits in an int64 as well.
    AG_CHECK(n <= std::numeric_limits<int64_t>::max() / 8 / d, "shape ", shape_to_string(shape),
             " has too many elements to address");
    n *= d;
  }
  return n;
}

std::string shape_to_string(const Shape& shape) {
  std::ostringstream out;
  out << '[';
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << ']';
  return out.str();
}

namespace {

TensorImpl& checked(const std::shared_ptr<TensorImpl>& impl) {
  AG_CHECK(impl != nullptr, "this Tensor is undefined (default-constructed); hint: create it with ",
           "from_vector/zeros/randn or check defined() first");
  return *impl;
}

template <typename Source>
Tensor tensor_from_values(const std::vector<Source>& values, const Shape& shape, DType dtype, Device device) {
  const int64_t n = shape_numel(shape);
  AG_CHECK(static_cast<int64_t>(values.size()) == n, "from_vector: ", values.size(), " values cannot fill shape ",
           shape_to_string(shape), " (", n, " elements)");
  // Build on the host in the source type, then one copy_ converts and moves it.
  const DType source_dtype = kDTypeOf<Source>;
  Tensor host = Tensor::empty(shape, source_dtype, Device::kCPU);
  std::copy(values.begin(), values.end(), host.data<Source>());
  if (dtype == source_dtype && device == Device::kCPU) return host;
  Tensor out = Tensor::empty(shape, dtype, device);
  copy_(out, host);
  return out;
}

}  // namespace

Tensor Tensor::from_vector(const std::vector<float>& values, const Shape& shape, DType dtype, Device device) {
  return tensor_from_values(values, shape, dtype, device);
}

Tensor Tensor::from_vector(const std::vector<double>& values, const Shape& shape, DType dtype, Device device) {
  return tensor_from_values(values, shape, dtype, device);
}

Tensor Tensor::from_vector(const std::vector<int64_t>& values, const Shape& shape, DType dtype, Device device) {
  return tensor_from_values(values, shape, dtype, device);
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  auto impl = std::make_shared<TensorImpl>();
  impl->numel = shape_numel(shape);
  impl->shape = shape;
  impl->dtype = dtype;
  impl->storage = std::make_shared<Storage>(static_cast<size_t>(impl->numel) * element_size(dtype), device);
  return Tensor(std::move(impl));
}

const Shape& Tensor::shape() const { return checked(impl_).shape; }
int64_t Tensor::numel() const { return checked(impl_).numel; }
DType Tensor::dtype() const { return checked(impl_).dtype; }
Device Tensor::device() const { return checked(impl_).storage->device; }

int64_t Tensor::size(int64_t d) const {
  const int64_t rank = dim();
  AG_CHECK(d >= -rank && d < rank, "size(", d, ") is out of range for ", to_string());
  return shape()[static_cast<size_t>(d < 0 ? d + rank : d)];
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  Tensor host = *this;
  if (dtype() != kDTypeOf<T> || device() != Device::kCPU) {
    host = Tensor::empty(shape(), kDTypeOf<T>, Device::kCPU);
    copy_(host, *this);
  }
  try {
    return std::vector<T>(host.data<T>(), host.data<T>() + numel());
  } catch (const std::bad_alloc&) {  // the host copy, sized by the tensor
    AG_FAIL("to_vector: out of host memory for the ", numel(), " values of ", to_string());
  }
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;

std::vector<double> Tensor::to_double_vector() const { return to_vector<double>(); }

template <typename T>
T Tensor::item() const {
  AG_CHECK(numel() == 1, "item() needs a one-element tensor, got ", to_string(),
           "; hint: reduce with ops::sum or ops::mean first");
  return to_vector<T>()[0];
}
template float Tensor::item<float>() const;
template double Tensor::item<double>() const;
template int64_t Tensor::item<int64_t>() const;

std::string Tensor::to_string() const {
  if (!impl_) return "Tensor(undefined)";
  std::ostringstream out;
  out << "Tensor" << shape_to_string(impl_->shape) << ' ' << impl_->dtype << ' ' << impl_->storage->device;
  return out.str();
}

void Tensor::set_requires_grad(bool requires_grad) {
  TensorImpl& impl = checked(impl_);
  AG_CHECK(impl.grad_fn == nullptr || requires_grad, "set_requires_grad(false) on ", to_string(),
           " which an op produced; hint: use detach() to get a tensor without history");
  AG_CHECK(!requires_grad || is_floating(impl.dtype), "set_requires_grad(true) on ", to_string(),
           ": only floating-point tensors can require gradients; hint: labels and token ids stay int64, ",
           "cast with .to(DType::kFloat32) if you need a gradient");
  impl.requires_grad = requires_grad;
}

bool Tensor::requires_grad() const { return checked(impl_).requires_grad; }
bool Tensor::is_leaf() const { return checked(impl_).grad_fn == nullptr; }
Tensor Tensor::grad() const { return checked(impl_).grad; }
const std::shared_ptr<Node>& Tensor::grad_fn() const { return checked(impl_).grad_fn; }

void Tensor::set_grad(const Tensor& grad) {
  TensorImpl& impl = checked(impl_);
  AG_CHECK(!grad.defined() || (grad.shape() == impl.shape && grad.dtype() == impl.dtype &&
                               grad.device() == impl.storage->device),
           "set_grad: gradient ", grad.to_string(), " does not match ", to_string());
  impl.grad = grad;
}

uint64_t Tensor::register_post_accumulate_grad_hook(PostAccumulateGradHook hook) {
  TensorImpl& impl = checked(impl_);
  AG_CHECK(impl.requires_grad && !impl.grad_fn, "register_post_accumulate_grad_hook: ", to_string(),
           " is not a leaf that requires grad; hint: only leaves accumulate gradients (call set_requires_grad(true) ",
           "on a tensor no recorded op produced)");
  AG_CHECK(hook, "register_post_accumulate_grad_hook: the hook is empty");
  if (!impl.post_accumulate_grad_hooks) impl.post_accumulate_grad_hooks = std::make_shared<PostAccumulateGradHooks>();
  PostAccumulateGradHooks& hooks = *impl.post_accumulate_grad_hooks;
  const uint64_t id = hooks.next_id++;
  hooks.hooks.emplace_back(id, std::move(hook));
  return id;
}

void Tensor::remove_post_accumulate_grad_hook(uint64_t id) {
  TensorImpl& impl = checked(impl_);
  auto& hooks = impl.post_accumulate_grad_hooks;
  AG_CHECK(hooks, "remove_post_accumulate_grad_hook: ", to_string(), " has no hooks (id ", id, ")");
  auto& list = hooks->hooks;
  const auto found = std::find_if(list.begin(), list.end(), [id](const auto& entry) { return entry.first == id; });
  AG_CHECK(found != list.end(), "remove_post_accumulate_grad_hook: ", to_string(), " has no hook with id ", id);
  list.erase(found);
  if (list.empty()) hooks.reset();  // the engine skips leaves without hooks at no cost
}

Tensor Tensor::detach() const {
  const TensorImpl& src = checked(impl_);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = src.storage;
  impl->shape = src.shape;
  impl->numel = src.numel;
  impl->dtype = src.dtype;
  return Tensor(std::move(impl));
}

void Tensor::backward(const Tensor& grad, RetainGraph retain) const { run_backward(*this, grad, retain); }

Tensor Tensor::master() const { return checked(impl_).master; }

Tensor Tensor::step_grad() const {
  const Tensor& m = checked(impl_).master;
  return m.defined() && m.grad().defined() ? m.grad() : grad();
}

void Tensor::set_master(const Tensor& master) {
  TensorImpl& impl = checked(impl_);
  AG_CHECK(!master.defined() || (master.dtype() == DType::kFloat32 && master.shape() == impl.shape),
           "set_master: a master copy must be float32 with the parameter's shape, got ", master.to_string(),
           " for ", to_string());
  impl.master = master;
}

void Tensor::set_data(const Tensor& other) {
  TensorImpl& impl = checked(impl_);
  const TensorImpl& src = checked(other.impl_);
  AG_CHECK(impl.grad_fn == nullptr, "set_data is for leaves; ", to_string(), " was produced by an op");
  impl.storage = src.storage;
  impl.shape = src.shape;
  impl.numel = src.numel;
  impl.dtype = src.dtype;
  impl.grad = Tensor();
  impl.master = Tensor();
}

void* Tensor::data_ptr() { return checked(impl_).storage->data; }
const void* Tensor::data_ptr() const { return checked(impl_).storage->data; }
uint64_t Tensor::version() const { return checked(impl_).storage->version; }
void Tensor::bump_version() { ++checked(impl_).storage->version; }

Tensor alias_elements(const Tensor& base, int64_t offset, const Shape& shape) {
  AG_CHECK(base.defined(), "alias_elements: the base tensor is undefined; hint: alias the elements of an allocated tensor");
  const TensorImpl& b = *base.impl_ptr();
  auto impl = std::make_shared<TensorImpl>();
  impl->numel = shape_numel(shape);
  impl->shape = shape;
  impl->dtype = b.dtype;
  AG_CHECK(offset >= 0 && offset + impl->numel <= b.numel, "alias_elements: elements [", offset, ", ",
           offset + impl->numel, ") of ", base.to_string(), " are out of range");
  const size_t bytes = element_size(b.dtype);
  impl->storage = std::make_shared<Storage>(b.storage, static_cast<size_t>(offset) * bytes,
                                            static_cast<size_t>(impl->numel) * bytes);
  return Tensor(std::move(impl));
}

bool is_alias_at(const Tensor& t, const Tensor& base, int64_t offset) {
  return t.defined() && base.defined() && t.dtype() == base.dtype() && t.device() == base.device() &&
         offset >= 0 && offset + t.numel() <= base.numel() &&
         t.data_ptr() == static_cast<const char*>(base.data_ptr()) + static_cast<size_t>(offset) * element_size(t.dtype());
}

const Storage& allocation_of(const Tensor& t) {
  AG_CHECK(t.defined(), "allocation_of: the tensor is undefined");
  const Storage& s = *t.impl_ptr()->storage;
  return s.base ? *s.base : s;
}

Tensor zeros(const Shape& shape, DType dtype, Device device) { return full(shape, 0.0, dtype, device); }
Tensor ones(const Shape& shape, DType dtype, Device device) { return full(shape, 1.0, dtype, device); }

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor out = Tensor::empty(shape, dtype, device);
  fill_(out, value);
  return out;
}

namespace {
// Samples are drawn in double on the host (so a seed gives the same values for every dtype
// and device), then converted once. The draw buffer is a tensor, so an impossible size is the
// allocator's clear Error rather than a std::bad_alloc from a host vector.
template <typename Sample>
Tensor sampled(const Shape& shape, DType dtype, Device device, Sample sample) {
  Tensor values = Tensor::empty(shape, DType::kFloat64, Device::kCPU);
  double* v = values.data<double>();
  for (int64_t i = 0; i < values.numel(); ++i) v[i] = sample();
  if (dtype == DType::kFloat64 && device == Device::kCPU) return values;
  Tensor out = Tensor::empty(shape, dtype, device);
  copy_(out, values);
  return out;
}
}  // namespace

Tensor randn(const Shape& shape, DType dtype, Device device) {
  return sampled(shape, dtype, device, [] { return random::next_normal(); });
}

Tensor uniform(const Shape& shape, double low, double high, DType dtype, Device device) {
  AG_CHECK(std::isfinite(low) && std::isfinite(high) && low <= high,
           "uniform: the bounds must be finite with low <= high, got low ", low, ", high ", high);
  return sampled(shape, dtype, device, [&] { return low + (high - low) * random::next_uniform(); });
}

Tensor rand(const Shape& shape, DType dtype, Device device) { return uniform(shape, 0.0, 1.0, dtype, device); }

}  // namespace ampgrad
