// Tensor::to: dtype casts and device moves as recorded ops, so gradients flow back converted
// to the source dtype and device (the backward of a cast is the opposite cast).
#include "framework/copy.h"
#include "framework/dispatch.h"
#include "framework/error.h"

namespace ampgrad {

namespace {

// The result in another dtype or on another device (or both); the backward converts the gradient
// back to the source's dtype and device.
struct Convert {
  static constexpr OpInfo kInfo{"cast", CastPolicy::kNone, kAnyInputMayBeInteger};
  DType dtype;
  Device device;
  DType source_dtype = DType::kFloat32;
  Device source_device = Device::kCPU;

  void check(const Tensor&) const {}

  Tensor forward(SavedTensors&, const Tensor& x) {
    source_dtype = x.dtype();
    source_device = x.device();
    Tensor out = Tensor::empty(x.shape(), dtype, device);
    copy_(out, x);
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

Tensor Tensor::to(Device device) const {
  if (this->device() == device) return *this;
  return dispatch(Convert{.dtype = dtype(), .device = device}, *this);
}

}  // namespace ampgrad
