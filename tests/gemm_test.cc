// The CPU GEMM kernel behind linear and matmul, against a float64 reference: every transpose,
// FP32, FP16 and BF16, with and without bias, over shapes that hit the kernel's edges (partial tiles,
// k split into several blocks, c split into column blocks, k = 0), and its result must not
// depend on the thread count. Every micro-kernel this CPU runs (one per instruction-set level and
// operand dtype) must give the baseline's bits; tests/BUILD runs this file again under
// AMPGRAD_CPU_ISA=baseline. gemm_bf16_test.cc tests the BF16 pair kernel's edges and subnormals.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "framework/allocator.h"
#include "framework/autograd.h"
#include "framework/cpu_features.h"
#include "framework/device.h"
#include "framework/dtype.h"
#include "framework/error.h"
#include "framework/parallel.h"
#include "framework/random.h"
#include "framework/tensor.h"
#include "ops/linear/linear_gemm_cpu.h"
#include "ops/linear/linear_kernels.h"
#include "ops/ops.h"
#include "test_util.h"

namespace ampgrad::kernels {
void PrintTo(Transpose t, std::ostream* os) { *os << (t == Transpose::kYes ? "transposed" : "as stored"); }
}  // namespace ampgrad::kernels

namespace ag = ampgrad;
namespace agt = ampgrad::test;
using ag::DType;
using ag::Tensor;
using ag::kernels::Transpose;

namespace {

struct Case {
  int64_t m, n, k;
};

// Stored shape of op(x) = [rows, cols].
std::vector<int64_t> stored(int64_t rows, int64_t cols, Transpose t) {
  return t == Transpose::kYes ? std::vector<int64_t>{cols, rows} : std::vector<int64_t>{rows, cols};
}

// Element (i, j) of op(x) for x stored row-major as given.
double at(const std::vector<double>& x, const std::vector<int64_t>& shape, Transpose t, int64_t i, int64_t j) {
  return t == Transpose::kYes ? x[j * shape[1] + i] : x[i * shape[1] + j];
}

struct Result {
  Tensor out;
  std::vector<double> expected;
  double magnitude;  // largest sum of |terms| of an element, for the tolerance of cancelling sums
};

Result run(const Case& c, DType dtype, Transpose ta, Transpose tb, bool with_bias, uint64_t seed) {
  const auto a_shape = stored(c.m, c.k, ta), b_shape = stored(c.k, c.n, tb);
  const Tensor a = Tensor::from_vector(agt::random_values(c.m * c.k, -1, 1, seed), a_shape, dtype);
  const Tensor b = Tensor::from_vector(agt::random_values(c.k * c.n, -1, 1, seed + 1), b_shape, dtype);
  const Tensor bias =
      with_bias ? Tensor::from_vector(agt::random_values(c.n, -1, 1, seed + 2), {c.n}, dtype) : Tensor();
  // The reference reads the stored (already rounded) values, so it is the exact product of what the kernel saw.
  const std::vector<double> av = a.to_double_vector(), bv = b.to_double_vector();
  const std::vector<double> biasv = with_bias ? bias.to_double_vector() : std::vector<double>(c.n, 0.0);
  Result r{ag::full({c.m, c.n}, std::nan(""), dtype), std::vector<double>(c.m * c.n), 1.0};
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      double sum = biasv[j], size = std::abs(biasv[j]);
      for (int64_t p = 0; p < c.k; ++p) {
        const double term = at(av, a_shape, ta, i, p) * at(bv, b_shape, tb, p, j);
        sum += term;
        size += std::abs(term);
      }
      r.expected[i * c.n + j] = sum;
      r.magnitude = std::max(r.magnitude, size);
    }
  }
  ag::kernels::gemm(a, ta, b, tb, bias, r.out);
  return r;
}

// FP32: a float sum of k terms. FP16/BF16: the same float sum rounded once, whose rounding
// (eps/2 relative) dwarfs the float error, so a tolerance of one rounding: a 16-bit accumulation
// or a missing term would fail it.
agt::Tol tolerance(DType dtype, int64_t k, double magnitude) {
  return ag::is_low_precision(dtype) ? agt::Tol{1, 1.0} : agt::Tol{k, magnitude};
}

constexpr DType kGemmDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};

using Param = std::tuple<DType, Transpose, Transpose, bool>;

class GemmTest : public ::testing::TestWithParam<Param> {};

