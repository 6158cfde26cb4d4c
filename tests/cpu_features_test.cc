// CPU feature detection against the kernel's own list (/proc/cpuinfo), and AMPGRAD_CPU_ISA: its
// values, and the level the kernels use never being one the CPU lacks. tests/BUILD also runs this
// file with AMPGRAD_CPU_ISA set to baseline, avx2, avx512 and avx512_bf16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "framework/cpu_features.h"
#include "tests/test_util.h"

namespace ampgrad {
namespace {

// The "flags" line of /proc/cpuinfo (Linux lists a feature only if the kernel enabled its state).
std::set<std::string> proc_cpuinfo_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::set<std::string> flags;
    for (std::string w; words >> w;) flags.insert(w);
    return flags;
  }
  return {};
}

TEST(CpuFeatures, AgreeWithProcCpuinfo) {
  const std::set<std::string> flags = proc_cpuinfo_flags();
  if (flags.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags line on this system";
  const CpuFeatures& f = cpu_features();
  const auto has = [&](const char* name) { return flags.count(name) != 0; };
  EXPECT_EQ(f.sse42, has("sse4_2"));
  EXPECT_EQ(f.avx2, has("avx2"));
  EXPECT_EQ(f.fma, has("fma"));
  EXPECT_EQ(f.f16c, has("f16c"));
  EXPECT_EQ(f.avx512f, has("avx512f"));
  EXPECT_EQ(f.avx512bw, has("avx512bw"));
  EXPECT_EQ(f.avx512vl, has("avx512vl"));
  EXPECT_EQ(f.avx512dq, has("avx512dq"));
  EXPECT_EQ(f.avx512_bf16, has("avx512_bf16"));
  EXPECT_EQ(f.avx512_fp16, has("avx512_fp16"));
  EXPECT_EQ(f.amx_tile, has("amx_tile"));
  EXPECT_EQ(f.amx_bf16, has("amx_bf16"));
  EXPECT_EQ(f.amx_fp16, has("amx_fp16"));
}

TEST(CpuIsa, ParsesEveryValue) {
  EXPECT_EQ(parse_cpu_isa(nullptr), CpuIsa::kNative);
  EXPECT_EQ(parse_cpu_isa(""), CpuIsa::kNative);
  EXPECT_EQ(parse_cpu_isa("native"), CpuIsa::kNative);
  EXPECT_EQ(parse_cpu_isa("baseline"), CpuIsa::kBaseline);
  EXPECT_EQ(parse_cpu_isa("avx2"), CpuIsa::kAvx2);
  EXPECT_EQ(parse_cpu_isa("avx512"), CpuIsa::kAvx512);
  EXPECT_EQ(parse_cpu_isa("avx512_bf16"), CpuIsa::kAvx512Bf16);
  for (const char* bad : {"AVX512", "avx512bf16", "sse", " native"}) {
    EXPECT_TRUE(test::throws_error([&] { parse_cpu_isa(bad); }, {"AMPGRAD_CPU_ISA", bad, "baseline", "avx512"}));
  }
}

TEST(CpuIsa, SupportFollowsTheFeatures) {
  const CpuFeatures& f = cpu_features();
  EXPECT_TRUE(cpu_supports(CpuIsa::kBaseline));
  EXPECT_TRUE(cpu_supports(CpuIsa::kNative));
  EXPECT_EQ(cpu_supports(CpuIsa::kAvx2), f.avx2 && f.fma && f.f16c);
  EXPECT_EQ(cpu_supports(CpuIsa::kAvx512),
            cpu_supports(CpuIsa::kAvx2) && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq);
  EXPECT_EQ(cpu_supports(CpuIsa::kAvx512Bf16), cpu_supports(CpuIsa::kAvx512) && f.avx512_bf16);
  if (!f.avx512bw) {
    EXPECT_NE(cpu_unsupported_reason(CpuIsa::kAvx512).find("avx512bw"), std::string::npos);
    EXPECT_NE(cpu_unsupported_reason(CpuIsa::kAvx512Bf16).find("avx512bw"), std::string::npos);
  }
  if (!f.avx512_bf16) {
    EXPECT_NE(cpu_unsupported_reason(CpuIsa::kAvx512Bf16).find("avx512_bf16"), std::string::npos);
  }
  EXPECT_EQ(cpu_unsupported_reason(CpuIsa::kBaseline), "");
  EXPECT_EQ(cpu_unsupported_reason(CpuIsa::kNative), "");
}

TEST(CpuIsa, EffectiveLevelIsTheRequestedOneLoweredToWhatTheCpuHas) {
  const char* env = std::getenv("AMPGRAD_CPU_ISA");
  const CpuIsa requested = parse_cpu_isa(env);
  EXPECT_EQ(cpu_isa(), requested);
  const CpuIsa effective = effective_cpu_isa();
  EXPECT_NE(effective, CpuIsa::kNative);
  EXPECT_TRUE(cpu_supports(effective));
  EXPECT_LE(static_cast<int>(effective), static_cast<int>(requested));
  // Nothing between the effective level and the requested one is supported (it is the best one).
  for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16}) {
    if (static_cast<int>(isa) > static_cast<int>(effective) && static_cast<int>(isa) <= static_cast<int>(requested)) {
      EXPECT_FALSE(cpu_supports(isa)) << cpu_isa_name(isa);
    }
  }
  std::printf("AMPGRAD_CPU_ISA=%s: the kernels use %s\n", env ? env : "(unset)", cpu_isa_name(effective));
}

// A level may run when neither the effective level nor a kernel's own cap is below it.
TEST(CpuIsa, AllowsALevelUpToTheEffectiveOneAndTheCap) {
  const int effective = static_cast<int>(effective_cpu_isa());
  const CpuIsa levels[] = {CpuIsa::kBaseline, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16};
  for (CpuIsa level : levels) {
    EXPECT_EQ(cpu_isa_allows(level), static_cast<int>(level) <= effective) << cpu_isa_name(level);
    for (CpuIsa cap : levels) {
      const bool expected = static_cast<int>(level) <= std::min(effective, static_cast<int>(cap));
      EXPECT_EQ(cpu_isa_allows(level, cap), expected) << cpu_isa_name(level) << " capped at " << cpu_isa_name(cap);
    }
  }
  EXPECT_TRUE(cpu_isa_allows(CpuIsa::kBaseline, CpuIsa::kBaseline));
  EXPECT_FALSE(cpu_isa_allows(CpuIsa::kAvx2, CpuIsa::kBaseline));
}

}  // namespace
}  // namespace ampgrad
