// Checks of the CUDA build's own pieces, compiled into cuda_test only when the toolkit is found
// (tests/BUILD): the cuBLAS loader and the AMPGRAD_CUDA_* switches run without a GPU; the launch
// profile needs one and skips without it.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "ampgrad.h"
#include "cuda_test_util.h"
#include "framework/cuda_check.h"
#include "framework/launch_profile.h"
#include "ops/linear/cublas.h"
#include "test_util.h"

namespace ag = ampgrad;

namespace {

// cuBLAS is loaded at run time: from the toolkit this was built with (or LD_LIBRARY_PATH) every
// entry point resolves, without a GPU; a library that is not there is a clear error.
TEST(CudaTest, CublasLoaderResolvesEveryEntryPoint) {
  const ag::kernels::cuda::CublasApi& api = ag::kernels::cuda::cublas();
  EXPECT_NE(api.create, nullptr);
  EXPECT_NE(api.gemm_ex, nullptr);
  EXPECT_NE(api.gemm_strided_batched_ex, nullptr);
  EXPECT_STREQ(api.status_name(CUBLAS_STATUS_NOT_INITIALIZED), "CUBLAS_STATUS_NOT_INITIALIZED");
  EXPECT_NE(api.path.find("libcublas.so."), std::string::npos) << api.path;
  EXPECT_ERROR([] { (void)ag::kernels::cuda::load_cublas({"/nonexistent/libcublas.so.13", "libnotcublas.so.0"}); },
               "cuBLAS could not be loaded", "/nonexistent/libcublas.so.13", "libnotcublas.so.0", "LD_LIBRARY_PATH");
}

TEST(CudaTest, SyncSwitchAcceptsOnlyZeroOrOne) {
  using ag::cuda::detail::parse_sync_flag;
  EXPECT_FALSE(parse_sync_flag(nullptr));
  EXPECT_FALSE(parse_sync_flag(""));
  EXPECT_FALSE(parse_sync_flag("0"));
  EXPECT_TRUE(parse_sync_flag("1"));
  EXPECT_ERROR([] { (void)parse_sync_flag("yes"); }, "AMPGRAD_CUDA_SYNC must be 0 or 1", "'yes'");
  EXPECT_ERROR([] { (void)ag::cuda::detail::parse_switch("AMPGRAD_CUDA_PROFILE", "on"); },
               "AMPGRAD_CUDA_PROFILE must be 0 or 1", "'on'");
}

// The launch profile's recorder: the time between two recorded launches goes to the second, per
// name; a take empties it. (AMPGRAD_CUDA_PROFILE=1 only makes every checked launch call it.)
TEST(CudaTest, LaunchProfileTimesTheLaunchBetweenTwoMarks) {
  SKIP_WITHOUT_CUDA();
  const ag::Tensor a = ag::randn({2048, 2048}, ag::DType::kFloat32, ag::Device::kCUDA);
  (void)ag::cuda::take_launch_profile();
  ag::cuda::detail::record_launch("start");
  for (int i = 0; i < 3; ++i) {
    (void)ag::ops::matmul(a, a);  // ~17 GFLOP: far longer than the events' own resolution
    ag::cuda::detail::record_launch("three matmuls");
  }
  const std::vector<ag::cuda::LaunchTime> profile = ag::cuda::take_launch_profile();
  const auto mine = std::find_if(profile.begin(), profile.end(),
                                 [](const ag::cuda::LaunchTime& t) { return t.kernel == "three matmuls"; });
  ASSERT_NE(mine, profile.end());
  EXPECT_EQ(mine->launches, 3);
  // Under AMPGRAD_CUDA_PROFILE=1 the matmul's own launch marks come just before each of ours.
  if (!ag::cuda::launch_profile_enabled()) {
    EXPECT_GT(mine->milliseconds, 0.0);
  }
  for (size_t i = 1; i < profile.size(); ++i) EXPECT_GE(profile[i - 1].milliseconds, profile[i].milliseconds);
  EXPECT_TRUE(ag::cuda::take_launch_profile().empty());
}

}  // namespace
