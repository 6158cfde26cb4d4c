// The helpers every test shares: dtype-aware closeness checks, expected-error checks, reproducible
// random values, byte snapshots, and a finite-difference gradient-check harness (every comparison
// in float64). The float64 reference math of the ops has its one home in reference.h.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <unistd.h>

#include "framework/allocator.h"
#include "framework/autograd.h"
#include "framework/device.h"
#include "framework/dtype.h"
#include "framework/error.h"
#include "framework/parallel.h"
#include "framework/random.h"
#include "framework/tensor.h"
#include "ops/ops.h"

namespace ampgrad::test {

/// The name of a (row, dtype) test parameter, "<row name>_<dtype>", for INSTANTIATE_TEST_SUITE_P
/// over a table of rows (anything with a `name`) and dtypes.
inline constexpr auto row_and_dtype_name = [](const auto& info) {
  return std::get<0>(info.param).name + "_" + std::string(dtype_name(std::get<1>(info.param)));
};

// ---- Tolerances ------------------------------------------------------------------------------

/// The gap between 1 and the next representable number: 2^-10 (float16), 2^-23 (float32),
/// 2^-52 (float64), from the dtype table. A correctly rounded result is within eps/2 of the exact
/// value, relatively.
inline double eps(DType dtype) { return dtype_info(dtype).eps; }

/// How a result was computed, for its tolerance: `k` terms accumulated into each element
/// (independent rounding errors of a length-k sum grow like sqrt(k)), each term of size about
/// `magnitude` (the error of x + y scales with |x| + |y|, not |x + y|, so cancellation near zero
/// needs an absolute term).
struct Tol {
  int64_t k = 1;
  double magnitude = 1.0;
};

/// Passes when every |actual - expected| <= atol + rtol * |expected|, with
///   rtol = kSlack * eps(dtype) * sqrt(k),   atol = rtol * magnitude,   kSlack = 2
/// (kSlack covers a rounded input or two on top of the eps/2 of the final rounding).
inline ::testing::AssertionResult all_close(const std::vector<double>& actual, const std::vector<double>& expected,
                                            DType dtype, Tol tol = {}) {
  constexpr double kSlack = 2.0;
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure() << actual.size() << " values, expected " << expected.size();
  }
  const double rtol = kSlack * eps(dtype) * std::sqrt(static_cast<double>(tol.k));
  const double atol = rtol * tol.magnitude;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const bool ok = std::abs(actual[i] - expected[i]) <= atol + rtol * std::abs(expected[i]);
    if (!ok && bad++ == 0) first = i;  // NaN fails the comparison too
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << actual.size() << " values differ (" << dtype_name(dtype)
                                       << ", k " << tol.k << "); first at [" << first << "]: " << actual[first]
                                       << " vs expected " << expected[first] << ", allowed "
                                       << atol + rtol * std::abs(expected[first]);
}

inline ::testing::AssertionResult all_close(const Tensor& actual, const std::vector<double>& expected, DType dtype,
                                            Tol tol = {}) {
  return all_close(actual.to_double_vector(), expected, dtype, tol);
}

/// Expects every |got - want| <= tol * max |want|: an error relative to the largest value, as FP32
/// sums of terms of both signs make it. Reports the first three misses, named by `what`.
inline void expect_close_to_largest(const std::vector<float>& got, const std::vector<double>& want, double tol,
                                    const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0.0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  int wrong = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::fabs(got[i] - want[i]) <= tol * scale) && ++wrong <= 3) {
      ADD_FAILURE() << what << "[" << i << "]: " << got[i] << " vs " << want[i];
    }
  }
  EXPECT_EQ(wrong, 0) << what;
}

/// EXPECT_CLOSE(actual, expected, dtype[, Tol{k, magnitude}]): see all_close.
#define EXPECT_CLOSE(...) EXPECT_TRUE(::ampgrad::test::all_close(__VA_ARGS__))

