// Tensor::to: dtype casts and device moves as recorded ops, so gradients flow back converted
// to the source dtype and device (the backward of a cast is the opposite cast); pinned host copies.
#include <cstring>

#include "framework/allocator.h"
#include "framework/copy.h"
#include "framework/dispatch.h"
#include "framework/error.h"
#include "framework/tensor_impl.h"

namespace ampgrad {

namespace {

// The result in another dtype or on another device (or both); the backward converts the gradient
// back to the source's dtype and device.
struct Convert {
  static constexpr OpInfo kInfo{"cast", CastPolicy::kNone, kAnyInputMayBeInteger};
  DType dtype;
  Device device;
  NonBlocking non_blocking = NonBlocking::kNo;
  DType source_dtype = DType::kFloat32;
  Device source_device = Device::kCPU;

  void check(const Tensor&) const {}

  Tensor forward(SavedTensors&, const Tensor& x) {
    source_dtype = x.dtype();
    source_device = x.device();
    Tensor out = Tensor::empty(x.shape(), dtype, device);
    copy_(out, x, non_blocking);
    return out;
  }

  std::vector<Tensor> backward(const SavedTensors&, const Tensor& dy) const {
    return {dy.to(source_dtype).to(source_device)};
  }
};

}  // namespace

Tensor Tensor::to(DType dtype) const {
  if (this->dtype() == dtype) return *this;
  return dispatch(Convert{.dtype = dtype, .device = device()}, *this);
}

Tensor Tensor::to(Device device) const { return to(device, NonBlocking::kNo); }

Tensor Tensor::to(Device device, NonBlocking non_blocking) const {
  if (this->device() == device) return *this;
  return dispatch(Convert{.dtype = dtype(), .device = device, .non_blocking = non_blocking}, *this);
}

bool Tensor::is_pinned() const {
  AG_CHECK(defined(), "is_pinned: this Tensor is undefined");
  return impl()->storage->pinned;
}

Tensor Tensor::pin_memory() const {
  AG_CHECK(defined(), "pin_memory: this Tensor is undefined");
  AG_CHECK(device() == Device::kCPU, "pin_memory: ", to_string(), " is not on the CPU; hint: only host tensors ",
           "can be pinned (pin a batch before moving it to the GPU)");
  if (is_pinned()) return *this;
  require_backend(Device::kCUDA, "pin_memory");
  AG_CHECK(cuda_is_available(), "pin_memory: page-locked memory needs a CUDA device, and there is none: ",
           cuda::unavailable_reason(), "; hint: keep the batch in ordinary memory when cuda_is_available() is false");
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape();
  impl->numel = numel();
  impl->dtype = dtype();
  const size_t nbytes = static_cast<size_t>(numel()) * element_size(dtype());
  impl->storage = std::make_shared<Storage>(nbytes, pinned_host_allocator());
  if (nbytes > 0) std::memcpy(impl->storage->data, data_ptr(), nbytes);
  return Tensor(std::move(impl));
}

}  // namespace ampgrad
