// CPU feature detection with CPUID/XGETBV, and AMPGRAD_CPU_ISA (see cpu_features.h).
#include "framework/cpu_features.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "framework/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define AMPGRAD_X86 1
#endif

namespace ampgrad {

namespace {

#ifdef AMPGRAD_X86
struct Regs {
  uint32_t eax = 0, ebx = 0, ecx = 0, edx = 0;
};

Regs cpuid(uint32_t leaf, uint32_t subleaf) {
  Regs r;
  if (__get_cpuid_count(leaf, subleaf, &r.eax, &r.ebx, &r.ecx, &r.edx) == 0) return Regs{};
  return r;
}

// XCR0: which register files the OS saves on a context switch. Read with inline asm, since the
// _xgetbv intrinsic needs -mxsave, which the baseline build does not pass.
uint64_t xgetbv0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

bool bit(uint32_t value, int n) { return ((value >> n) & 1u) != 0; }
#endif

CpuFeatures detect() {
  CpuFeatures f;
#ifdef AMPGRAD_X86
  const uint32_t max_leaf = cpuid(0, 0).eax;
  const Regs l1 = cpuid(1, 0);
  f.sse42 = bit(l1.ecx, 20);
  // The AVX register state must be enabled by the OS (OSXSAVE, then XCR0 bits 1-2), else an AVX
  // instruction faults even though CPUID lists it.
  const bool osxsave = bit(l1.ecx, 27);
  const uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  const bool ymm_state = (xcr0 & 0x6) == 0x6;
  const bool zmm_state = (xcr0 & 0xe6) == 0xe6;      // plus opmask, upper ZMM0-15, ZMM16-31
  const bool tile_state = (xcr0 & 0x60000) == 0x60000;  // XTILECFG and XTILEDATA
  const bool avx = bit(l1.ecx, 28) && ymm_state;
  f.fma = avx && bit(l1.ecx, 12);
  f.f16c = avx && bit(l1.ecx, 29);
  if (max_leaf >= 7) {
    const Regs l7 = cpuid(7, 0), l7s1 = cpuid(7, 1);
    f.avx2 = avx && bit(l7.ebx, 5);
    f.avx512f = zmm_state && bit(l7.ebx, 16);
    f.avx512dq = f.avx512f && bit(l7.ebx, 17);
    f.avx512bw = f.avx512f && bit(l7.ebx, 30);
    f.avx512vl = f.avx512f && bit(l7.ebx, 31);
    f.avx512_fp16 = f.avx512f && bit(l7.edx, 23);
    f.avx512_bf16 = f.avx512f && l7.eax >= 1 && bit(l7s1.eax, 5);
    f.amx_tile = tile_state && bit(l7.edx, 24);
    f.amx_bf16 = f.amx_tile && bit(l7.edx, 22);
    f.amx_fp16 = f.amx_tile && l7.eax >= 1 && bit(l7s1.eax, 21);
  }
#endif
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kBaseline: return "baseline";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
    case CpuIsa::kAvx512Bf16: return "avx512_bf16";
    case CpuIsa::kNative: return "native";
  }
  return "?";
}

CpuIsa parse_cpu_isa(const char* value) {
  const std::string_view v = value == nullptr ? "" : value;
  if (v.empty() || v == "native") return CpuIsa::kNative;
  for (CpuIsa isa : {CpuIsa::kBaseline, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16}) {
    if (v == cpu_isa_name(isa)) return isa;
  }
  AG_FAIL("AMPGRAD_CPU_ISA='", v, "' is not a known setting; hint: use 'baseline' (no run-time-chosen ",
          "extension), 'avx2', 'avx512', 'avx512_bf16' (at most that level) or 'native' (the default: the best ",
          "the CPU supports)");
}

CpuIsa cpu_isa() {
  // A function-local static: thread-safe, read once, so the choice cannot change mid-run.
  static const CpuIsa isa = parse_cpu_isa(std::getenv("AMPGRAD_CPU_ISA"));
  return isa;
}

std::string cpu_unsupported_reason(CpuIsa isa) {
  const CpuFeatures& f = cpu_features();
  std::string missing;
  const auto need = [&](bool have, const char* name) {
    if (!have) missing += std::string(missing.empty() ? "" : " ") + name;
  };
  // A level needs its own features and those of every level below it.
  if (isa == CpuIsa::kBaseline || isa == CpuIsa::kNative) return "";
  need(f.avx2, "avx2");
  need(f.fma, "fma");
  need(f.f16c, "f16c");
  if (isa == CpuIsa::kAvx512 || isa == CpuIsa::kAvx512Bf16) {
    need(f.avx512f, "avx512f");
    need(f.avx512bw, "avx512bw");
    need(f.avx512vl, "avx512vl");
    need(f.avx512dq, "avx512dq");
  }
  if (isa == CpuIsa::kAvx512Bf16) need(f.avx512_bf16, "avx512_bf16");
  return missing.empty() ? "" : "this CPU lacks " + missing;
}

bool cpu_supports(CpuIsa isa) { return cpu_unsupported_reason(isa).empty(); }

CpuIsa effective_cpu_isa() {
  static const CpuIsa effective = [] {
    const CpuIsa requested = cpu_isa() == CpuIsa::kNative ? CpuIsa::kAvx512Bf16 : cpu_isa();
    for (CpuIsa isa : {CpuIsa::kAvx512Bf16, CpuIsa::kAvx512, CpuIsa::kAvx2}) {
      if (static_cast<int>(isa) <= static_cast<int>(requested) && cpu_supports(isa)) return isa;
    }
    return CpuIsa::kBaseline;
  }();
  return effective;
}

bool cpu_isa_allows(CpuIsa level, CpuIsa cap) {
  const int allowed = std::min(static_cast<int>(cap), static_cast<int>(effective_cpu_isa()));
  return allowed >= static_cast<int>(level);
}

}  // namespace ampgrad