TEST_P(GemmTest, MatchesFloat64Reference) {
  const auto [dtype, ta, tb, with_bias] = GetParam();
  // 1x1x1; partial tiles in both directions; exact 6x16 and 8x32 tiles; ragged k; m, n and k all
  // ragged and large enough to run in parallel; k over one block (1100: two equal blocks).
  const Case cases[] = {{1, 1, 1}, {5, 17, 3}, {6, 16, 256}, {8, 32, 64}, {7, 33, 257}, {13, 31, 600},
                        {130, 200, 530}, {40, 70, 1100}};
  uint64_t seed = 10;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "m " << c.m << " n " << c.n << " k " << c.k << ", kernel "
                                      << ag::kernels::cpu::default_micro_kernel(dtype).name);
    const Result r = run(c, dtype, ta, tb, with_bias, seed += 3);
    EXPECT_CLOSE(r.out, r.expected, dtype, tolerance(dtype, c.k, r.magnitude));
  }
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const auto [dtype, ta, tb, with_bias] = info.param;
  return std::string(ag::dtype_name(dtype)) + (ta == Transpose::kYes ? "_aT" : "_a") +
         (tb == Transpose::kYes ? "_bT" : "_b") + (with_bias ? "_bias" : "");
}

INSTANTIATE_TEST_SUITE_P(AllLayouts, GemmTest,
                         ::testing::Combine(::testing::ValuesIn(kGemmDTypes),
                                            ::testing::Values(Transpose::kNo, Transpose::kYes),
                                            ::testing::Values(Transpose::kNo, Transpose::kYes), ::testing::Bool()),
                         param_name);

TEST(Gemm, WideOutputIsDoneInColumnBlocks) {
  // k * n above the packed-b budget (2^21 floats) makes the kernel cut c into column blocks: of
  // at least 1024 columns with all of k (k 2000), or, where k leaves room for fewer, of 2048
  // columns over spans of k (k 8192: two blocks, eight spans of one k block each).
  for (const Case c : {Case{9, 1100, 2000}, Case{4, 2100, 8192}}) {
    for (DType dtype : kGemmDTypes) {
      SCOPED_TRACE(::testing::Message() << ag::dtype_name(dtype) << " k " << c.k);
      const Result r = run(c, dtype, Transpose::kNo, Transpose::kYes, true, 77);
      EXPECT_CLOSE(r.out, r.expected, dtype, tolerance(dtype, c.k, r.magnitude));
    }
  }
}

TEST(Gemm, LongInnerDimensionIsDoneInSpansOfK) {
  // k so long that all of it leaves room for fewer packed columns of b than the 40 of c (at most
  // 2^21 packed words: one word per k, or per pair of k for the BF16 pair kernel): the kernel
  // packs b a span of k blocks at a time, carrying the float sums (of a 16-bit result too) from
  // span to span. One column alone still fits with all of k and runs unsplit, over the same k
  // blocks: the same bits. The pair kernel's k is odd, so its last block has a padded word.
  for (DType dtype : kGemmDTypes) {
    SCOPED_TRACE(ag::dtype_name(dtype));
    const bool pairs = ag::kernels::cpu::default_micro_kernel(dtype).packing == ag::kernels::cpu::Packing::kBFloat16Pairs;
    const Case c{20, 40, pairs ? 100001 : 60001};
    const Result r = run(c, dtype, Transpose::kNo, Transpose::kNo, true, 31);
    EXPECT_CLOSE(r.out, r.expected, dtype, tolerance(dtype, c.k, r.magnitude));
    const Tensor a = Tensor::from_vector(agt::random_values(c.m * c.k, -1, 1, 31), {c.m, c.k}, dtype);
    const std::vector<double> b = agt::random_values(c.k * c.n, -1, 1, 32), bias = agt::random_values(c.n, -1, 1, 33);
    const std::vector<double> all = r.out.to_double_vector();
    for (int64_t j : {0, 17, 39}) {
      std::vector<double> column(c.k);
      for (int64_t p = 0; p < c.k; ++p) column[p] = b[p * c.n + j];
      Tensor out = ag::zeros({c.m, 1}, dtype);
      ag::kernels::gemm(a, Transpose::kNo, Tensor::from_vector(column, {c.k, 1}, dtype), Transpose::kNo,
                        Tensor::from_vector(std::vector<double>{bias[j]}, {1}, dtype), out);
      const std::vector<double> alone = out.to_double_vector();
      for (int64_t i = 0; i < c.m; ++i) ASSERT_EQ(alone[i], all[i * c.n + j]) << "row " << i << " column " << j;
    }
  }
}

