// Which gradients travel together: PyTorch DDP's bucket assignment, a pure function of the
// parameters' sizes, dtypes and devices (so every rank computes the same buckets).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "framework/device.h"
#include "framework/dtype.h"

namespace ampgrad::distributed {

/// One parameter's gradient as the bucketing sees it.
struct BucketParam {
  int64_t bytes;  ///< its gradient's size in bytes
  DType dtype;  ///< its gradient's dtype (a bucket holds one dtype)
  Device device;  ///< its device (a bucket holds one device)
};

/// Parameters are taken in reverse order (backward produces the last layer's gradients first);
/// each (dtype, device) fills its own open bucket, which closes once it holds at least its cap:
/// `first_cap_bytes` for that kind's first bucket (small, so communication starts early), then
/// `cap_bytes`. Returns the parameter indices of each bucket, buckets in the order they were
/// opened, indices within one in reverse parameter order.
std::vector<std::vector<size_t>> assign_buckets(const std::vector<BucketParam>& params, int64_t first_cap_bytes,
                                                int64_t cap_bytes);

}  // namespace ampgrad::distributed
