// Tensor::to: dtype casts and device moves as recorded ops, so gradients flow back converted
// to the source dtype and device (the backward of a cast is the opposite cast).
#include "framework/copy.h"
#include "framework/dispatch.h"
#include "framework/error.h"

namespace ampgrad {

namespace {

struct Cast {
  static constexpr OpInfo kInfo{"cast", CastPolicy::kNone};
  DType dtype;
  DType source_dtype = DType::kFloat32;

  void check(const Tensor&) const {}

  Tensor forward(SavedTensors&, const Tensor& x) {
    source_dtype = x.dtype();
    Tensor out = Tensor::empty(x.shape(), dtype, x.device());
    copy_(out, x);
    return out;
  }

  std::vector<Tensor> backward(const SavedTensors&, const Tensor& dy) const { return {dy.to(source_dtype)}; }
};

struct ToDevice {
  static constexpr OpInfo kInfo{"to_device", CastPolicy::kNone};
  Device device;
  Device source_device = Device::kCPU;

  void check(const Tensor&) const {}

  Tensor forward(SavedTensors&, const Tensor& x) {
    source_device = x.device();
    Tensor out = Tensor::empty(x.shape(), x.dtype(), device);
    copy_(out, x);
    return out;
  }

  std::vector<Tensor> backward(const SavedTensors&, const Tensor& dy) const { return {dy.to(source_device)}; }
};

}  // namespace

Tensor Tensor::to(DType dtype) const {
  if (this->dtype() == dtype) return *this;
  return dispatch(Cast{.dtype = dtype}, *this);
}

Tensor Tensor::to(Device device) const {
  if (this->device() == device) return *this;
  return dispatch(ToDevice{.device = device}, *this);
}

}  // namespace ampgrad
