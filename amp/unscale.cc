// The scaler's pass over a list of gradients: the checks, then each device's tensors in one call
// of the unscale kernel family (unscale_kernels.h), so CUDA gradients share one launch and one sync.
#include "amp/unscale.h"

#include <array>

#include "amp/unscale_kernels.h"
#include "framework/error.h"

namespace ampgrad::amp {

namespace {

// Every pass over a list checks all outputs before it writes any.
void check_output(const Tensor& grad, const Tensor& out) {
  AG_CHECK(out.dtype() == DType::kFloat32 && out.numel() == grad.numel(), "unscale: output ", out.to_string(),
           " must be float32 with ", grad.numel(), " elements");
  AG_CHECK(grad.device() == out.device(), "unscale: gradient ", grad.to_string(), " and output ", out.to_string(),
           " are on different devices");
}

// One device's share of a list: the tensors and where they sit in the list.
struct DeviceShare {
  std::vector<size_t> positions;
  std::vector<Tensor> grads;
  std::vector<Tensor> outs;
};

std::array<DeviceShare, kNumDevices> split_by_device(const std::vector<Tensor>& grads, std::vector<Tensor>* outs) {
  std::array<DeviceShare, kNumDevices> shares;
  for (size_t k = 0; k < grads.size(); ++k) {
    DeviceShare& share = shares[device_index(grads[k].device())];
    share.positions.push_back(k);
    share.grads.push_back(grads[k]);
    if (outs != nullptr) share.outs.push_back((*outs)[k]);
  }
  return shares;
}

bool measure_list(const std::vector<Tensor>& grads, double inv_scale, std::vector<Tensor>* outs,
                  const FormatTable& formats, std::vector<GradCounts>& counts) {
  AG_CHECK(outs == nullptr || outs->size() == grads.size(), "unscale: ", grads.size(), " gradients but ",
           outs->size(), " outputs");
  AG_CHECK(formats.count >= 0 && formats.count <= kMaxFormats, "gradient statistics: ", formats.count,
           " formats (at most ", kMaxFormats, ")");
  if (outs != nullptr) {
    for (size_t k = 0; k < grads.size(); ++k) check_output(grads[k], (*outs)[k]);
  }
  counts.assign(grads.size(), GradCounts{});
  bool found_inf = false;
  std::array<DeviceShare, kNumDevices> shares = split_by_device(grads, outs);
  for (Device device : kAllDevices) {
    DeviceShare& share = shares[device_index(device)];
    if (share.grads.empty()) continue;
    std::vector<GradCounts> share_counts(share.grads.size());
    found_inf |= kernels::unscale_check_and_measure(device, share.grads, inv_scale,
                                                    outs != nullptr ? &share.outs : nullptr, formats,
                                                    share_counts.data());
    for (size_t i = 0; i < share.positions.size(); ++i) counts[share.positions[i]] = share_counts[i];
  }
  return found_inf;
}

}  // namespace

bool unscale_and_check(const Tensor& grad, double inv_scale, Tensor& out) {
  std::vector<Tensor> outs{out};
  return unscale_and_check_all({grad}, inv_scale, outs);
}

bool unscale_and_check_all(const std::vector<Tensor>& grads, double inv_scale, std::vector<Tensor>& outs) {
  AG_CHECK(grads.size() == outs.size(), "unscale: ", grads.size(), " gradients but ", outs.size(), " outputs");
  for (size_t k = 0; k < grads.size(); ++k) check_output(grads[k], outs[k]);
  bool found_inf = false;
  std::array<DeviceShare, kNumDevices> shares = split_by_device(grads, &outs);
  for (Device device : kAllDevices) {
    DeviceShare& share = shares[device_index(device)];
    if (!share.grads.empty()) found_inf |= kernels::unscale_and_check(device, share.grads, inv_scale, share.outs);
  }
  return found_inf;
}

bool unscale_check_and_measure_all(const std::vector<Tensor>& grads, double inv_scale, std::vector<Tensor>& outs,
                                   const FormatTable& formats, std::vector<GradCounts>& counts) {
  return measure_list(grads, inv_scale, &outs, formats, counts);
}

void measure_all(const std::vector<Tensor>& grads, double inv_scale, const FormatTable& formats,
                 std::vector<GradCounts>& counts) {
  measure_list(grads, inv_scale, nullptr, formats, counts);
}

bool any_nonfinite(const Tensor& values) {
  if (!values.defined() || !is_compute(values.dtype()) || values.numel() == 0) return false;
  std::vector<GradCounts> counts;
  measure_all({values}, 1.0, FormatTable{}, counts);
  return counts[0].infs + counts[0].nans > 0;
}

}  // namespace ampgrad::amp