TEST(Gemm, EmptyInnerDimensionGivesTheBias) {
  for (DType dtype : kGemmDTypes) {
    const Result with_bias = run({3, 20, 0}, dtype, Transpose::kNo, Transpose::kNo, true, 5);
    EXPECT_CLOSE(with_bias.out, with_bias.expected, dtype);
    const Result without = run({3, 20, 0}, dtype, Transpose::kYes, Transpose::kNo, false, 5);
    EXPECT_EQ(without.out.to_double_vector(), std::vector<double>(60, 0.0));
  }
}

TEST(Gemm, SmallProductsGiveTheSameBitsAsLargeOnes) {
  // A row on its own is small enough for the kernel's plain-loop path; inside a 200-row product it
  // goes through the packed path. Both sum bias-then-k in order in the kernel's arithmetic (FMAs,
  // or VDPBF16PS for the BF16 pair kernel), so the bits agree.
  for (DType dtype : kGemmDTypes) {
    const Tensor a = Tensor::from_vector(agt::random_values(200 * 300, -1, 1, 3), {200, 300}, dtype);
    const Tensor b = Tensor::from_vector(agt::random_values(300 * 20, -1, 1, 4), {20, 300}, dtype);
    const Tensor bias = Tensor::from_vector(agt::random_values(20, -1, 1, 5), {20}, dtype);
    Tensor all = ag::zeros({200, 20}, dtype), row = ag::zeros({1, 20}, dtype);
    ag::kernels::gemm(a, Transpose::kNo, b, Transpose::kYes, bias, all);
    const std::vector<double> a_values = a.to_double_vector();
    const std::vector<double> first(a_values.begin(), a_values.begin() + 300);
    ag::kernels::gemm(Tensor::from_vector(first, {1, 300}, dtype), Transpose::kNo, b, Transpose::kYes, bias, row);
    const std::vector<double> all_values = all.to_double_vector();
    EXPECT_EQ(row.to_double_vector(), std::vector<double>(all_values.begin(), all_values.begin() + 20));
  }
}

TEST(Gemm, ResultDoesNotDependOnTheThreadCount) {
  // Each element is summed by one tile in one fixed k order, whichever thread runs the tile.
  const int before = ag::num_threads();
  for (DType dtype : kGemmDTypes) {
    std::vector<std::vector<double>> results;
    for (int threads : {1, 2, 3}) {
      ag::set_num_threads(threads);
      results.push_back(run({301, 97, 700}, dtype, Transpose::kYes, Transpose::kNo, true, 9).out.to_double_vector());
    }
    EXPECT_EQ(results[0], results[1]);
    EXPECT_EQ(results[0], results[2]);
  }
  ag::set_num_threads(before);
}

// ---- every instruction-set level against the baseline ----------------------------------------

namespace kc = ag::kernels::cpu;

// The tensor's storage as 16-bit words (float32 and float16 alike).
std::vector<uint16_t> stored_bits(const Tensor& t) {
  std::vector<uint16_t> bits(t.numel() * static_cast<int64_t>(ag::element_size(t.dtype())) / 2);
  std::memcpy(bits.data(), t.data_ptr(), bits.size() * 2);
  return bits;
}

// op(a) op(b) + bias through sgemm with the given micro-kernel, as stored bits; a holds a NaN and
// an inf, whose rows must come out the same too.
std::vector<uint16_t> sgemm_bits(const Case& c, DType dtype, Transpose ta, Transpose tb,
                                 const kc::MicroKernel& kernel, uint64_t seed) {
  const auto a_shape = stored(c.m, c.k, ta), b_shape = stored(c.k, c.n, tb);
  Tensor a = Tensor::from_vector(agt::random_values(c.m * c.k, -1, 1, seed), a_shape, dtype);
  const Tensor b = Tensor::from_vector(agt::random_values(c.k * c.n, -1, 1, seed + 1), b_shape, dtype);
  const Tensor bias = Tensor::from_vector(agt::random_values(c.n, -1, 1, seed + 2), {c.n}, dtype);
  if (c.m * c.k > 3) {
    std::vector<double> values = a.to_double_vector();
    values[1] = std::nan("");
    values[3] = INFINITY;
    a = Tensor::from_vector(values, a_shape, dtype);
  }
  const auto view = [&](const Tensor& t, Transpose tr) {
    const int64_t cols = t.size(1);
    return tr == Transpose::kYes ? kc::MatrixView{t.data_ptr(), dtype, 1, cols}
                                 : kc::MatrixView{t.data_ptr(), dtype, cols, 1};
  };
  Tensor out = ag::zeros({c.m, c.n}, dtype);
  kc::sgemm(c.m, c.n, c.k, view(a, ta), view(b, tb), {bias.data_ptr(), dtype, 0, 1}, out.data_ptr(), dtype,
            {.kernel = &kernel});
  return stored_bits(out);
}

