// Helpers for the data-parallel tests that run as MPI jobs: a fixed regression data set cut into
// per-rank batches, the replica check (every rank's parameters bit for bit), and a guard that
// keeps a single-process reference run from taking part in the ranks' found-inf agreement.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "amp/found_inf_sync.h"
#include "distributed/process_group.h"
#include "framework/random.h"
#include "framework/tensor.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/module.h"

namespace ampgrad::ddp_testing {

inline distributed::ProcessGroup& world() { return distributed::default_group(); }

/// n samples of y = sum_j x_j w_j + 0.5 relu(x_0) + noise, in = 8 features, from `seed`; the same
/// on every rank.
struct Data {
  std::vector<float> x, y;
  int64_t in = 8;
  int64_t rows() const { return static_cast<int64_t>(y.size()); }
  /// Rows [begin, begin + count) as tensors x [count, in] and y [count, 1].
  Tensor batch_x(int64_t begin, int64_t count) const {
    return Tensor::from_vector(std::vector<float>(x.begin() + begin * in, x.begin() + (begin + count) * in),
                               {count, in});
  }
  Tensor batch_y(int64_t begin, int64_t count) const {
    return Tensor::from_vector(std::vector<float>(y.begin() + begin, y.begin() + begin + count), {count, 1});
  }
};

inline Data make_data(int64_t n, uint64_t seed = 7) {
  manual_seed(seed);
  Data d;
  d.x = randn({n, d.in}).to_vector();
  const std::vector<float> w = randn({d.in}).to_vector(), noise = randn({n}).to_vector();
  for (int64_t i = 0; i < n; ++i) {
    double acc = 0.5 * std::max(0.0f, d.x[i * d.in]) + 0.1 * noise[i];
    for (int64_t j = 0; j < d.in; ++j) acc += static_cast<double>(d.x[i * d.in + j]) * w[j];
    d.y.push_back(static_cast<float>(acc));
  }
  return d;
}

/// An 8-32-32-1 MLP initialised from `seed`.
inline nn::Sequential make_mlp(uint64_t seed) {
  manual_seed(seed);
  return nn::Sequential{nn::Linear(8, 32), nn::ReLU(), nn::Linear(32, 32), nn::ReLU(), nn::Linear(32, 1)};
}

/// Every parameter's values, as float64.
inline std::vector<std::vector<double>> snapshot(const nn::Module& model) {
  std::vector<std::vector<double>> out;
  for (const Tensor& p : model.parameters()) out.push_back(p.to_double_vector());
  return out;
}

/// Passes when every rank holds the same bits in every parameter (and master copy, if any).
inline ::testing::AssertionResult replicas_identical(const nn::Module& model) {
  std::string mine;
  for (const auto& [name, p] : model.named_parameters()) {
    for (const Tensor& t : {p, p.master()}) {
      if (!t.defined()) continue;
      mine.append(static_cast<const char*>(t.data_ptr()), static_cast<size_t>(t.numel()) * element_size(t.dtype()));
    }
  }
  const std::vector<std::string> all = world().all_gather_bytes(mine);
  for (size_t r = 1; r < all.size(); ++r) {
    if (all[r] != all[0]) return ::testing::AssertionFailure() << "rank " << r << "'s parameters differ from rank 0's";
  }
  return ::testing::AssertionSuccess();
}

/// The largest |a - b| / (1 + |b|) over all parameters.
inline double max_relative_difference(const std::vector<std::vector<double>>& a,
                                      const std::vector<std::vector<double>>& b) {
  double worst = 0.0;
  for (size_t k = 0; k < a.size(); ++k) {
    for (size_t i = 0; i < a[k].size(); ++i) {
      worst = std::max(worst, std::abs(a[k][i] - b[k][i]) / (1.0 + std::abs(b[k][i])));
    }
  }
  return worst;
}

/// While it lives, GradScalers decide on their own flag alone (for a single-process reference run
/// inside the MPI job); restores the ranks' agreement afterwards.
class LocalFoundInf {
 public:
  LocalFoundInf() : previous_(amp::set_found_inf_sync({})) {}
  ~LocalFoundInf() { amp::set_found_inf_sync(std::move(previous_)); }
  LocalFoundInf(const LocalFoundInf&) = delete;
  LocalFoundInf& operator=(const LocalFoundInf&) = delete;

 private:
  amp::FoundInfSync previous_;
};

}  // namespace ampgrad::ddp_testing
