// The dtype table and the device facts: every row agrees with its C++ storage type, names round
// trip, promotion follows the ranks, and a device without a backend gives the one clear error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "framework/device.h"
#include "framework/dtype.h"
#include "framework/error.h"
#include "test_util.h"

namespace ag = ampgrad;
using ag::DType;
using ag::Device;

namespace {

TEST(DTypeTable, RowsMatchTheirStorageTypes) {
  for (DType dtype : ag::kAllDTypes) {
    SCOPED_TRACE(std::string(ag::dtype_name(dtype)));
    ag::visit_dtype(dtype, [&](auto t) {
      using T = decltype(t);
      EXPECT_EQ(ag::element_size(dtype), sizeof(T));
      EXPECT_EQ(ag::kDTypeOf<T>, dtype);
    });
    EXPECT_EQ(ag::dtype_from_safetensors_name(ag::dtype_info(dtype).safetensors_name), dtype);
    // eps is the gap between 1 and the next value of the storage type.
    const double next = ag::visit_dtype(dtype, [](auto t) {
      using T = decltype(t);
      return static_cast<double>(ag::load(ag::store<T>(static_cast<ag::ComputeType<T>>(1.0 + ag::dtype_info(ag::kDTypeOf<T>).eps))));
    });
    EXPECT_EQ(next, 1.0 + ag::dtype_info(dtype).eps);
  }
  EXPECT_EQ(ag::dtype_from_safetensors_name("Q7"), std::nullopt);
}

// The range columns are the storage type's: max, min_normal and min_subnormal round-trip, the
// next value past max overflows, and below half the smallest subnormal rounds to zero.
TEST(DTypeTable, RangesMatchTheirStorageTypes) {
  for (DType dtype : ag::kFloatingDTypes) {
    SCOPED_TRACE(std::string(ag::dtype_name(dtype)));
    const ag::DTypeInfo& info = ag::dtype_info(dtype);
    const auto round_trip = [&](double x) {
      return ag::visit_dtype(dtype, [x](auto t) {
        using T = decltype(t);
        return static_cast<double>(ag::load(ag::store<T>(static_cast<ag::ComputeType<T>>(x))));
      });
    };
    EXPECT_EQ(round_trip(info.max), info.max);
    EXPECT_TRUE(std::isinf(round_trip(info.max * (1 + 2 * info.eps))));
    EXPECT_EQ(round_trip(info.min_normal), info.min_normal);
    EXPECT_EQ(info.min_subnormal, info.min_normal * info.eps);
    EXPECT_EQ(round_trip(info.min_subnormal), info.min_subnormal);
    EXPECT_EQ(round_trip(info.min_subnormal * 0.25), 0.0);
  }
}

// The 8-bit rows' ranges are their storage types' too; past max e4m3 saturates (PyTorch's cast)
// and e5m2 overflows to inf.
TEST(DTypeTable, Float8RangesMatchTheirStorageTypes) {
  for (DType dtype : ag::kFloat8DTypes) {
    SCOPED_TRACE(std::string(ag::dtype_name(dtype)));
    const ag::DTypeInfo& info = ag::dtype_info(dtype);
    EXPECT_TRUE(ag::is_floating(dtype));
    EXPECT_FALSE(ag::is_compute(dtype));
    EXPECT_FALSE(ag::is_low_precision(dtype));
    const auto round_trip = [&](double x) {
      return ag::visit_dtype(dtype, [x](auto t) {
        using T = decltype(t);
        return static_cast<double>(ag::load(ag::convert<T>(x)));
      });
    };
    EXPECT_EQ(round_trip(info.max), info.max);
    const double past = round_trip(info.max * (1 + 2 * info.eps));
    EXPECT_EQ(past, dtype == DType::kFloat8E4M3 ? info.max : INFINITY);
    EXPECT_EQ(round_trip(info.min_normal), info.min_normal);
    EXPECT_EQ(round_trip(info.min_normal * (1 - info.eps)), info.min_normal * (1 - info.eps));  // a subnormal
    EXPECT_EQ(round_trip(info.min_subnormal), info.min_subnormal);
    EXPECT_EQ(round_trip(info.min_subnormal * 0.25), 0.0);
    EXPECT_EQ(round_trip(1.0 + info.eps), 1.0 + info.eps);
    EXPECT_EQ(round_trip(1.0 + info.eps / 2), 1.0);  // a tie, to even
    EXPECT_EQ(ag::dtype_from_safetensors_name(info.safetensors_name), dtype);
  }
  EXPECT_EQ(ag::dtype_name(DType::kFloat8E4M3), "float8_e4m3fn");
  EXPECT_EQ(ag::dtype_name(DType::kFloat8E5M2), "float8_e5m2");
}

TEST(DTypeTable, NamesAndClasses) {
  EXPECT_EQ(ag::dtype_name(DType::kFloat32), "float32");
  EXPECT_EQ(ag::dtype_name(DType::kFloat16), "float16");
  EXPECT_EQ(ag::dtype_name(DType::kFloat64), "float64");
  EXPECT_EQ(ag::dtype_name(DType::kBFloat16), "bfloat16");
  EXPECT_EQ(ag::dtype_info(DType::kBFloat16).safetensors_name, "BF16");
  EXPECT_TRUE(ag::is_low_precision(DType::kFloat16));
  EXPECT_TRUE(ag::is_low_precision(DType::kBFloat16));
  EXPECT_FALSE(ag::is_low_precision(DType::kFloat32));
  EXPECT_FALSE(ag::is_low_precision(DType::kFloat64));
  // The lists derived from the rows' flags hold exactly the dtypes they are meant to, in table order.
  EXPECT_EQ(std::vector<DType>(ag::kAllDTypes.begin(), ag::kAllDTypes.end()),
            (std::vector<DType>{DType::kFloat32, DType::kFloat16, DType::kFloat64, DType::kInt64, DType::kBFloat16,
                                DType::kFloat8E4M3, DType::kFloat8E5M2}));
  EXPECT_EQ(std::vector<DType>(ag::kFloatingDTypes.begin(), ag::kFloatingDTypes.end()),
            (std::vector<DType>{DType::kFloat32, DType::kFloat16, DType::kFloat64, DType::kBFloat16}));
  EXPECT_EQ(std::vector<DType>(ag::kLowPrecisionDTypes.begin(), ag::kLowPrecisionDTypes.end()),
            (std::vector<DType>{DType::kFloat16, DType::kBFloat16}));
  // The visitors reach each dtype's storage type; an integer or 8-bit dtype falls back to float for
  // math kernels.
  for (DType dtype : ag::kAllDTypes) {
    EXPECT_EQ(ag::visit_dtype(dtype, [](auto t) { return ag::kDTypeOf<decltype(t)>; }), dtype);
    EXPECT_EQ(ag::visit_floating_dtype(dtype, [](auto t) { return ag::kDTypeOf<decltype(t)>; }),
              ag::is_compute(dtype) ? dtype : DType::kFloat32);
  }
}

TEST(DTypeTable, PromotionIsByRankAndSymmetric) {
  for (DType a : ag::kAllDTypes) {
    for (DType b : ag::kAllDTypes) {
      const DType p = ag::promote_types(a, b);
      EXPECT_EQ(p, ag::promote_types(b, a));
      // One of the two, or float32 for two different floats of the same rank (the 16- and 8-bit ones).
      const bool two_halves = a != b && ag::dtype_info(a).promotion_rank == ag::dtype_info(b).promotion_rank;
      if (two_halves) {
        EXPECT_EQ(p, DType::kFloat32) << a << " + " << b;
      } else {
        EXPECT_TRUE(p == a || p == b) << a << " + " << b;
      }
      EXPECT_GE(ag::dtype_info(p).promotion_rank, ag::dtype_info(a).promotion_rank);
    }
  }
  EXPECT_EQ(ag::promote_types(DType::kFloat16, DType::kFloat32), DType::kFloat32);
  EXPECT_EQ(ag::promote_types(DType::kBFloat16, DType::kFloat32), DType::kFloat32);
  EXPECT_EQ(ag::promote_types(DType::kBFloat16, DType::kFloat64), DType::kFloat64);
  EXPECT_EQ(ag::promote_types(DType::kBFloat16, DType::kInt64), DType::kBFloat16);
  EXPECT_EQ(ag::promote_types(DType::kBFloat16, DType::kBFloat16), DType::kBFloat16);
  // As PyTorch: neither 16-bit float holds the other's values, so the pair meets in float32.
  EXPECT_EQ(ag::promote_types(DType::kFloat16, DType::kBFloat16), DType::kFloat32);
  EXPECT_EQ(ag::promote_types(DType::kFloat32, DType::kFloat64), DType::kFloat64);
}

TEST(Devices, FactsAndTheMissingBackendError) {
  EXPECT_EQ(ag::device_count(Device::kCPU), 1);
  EXPECT_EQ(ag::device_name(Device::kCPU), "cpu");
  EXPECT_EQ(ag::device_name(Device::kCUDA), "cuda");
  EXPECT_EQ(ag::cuda_is_available(), ag::device_count(Device::kCUDA) > 0);
  EXPECT_NO_THROW(ag::require_backend(Device::kCPU, "anything"));
  EXPECT_NO_THROW(ag::synchronize(Device::kCPU));
  if (ag::cuda_is_compiled()) {
    EXPECT_NO_THROW(ag::require_backend(Device::kCUDA, "linear"));
  } else {
    EXPECT_FALSE(ag::cuda_is_available());
    EXPECT_EQ(ag::cuda_host_sync_count(), 0);
    EXPECT_ERROR([] { ag::require_backend(Device::kCUDA, "linear"); }, "linear on cuda", "no CUDA backend",
                 "hint");
    EXPECT_ERROR([] { (void)ag::ones({2}, DType::kFloat32, Device::kCUDA); }, "no CUDA backend");
  }
}

TEST(Devices, Tf32SwitchIsProcessWideAndOffByDefault) {
  EXPECT_FALSE(ag::cuda::allow_tf32());
  ag::cuda::set_allow_tf32(true);
  EXPECT_TRUE(ag::cuda::allow_tf32());
  ag::cuda::set_allow_tf32(false);
  EXPECT_FALSE(ag::cuda::allow_tf32());
}

}  // namespace