// ---- Errors ----------------------------------------------------------------------------------

/// Passes when fn() throws ampgrad::Error whose message contains every needle.
template <typename Fn>
::testing::AssertionResult throws_error(Fn&& fn, std::initializer_list<std::string_view> needles) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string message = e.what();
    for (std::string_view needle : needles) {
      if (message.find(needle) == std::string::npos) {
        return ::testing::AssertionFailure() << "message \"" << message << "\" lacks \"" << needle << "\"";
      }
    }
    return ::testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a non-ampgrad exception: " << e.what();
  }
  return ::testing::AssertionFailure() << "nothing was thrown";
}

/// EXPECT_ERROR(fn, "needle", ...): fn() throws an ampgrad::Error whose message has every needle.
#define EXPECT_ERROR(fn, ...) EXPECT_TRUE(::ampgrad::test::throws_error(fn, {__VA_ARGS__}))

// ---- Values ----------------------------------------------------------------------------------

inline bool all_finite(const Tensor& t) {
  for (double v : t.to_double_vector()) {
    if (!std::isfinite(v)) return false;
  }
  return true;
}

/// max_i |a_i - b_i| over two equally sized tensors of any dtype.
inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_double_vector(), y = b.to_double_vector();
  EXPECT_EQ(x.size(), y.size());
  double worst = 0.0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
  return worst;
}

inline double max_abs(const Tensor& t) {
  double worst = 0.0;
  for (double v : t.to_double_vector()) worst = std::max(worst, std::abs(v));
  return worst;
}

/// Bit for bit, for floating dtypes: the same dtype and shape, and values whose double images
/// (exact for every floating dtype) have the same bits, so -0 differs from +0; NaNs of either sign
/// and payload count as equal.
inline bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const std::vector<double> x = a.to_double_vector(), y = b.to_double_vector();
  if (x.size() != y.size()) return false;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i]) && std::isnan(y[i])) continue;
    if (std::memcmp(&x[i], &y[i], sizeof(double)) != 0) return false;
  }
  return true;
}

/// The (width, height) a PNG file's IHDR chunk states, or {0, 0} if the file is not a PNG.
inline std::pair<uint32_t, uint32_t> png_size(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string head(24, '\0');
  in.read(head.data(), 24);
  if (!in || head.compare(0, 8, "\x89PNG\r\n\x1a\n") != 0 || head.compare(12, 4, "IHDR") != 0) return {0, 0};
  const auto be32 = [&](size_t at) {
    uint32_t v = 0;
    for (size_t i = 0; i < 4; ++i) v = v << 8 | static_cast<unsigned char>(head[at + i]);
    return v;
  };
  return {be32(16), be32(20)};
}

inline std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor host = t.device() == Device::kCPU ? t : t.to(Device::kCPU);
  std::vector<uint8_t> out(static_cast<size_t>(host.numel()) * element_size(host.dtype()));
  if (!out.empty()) std::memcpy(out.data(), host.data_ptr(), out.size());
  return out;
}

// ---- Files ---------------------------------------------------------------------------------------

