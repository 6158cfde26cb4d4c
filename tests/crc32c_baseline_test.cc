// Run with AMPGRAD_CPU_ISA=baseline (tests/BUILD sets it): crc32c() must take the table path.
#include <cstdlib>
#include <string>

#include "tests/test_util.h"
#include "utils/cpu_isa.h"
#include "utils/crc32c.h"

namespace ampgrad::utils {
namespace {

TEST(Crc32cBaseline, EnvironmentForcesTheTablePath) {
  ASSERT_STREQ(std::getenv("AMPGRAD_CPU_ISA"), "baseline");
  EXPECT_EQ(cpu_isa(), CpuIsa::kBaseline);
  EXPECT_FALSE(crc32c_uses_hardware());
  EXPECT_EQ(crc32c(std::string_view("123456789")), 0xE3069283u);
}

}  // namespace
}  // namespace ampgrad::utils