TEST(GemmLevels, EveryLevelThisCpuRunsGivesTheBaselineBits) {
  const Case cases[] = {{5, 17, 3}, {9, 40, 70}, {64, 64, 64}, {130, 200, 530}, {40, 70, 1100}};
  int compared = 0;
  std::set<std::pair<const kc::MicroKernel*, DType>> done;  // a kernel that serves several levels runs once
  for (ag::CpuIsa isa : {ag::CpuIsa::kAvx2, ag::CpuIsa::kAvx512, ag::CpuIsa::kAvx512Bf16}) {
    if (!ag::cpu_supports(isa)) {
      std::printf("[  SKIPPED ] level %s: %s\n", ag::cpu_isa_name(isa), ag::cpu_unsupported_reason(isa).c_str());
      continue;
    }
    for (DType dtype : kGemmDTypes) {
      // The BF16 pair kernel too: its sums are the FMA chain's (no subnormal in these values).
      const kc::MicroKernel& kernel = kc::micro_kernel(isa, dtype);
      const kc::MicroKernel& baseline = kc::micro_kernel(ag::CpuIsa::kBaseline, dtype);
      const std::string name(ag::dtype_name(dtype));
      if (&kernel == &baseline || !done.insert({&kernel, dtype}).second) {
        std::printf("level %s, %s: kernel %s, compared already or the baseline\n", ag::cpu_isa_name(isa), name.c_str(),
                    kernel.name);
        continue;
      }
      std::printf("level %s, %s: kernel %s against %s\n", ag::cpu_isa_name(isa), name.c_str(), kernel.name,
                  baseline.name);
      uint64_t seed = 100;
      for (const Case& c : cases) {
        for (Transpose ta : {Transpose::kNo, Transpose::kYes}) {
          for (Transpose tb : {Transpose::kNo, Transpose::kYes}) {
            SCOPED_TRACE(::testing::Message() << "m " << c.m << " n " << c.n << " k " << c.k << " "
                                              << ag::dtype_name(dtype) << " " << ::testing::PrintToString(ta) << " "
                                              << ::testing::PrintToString(tb));
            seed += 3;
            ASSERT_EQ(sgemm_bits(c, dtype, ta, tb, kernel, seed), sgemm_bits(c, dtype, ta, tb, baseline, seed));
            ++compared;
          }
        }
      }
    }
  }
  if (compared == 0) GTEST_SKIP() << "this CPU runs no kernel other than the baseline's";
}

TEST(GemmLevels, TheDefaultKernelFollowsAmpgradCpuIsa) {
  for (DType dtype : kGemmDTypes) {
    const kc::MicroKernel& expected = kc::micro_kernel(ag::effective_cpu_isa(), dtype);
    EXPECT_EQ(&kc::default_micro_kernel(dtype), &expected) << ag::dtype_name(dtype);
    if (ag::effective_cpu_isa() == ag::CpuIsa::kBaseline) {
      EXPECT_EQ(&kc::default_micro_kernel(dtype), &kc::micro_kernel(ag::CpuIsa::kBaseline, dtype));
    }
    // Only bfloat16 operands, and only from the avx512_bf16 level up, are packed as pairs.
    const bool pairs = dtype == DType::kBFloat16 && ag::effective_cpu_isa() >= ag::CpuIsa::kAvx512Bf16;
    EXPECT_EQ(kc::default_micro_kernel(dtype).packing == kc::Packing::kBFloat16Pairs, pairs) << ag::dtype_name(dtype);
    std::printf("AMPGRAD_CPU_ISA=%s: %s GEMM kernel %s\n",
                std::getenv("AMPGRAD_CPU_ISA") ? std::getenv("AMPGRAD_CPU_ISA") : "(unset)",
                std::string(ag::dtype_name(dtype)).c_str(), kc::default_micro_kernel(dtype).name);
  }
}

}  // namespace