/// A folder of the test's own under the test temporary directory (named after `prefix` and the
/// process, so parallel test binaries do not meet), created empty and removed with everything in
/// it when this goes out of scope.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& prefix)
      : dir_(std::filesystem::path(::testing::TempDir()) / (prefix + "_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& dir() const { return dir_; }
  /// The path of a file in the folder.
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

 private:
  std::filesystem::path dir_;
};

// ---- Random values ---------------------------------------------------------------------------

/// Deterministic values uniform in [lo, hi) from a local engine (leaves the global generator alone).
inline std::vector<double> random_values(size_t n, double lo, double hi, uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::vector<double> v(n);
  for (double& x : v) x = lo + (hi - lo) * static_cast<double>(engine() >> 11) * 0x1p-53;
  return v;
}

// ---- Gradient checks -------------------------------------------------------------------------

using TensorFn = std::function<Tensor(const std::vector<Tensor>&)>;

/// The random cotangent c for an output: multiples of 1/8 in [-2, 2], so that it is exact in every
/// dtype and the gradient of L = sum(out * c) with respect to out is exactly c.
inline Tensor cotangent_like(const Tensor& out) {
  constexpr uint64_t kSeed = 7;
  std::vector<double> c = random_values(static_cast<size_t>(out.numel()), -2.0, 2.0, kSeed);
  for (double& v : c) v = std::round(v * 8.0) / 8.0;
  return Tensor::from_vector(c, out.shape(), out.dtype(), out.device());
}

struct Evaluated {
  std::vector<double> out;
  std::vector<std::vector<double>> grads;  // one per input
};

/// fn's output and the gradients of L = sum(fn(x) * c), with the inputs converted to `dtype`
/// leaves on `device`; everything returned as doubles. Also checks each gradient's shape, dtype
/// and device.
inline Evaluated evaluate(const TensorFn& fn, const std::vector<Tensor>& inputs, DType dtype,
                          Device device = Device::kCPU) {
  std::vector<Tensor> leaves;
  for (const Tensor& t : inputs) {
    leaves.push_back(Tensor::from_vector(t.to_double_vector(), t.shape(), dtype, device));
    leaves.back().set_requires_grad(true);
  }
  const Tensor out = fn(leaves);
  ops::sum(out * cotangent_like(out)).backward();
  Evaluated result{out.to_double_vector(), {}};
  for (const Tensor& leaf : leaves) {
    EXPECT_TRUE(leaf.grad().defined());
    if (!leaf.grad().defined()) return result;
    EXPECT_EQ(leaf.grad().shape(), leaf.shape());
    EXPECT_EQ(leaf.grad().dtype(), dtype);
    EXPECT_EQ(leaf.grad().device(), device);
    result.grads.push_back(leaf.grad().to_double_vector());
  }
  return result;
}

/// Compares the analytic gradient of L = sum(fn(x) * c) with central differences
/// (L(x + h e_j) - L(x - h e_j)) / 2h, everything in float64. With h = 1e-6 the difference's
/// rounding error is ~eps64 |L| / h ~ 1e-9 and the truncation error (~h^2 times L's third
/// derivative) is zero for ops at most quadratic in each input, so 1e-6 (absolute + relative) is
/// a wide margin that still catches any wrong formula. Keep inputs of piecewise ops (relu)
/// farther than h from their kinks.
inline ::testing::AssertionResult gradcheck(const TensorFn& fn, const std::vector<Tensor>& inputs,
                                            double h = 1e-6, double tol = 1e-6) {
  const Evaluated analytic = evaluate(fn, inputs, DType::kFloat64);
  if (analytic.grads.size() != inputs.size()) return ::testing::AssertionFailure() << "a gradient is missing";
  std::vector<Tensor> x;
  for (const Tensor& t : inputs) x.push_back(Tensor::from_vector(t.to_double_vector(), t.shape(), DType::kFloat64));
  NoGradGuard no_grad;
  const Tensor c = cotangent_like(fn(x));
  auto loss = [&] { return ops::sum(fn(x) * c).to_double_vector()[0]; };
  for (size_t i = 0; i < x.size(); ++i) {
    for (int64_t j = 0; j < x[i].numel(); ++j) {
      double& xj = x[i].data<double>()[j];
      const double saved = xj;
      xj = saved + h;
      const double plus = loss();
      xj = saved - h;
      const double minus = loss();
      xj = saved;
      const double numeric = (plus - minus) / (2 * h);
      const double exact = analytic.grads[i][static_cast<size_t>(j)];
      if (!(std::abs(exact - numeric) <= tol * (1.0 + std::abs(numeric)))) {
        return ::testing::AssertionFailure() << "d/d input " << i << " [" << j << "]: backward gives " << exact
                                             << ", finite differences " << numeric;
      }
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace ampgrad::test
