// Strided copies on the CPU: row by row, a memcpy where both rows are contiguous.
#include <algorithm>
#include <cstring>

#include "framework/parallel.h"
#include "ops/shape/shape_kernels.h"

namespace ampgrad::kernels::cpu {

void strided_copy(const Tensor& src, Tensor& dst, const StridedPlan<2>& plan) {
  const int64_t rows = plan_rows(plan);
  if (rows == 0) return;
  const int64_t inner = plan.numel / rows;
  const int64_t sd = plan.rank > 0 ? plan.strides[0][plan.rank - 1] : 1;
  const int64_t ss = plan.rank > 0 ? plan.strides[1][plan.rank - 1] : 1;
  visit_dtype(dst.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* s = src.data<T>();
    T* d = dst.data<T>();
    const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(inner, 1));
    parallel_range(rows, grain, [&](int64_t lo, int64_t hi) {
      for_each_row(plan, lo, hi, [&](const int64_t* offsets, int64_t n) {
        T* out = d + offsets[0];
        const T* in = s + offsets[1];
        if (sd == 1 && ss == 1) {
          std::memcpy(out, in, static_cast<size_t>(n) * sizeof(T));
        } else {
          for (int64_t j = 0; j < n; ++j) out[j * sd] = in[j * ss];
        }
      });
    });
  });
  dst.bump_version();
}

}  // namespace ampgrad::kernels::cpu
