// Embedding on the CPU: rows copied by id; the gradient added into a compute-type buffer in id
// order (columns split over the pool, so each element keeps one order), then rounded once.
#include <algorithm>
#include <cstring>
#include <vector>

#include "framework/error.h"
#include "framework/parallel.h"
#include "ops/embedding/embedding_kernels.h"

namespace ampgrad::kernels::cpu {

void embedding(const Tensor& ids, const Tensor& weight, Tensor& out) {
  const int64_t n = ids.numel(), vocab = weight.size(0), dim = weight.size(1);
  const int64_t* id = ids.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    AG_CHECK(id[i] >= 0 && id[i] < vocab, "embedding: id ", id[i], " at position ", i, " is outside [0, ", vocab,
             ") for weight ", weight.to_string());
  }
  const size_t row_bytes = static_cast<size_t>(dim) * element_size(weight.dtype());
  const char* w = static_cast<const char*>(weight.data_ptr());
  char* o = static_cast<char*>(out.data_ptr());
  parallel_range(n, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(dim, 1)), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) std::memcpy(o + i * row_bytes, w + id[i] * row_bytes, row_bytes);
  });
  out.bump_version();
}

void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dweight) {
  const int64_t n = ids.numel(), vocab = dweight.size(0), dim = dweight.size(1);
  const int64_t* id = ids.data<int64_t>();
  visit_floating_dtype(dweight.dtype(), [&](auto t) {
    using T = decltype(t);
    using C = ComputeType<T>;
    const T* g = dout.data<T>();
    T* dw = dweight.data<T>();
    // Columns are independent: each piece of columns sums every id's rows in id order.
    parallel_range(dim, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(n, 1)), [&](int64_t lo, int64_t hi) {
      const int64_t width = hi - lo;
      std::vector<C> acc(static_cast<size_t>(vocab * width), C(0));
      for (int64_t i = 0; i < n; ++i) {
        C* row = acc.data() + id[i] * width;
        const T* src = g + i * dim + lo;
        for (int64_t j = 0; j < width; ++j) row[j] += load(src[j]);
      }
      for (int64_t v = 0; v < vocab; ++v) {
        for (int64_t j = 0; j < width; ++j) dw[v * dim + lo + j] = store<T>(acc[static_cast<size_t>(v * width + j)]);
      }
    });
  });
  dweight.bump_version();
}

}  // namespace ampgrad::kernels::cpu
