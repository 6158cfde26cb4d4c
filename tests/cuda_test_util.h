// What the CUDA tests share: SKIP_WITHOUT_CUDA skips a test when there is no usable GPU, except
// under AMPGRAD_REQUIRE_CUDA=1 (tools/gpu_check.sh sets it on the GPU machine), where a missing GPU
// fails the test with the reason instead of letting the run look green.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "framework/device.h"

namespace ampgrad::test {

/// AMPGRAD_REQUIRE_CUDA: unset, "" or "0" means no, "1" means yes; anything else is reported.
enum class CudaRequirement { kNo, kYes, kInvalid };
inline CudaRequirement cuda_requirement() {
  const char* value = std::getenv("AMPGRAD_REQUIRE_CUDA");
  const std::string v = value == nullptr ? "" : value;
  if (v.empty() || v == "0") return CudaRequirement::kNo;
  return v == "1" ? CudaRequirement::kYes : CudaRequirement::kInvalid;
}

}  // namespace ampgrad::test

#define SKIP_WITHOUT_CUDA()                                                                                  \
  do {                                                                                                       \
    const ::ampgrad::test::CudaRequirement ag_required_ = ::ampgrad::test::cuda_requirement();               \
    if (ag_required_ == ::ampgrad::test::CudaRequirement::kInvalid)                                          \
      FAIL() << "AMPGRAD_REQUIRE_CUDA must be 0 or 1, got '" << std::getenv("AMPGRAD_REQUIRE_CUDA") << "'"; \
    if (!::ampgrad::cuda_is_available()) {                                                                   \
      if (ag_required_ == ::ampgrad::test::CudaRequirement::kYes)                                            \
        FAIL() << "AMPGRAD_REQUIRE_CUDA=1 but cuda_is_available() is false: "                                \
               << ::ampgrad::cuda::unavailable_reason();                                                     \
      GTEST_SKIP() << "no CUDA device (" << ::ampgrad::cuda::unavailable_reason()                            \
                   << "); run tools/gpu_check.sh on a GPU machine";                                          \
    }                                                                                                        \
  } while (false)
