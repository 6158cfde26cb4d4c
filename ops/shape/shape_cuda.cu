// Strided copies on CUDA: one contiguous block is one cudaMemcpyAsync; anything else is one
// thread per element walking the plan.
#include "framework/cuda_check.h"
#include "framework/cuda_helpers.h"
#include "ops/shape/shape_kernels.h"

namespace ampgrad::kernels::cuda {

namespace {

using namespace ::ampgrad::cuda;  // the device helpers of framework/cuda_helpers.h

// plan walks (dst, src): dst[off0] = src[off1].
template <typename T>
__global__ void strided_copy_kernel(const T* src, T* dst, StridedPlan<2> plan) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < plan.numel; i += int64_t{gridDim.x} * blockDim.x) {
    int64_t off[2];
    plan_offsets(plan, i, off);
    dst[off[0]] = src[off[1]];
  }
}

}  // namespace

void strided_copy(const Tensor& src, Tensor& dst, const StridedPlan<2>& plan) {
  if (plan.numel == 0) return;
  const size_t elem = element_size(dst.dtype());
  const bool flat = plan.rank <= 1 && (plan.rank == 0 || (plan.strides[0][0] == 1 && plan.strides[1][0] == 1));
  if (flat) {
    AG_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst.data_ptr()) + plan.offset[0] * elem,
                                  static_cast<const char*>(src.data_ptr()) + plan.offset[1] * elem,
                                  static_cast<size_t>(plan.numel) * elem, cudaMemcpyDeviceToDevice, cudaStreamLegacy));
  } else {
    visit_dtype(dst.dtype(), [&](auto t) {
      using T = DeviceType<decltype(t)>;
      strided_copy_kernel<T><<<blocks_for(plan.numel), kThreads>>>(static_cast<const T*>(src.data_ptr()),
                                                                  static_cast<T*>(dst.data_ptr()), plan);
      AG_CUDA_CHECK_LAUNCH("strided_copy_kernel");
    });
  }
  dst.bump_version();
}

}  // namespace ampgrad::kernels::cuda
