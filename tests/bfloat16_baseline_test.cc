// Run with AMPGRAD_CPU_ISA=baseline (tests/BUILD sets it): the bulk bfloat16 conversions must take
// the build's own path (AVX2), never a run-time pick, and still give the reference's bits.
#include <gtest/gtest.h>

#include <bit>
#include <cstdlib>
#include <vector>

#include "framework/bfloat16.h"
#include "framework/cpu_features.h"

namespace ag = ampgrad;
using ag::detail::Bf16Path;

namespace {

TEST(BFloat16Baseline, EnvironmentForcesTheBuildsOwnPath) {
  ASSERT_STREQ(std::getenv("AMPGRAD_CPU_ISA"), "baseline");
  EXPECT_EQ(ag::cpu_isa(), ag::CpuIsa::kBaseline);
  EXPECT_EQ(ag::effective_cpu_isa(), ag::CpuIsa::kBaseline);
  const Bf16Path expected = ag::detail::bf16_path_available(Bf16Path::kAvx2) ? Bf16Path::kAvx2 : Bf16Path::kScalar;
  EXPECT_EQ(ag::detail::bf16_selected_path(), expected);
  // The bulk conversions on that path: every midpoint and its neighbours round as the reference.
  std::vector<float> in;
  for (uint32_t b = 0; b < 0x7f80u; ++b) {
    for (uint32_t u : {(b << 16) | 0x7fffu, (b << 16) | 0x8000u, (b << 16) | 0x8001u}) {
      in.push_back(std::bit_cast<float>(u));
    }
  }
  std::vector<ag::BFloat16> out(in.size());
  ag::float_to_bfloat16(in.data(), out.data(), in.size());
  std::vector<float> back(in.size());
  ag::bfloat16_to_float(out.data(), back.data(), out.size());
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(out[i].bits, ag::float_to_bfloat16(in[i]).bits) << std::hexfloat << in[i];
    ASSERT_EQ(back[i], ag::bfloat16_to_float(out[i])) << std::hexfloat << in[i];
  }
}

}  // namespace
