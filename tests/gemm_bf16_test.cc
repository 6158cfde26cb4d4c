// The BF16 pair kernel (AVX512_BF16, VDPBF16PS) against the baseline kernel: the same bits while no
// subnormal turns up, over the shapes that reach the packing's edges (ragged m, n and k, odd k,
// k = 1, k = 0, k split into blocks, c split into column blocks), every transpose, with and without
// bias, float32 and bfloat16 results, 1-3 threads; subnormals flushed as documented, within the
// documented bound; and linear under BF16 autocast using the level's kernel. tests/BUILD runs this
// file again under AMPGRAD_CPU_ISA=baseline. A CPU without AVX512_BF16 skips, saying what it lacks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "amp/autocast.h"
#include "framework/cpu_features.h"
#include "framework/dtype.h"
#include "framework/parallel.h"
#include "framework/tensor.h"
#include "ops/linear_gemm_cpu.h"
#include "ops/linear_kernels.h"
#include "ops/ops.h"
#include "test_util.h"

namespace ag = ampgrad;
namespace agt = ampgrad::test;
namespace kc = ampgrad::kernels::cpu;
using ag::DType;
using ag::Tensor;
using ag::kernels::Transpose;

namespace {

struct Case {
  int64_t m, n, k;
};

// op(a) op(b) + bias through sgemm with one kernel: a [m, k] and b [k, n] hold the given values
// (rounded to bfloat16), stored transposed where asked.
struct Product {
  Case c;
  std::vector<double> a, b, bias;  // bias empty: none
  Transpose ta = Transpose::kNo, tb = Transpose::kNo;

  Tensor run(const kc::MicroKernel& kernel, DType c_dtype) const {
    const auto stored = [](const std::vector<double>& v, int64_t rows, int64_t cols, Transpose t) {
      if (t == Transpose::kNo) return Tensor::from_vector(v, {rows, cols}, DType::kBFloat16);
      std::vector<double> transposed(v.size());
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < cols; ++j) transposed[j * rows + i] = v[i * cols + j];
      }
      return Tensor::from_vector(transposed, {cols, rows}, DType::kBFloat16);
    };
    const auto view = [](const Tensor& t, int64_t cols, Transpose tr) {
      // op(t) has `cols` columns: a transpose reads the stored rows as columns.
      return tr == Transpose::kYes ? kc::MatrixView{t.data_ptr(), DType::kBFloat16, 1, cols}
                                   : kc::MatrixView{t.data_ptr(), DType::kBFloat16, cols, 1};
    };
    const Tensor at = stored(a, c.m, c.k, ta), bt = stored(b, c.k, c.n, tb);
    const Tensor bias_t = bias.empty() ? Tensor() : Tensor::from_vector(bias, {c.n}, DType::kBFloat16);
    Tensor out = ag::full({c.m, c.n}, std::nan(""), c_dtype);
    const kc::MatrixView bias_view = bias.empty() ? kc::MatrixView{} : kc::MatrixView{bias_t.data_ptr(), DType::kBFloat16, 0, 1};
    kc::sgemm(c.m, c.n, c.k, view(at, ta == Transpose::kYes ? c.m : c.k, ta),
              view(bt, tb == Transpose::kYes ? c.k : c.n, tb), bias_view, out.data_ptr(), c_dtype, {.kernel = &kernel});
    return out;
  }
};

Product random_product(const Case& c, Transpose ta, Transpose tb, bool with_bias, uint64_t seed) {
  Product p{c, agt::random_values(c.m * c.k, -1, 1, seed), agt::random_values(c.k * c.n, -1, 1, seed + 1), {}, ta, tb};
  if (with_bias) p.bias = agt::random_values(c.n, -1, 1, seed + 2);
  return p;
}

// The stored bytes of t as 16-bit words (float32 and bfloat16 alike), so NaNs compare too.
std::vector<uint16_t> bits(const Tensor& t) {
  std::vector<uint16_t> words(t.numel() * static_cast<int64_t>(ag::element_size(t.dtype())) / 2);
  std::memcpy(words.data(), t.data_ptr(), words.size() * 2);
  return words;
}

const kc::MicroKernel& baseline() { return kc::micro_kernel(ag::CpuIsa::kBaseline, DType::kBFloat16); }
const kc::MicroKernel& pairs() { return kc::micro_kernel(ag::CpuIsa::kAvx512Bf16, DType::kBFloat16); }

class GemmBf16 : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!ag::cpu_supports(ag::CpuIsa::kAvx512Bf16)) {
      GTEST_SKIP() << "the BF16 pair kernel: " << ag::cpu_unsupported_reason(ag::CpuIsa::kAvx512Bf16);
    }
    ASSERT_EQ(pairs().packing, kc::Packing::kBFloat16Pairs) << pairs().name;
    ASSERT_EQ(baseline().packing, kc::Packing::kFloat) << baseline().name;
  }
};

// Products of at least 16384 FLOP, so that both kernels run (smaller ones take plain loops).
// k odd, 1, 2, 3; tiles ragged in m and n; k in one block, and over the 2048 of a block (4097:
// three blocks, the last odd); n past the packed-b budget (column blocks).
constexpr Case kCases[] = {{64, 130, 1}, {64, 70, 2},     {50, 60, 3},     {5, 17, 97},       {8, 32, 64},
                           {9, 40, 70},  {13, 31, 601},   {130, 200, 530}, {40, 70, 1100},    {17, 45, 4097},
                           {9, 1100, 4200}};

TEST_F(GemmBf16, GivesTheBaselineBitsWithoutSubnormals) {
  // VDPBF16PS adds the high product first, each with an FMA's one rounding, and a word holds k
  // high and k + 1 low: the baseline's FMA chain in k order.
  uint64_t seed = 300;
  for (const Case& c : kCases) {
    for (Transpose ta : {Transpose::kNo, Transpose::kYes}) {
      for (Transpose tb : {Transpose::kNo, Transpose::kYes}) {
        for (bool with_bias : {false, true}) {
          const Product p = random_product(c, ta, tb, with_bias, seed += 3);
          for (DType c_dtype : {DType::kFloat32, DType::kBFloat16}) {
            SCOPED_TRACE(::testing::Message() << "m " << c.m << " n " << c.n << " k " << c.k << " a "
                                              << ::testing::PrintToString(ta == Transpose::kYes) << " b "
                                              << ::testing::PrintToString(tb == Transpose::kYes) << " bias "
                                              << with_bias << " c " << ag::dtype_name(c_dtype));
            ASSERT_EQ(bits(p.run(pairs(), c_dtype)), bits(p.run(baseline(), c_dtype)));
          }
        }
      }
    }
  }
}

TEST_F(GemmBf16, SpecialValuesGiveTheBaselineBits) {
  // k = 33 is odd: the last word is padded, and the pad's product must change no sum, not even -0.
  Product p = random_product({20, 64, 33}, Transpose::kNo, Transpose::kYes, true, 7);
  p.a[1] = std::nan("");
  p.a[33 + 5] = INFINITY;
  p.a[2 * 33 + 32] = -INFINITY;  // in the padded word
  for (int64_t q = 0; q < 33; ++q) {
    p.a[3 * 33 + q] = 0.0;                   // row 3 of a zero, column 0 of b negative and bias[0] -0:
    p.b[q * 64] = -0.5 - std::abs(p.b[q * 64]);  // element (3, 0) sums -0 + (-0) + ... = -0 in the baseline
  }
  p.bias[0] = -0.0;
  const Tensor out = p.run(pairs(), DType::kFloat32);
  EXPECT_EQ(bits(out), bits(p.run(baseline(), DType::kFloat32)));
  EXPECT_TRUE(std::signbit(out.to_double_vector()[3 * 64]));
}

TEST_F(GemmBf16, EmptyInnerDimensionGivesTheBias) {
  for (bool with_bias : {false, true}) {
    const Product p = random_product({3, 20, 0}, Transpose::kNo, Transpose::kNo, with_bias, 5);
    const std::vector<double> bias =
        with_bias ? Tensor::from_vector(p.bias, {20}, DType::kBFloat16).to_double_vector() : std::vector<double>(20);
    const std::vector<double> out = p.run(pairs(), DType::kFloat32).to_double_vector();
    for (int64_t j = 0; j < 60; ++j) EXPECT_EQ(out[j], bias[j % 20]) << j;
  }
}

TEST_F(GemmBf16, ResultDoesNotDependOnTheThreadCount) {
  const int before = ag::num_threads();
  const Product p = random_product({301, 97, 701}, Transpose::kYes, Transpose::kNo, true, 9);
  std::vector<std::vector<uint16_t>> results;
  for (int threads : {1, 2, 3}) {
    ag::set_num_threads(threads);
    results.push_back(bits(p.run(pairs(), DType::kBFloat16)));
  }
  ag::set_num_threads(before);
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], results[2]);
}

TEST_F(GemmBf16, FlushesSubnormalInputsToZero) {
  // A row of subnormal a: the baseline sums the exact tiny products, the pair kernel sees zeros.
  Product p = random_product({32, 64, 40}, Transpose::kNo, Transpose::kNo, false, 11);
  for (int64_t q = 0; q < 40; ++q) p.a[q] = std::ldexp(1.0 + q % 7, -133 + q % 4);  // row 0: 2^-133 .. 2^-127
  const std::vector<double> got = p.run(pairs(), DType::kFloat32).to_double_vector();
  const std::vector<double> exact = p.run(baseline(), DType::kFloat32).to_double_vector();
  Product flushed = p;
  for (int64_t q = 0; q < 40; ++q) flushed.a[q] = 0.0;
  EXPECT_EQ(bits(p.run(pairs(), DType::kFloat32)), bits(flushed.run(baseline(), DType::kFloat32)));
  int nonzero = 0;
  for (int64_t j = 0; j < 64; ++j) {
    EXPECT_EQ(got[j], 0.0) << j;
    nonzero += exact[j] != 0.0;
  }
  EXPECT_GT(nonzero, 60);  // the baseline keeps them (else this test would show nothing)
}

TEST_F(GemmBf16, FlushesSubnormalSumsToZero) {
  // Normal inputs whose products and sums are subnormal (2^-100 x 2^-30): each step's result is
  // flushed, so every sum stays zero; the baseline keeps gradual underflow.
  Product p = random_product({32, 64, 8}, Transpose::kNo, Transpose::kNo, false, 13);
  for (double& v : p.a) v = std::ldexp(1.0 + std::abs(v), -100);
  for (double& v : p.b) v = std::ldexp(1.0 + std::abs(v), -30);
  const std::vector<double> got = p.run(pairs(), DType::kFloat32).to_double_vector();
  const std::vector<double> exact = p.run(baseline(), DType::kFloat32).to_double_vector();
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i], 0.0) << i;
    EXPECT_GT(exact[i], 0.0) << i;
  }
}

// The documented bound on |pair kernel - baseline| for a float32 result of k products and a bias:
//   2 k 2^-24 (|bias| + sum |a b|) + k 2^-126 max(|a|, |b|) + (k + 1) 2^-125.
// Both are FP32 FMA chains over the same terms, each within k 2^-24 (|bias| + sum |a b|) of the
// exact sum; the pair kernel also drops the terms with a subnormal input (each < 2^-126 times the
// other factor) and flushes subnormal sums (under 2^-126 each, at most one per step: k, and the pad
// of an odd k), where the baseline's gradual underflow errs by 2^-150 at most per step.
TEST_F(GemmBf16, StaysWithinTheDocumentedBoundWithSubnormals) {
  const Case c{48, 64, 301};
  Product p = random_product(c, Transpose::kNo, Transpose::kYes, true, 17);
  // Row i of a scaled by 2^-(100 + i % 31), column j of b by 2^-(j % 31): the products of an
  // element range from 2^-100 to 2^-160, so inputs (rows from 2^-127 on), products and partial
  // sums cross the subnormal threshold in many elements and stay clear of it in others.
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t q = 0; q < c.k; ++q) p.a[i * c.k + q] = std::ldexp(p.a[i * c.k + q], -100 - static_cast<int>(i % 31));
  }
  for (int64_t j = 0; j < c.n; ++j) {
    for (int64_t q = 0; q < c.k; ++q) p.b[q * c.n + j] = std::ldexp(p.b[q * c.n + j], -static_cast<int>(j % 31));
  }
  for (double& v : p.bias) v = std::ldexp(v, -140);
  const Tensor a = Tensor::from_vector(p.a, {c.m, c.k}, DType::kBFloat16);   // the stored values
  const Tensor b = Tensor::from_vector(p.b, {c.k, c.n}, DType::kBFloat16);   // op(b), however stored
  const std::vector<double> av = a.to_double_vector(), bv = b.to_double_vector();
  const std::vector<double> bv_bias = Tensor::from_vector(p.bias, {c.n}, DType::kBFloat16).to_double_vector();
  const std::vector<double> got = p.run(pairs(), DType::kFloat32).to_double_vector();
  const std::vector<double> ref = p.run(baseline(), DType::kFloat32).to_double_vector();
  int differ = 0;
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      double size = std::abs(bv_bias[j]), largest = 0;
      for (int64_t q = 0; q < c.k; ++q) {
        size += std::abs(av[i * c.k + q] * bv[q * c.n + j]);
        largest = std::max({largest, std::abs(av[i * c.k + q]), std::abs(bv[q * c.n + j])});
      }
      const double k = static_cast<double>(c.k);
      const double bound = 2 * k * 0x1p-24 * size + k * 0x1p-126 * largest + (k + 1) * 0x1p-125;
      EXPECT_LE(std::abs(got[i * c.n + j] - ref[i * c.n + j]), bound) << i << ", " << j;
      differ += got[i * c.n + j] != ref[i * c.n + j];
    }
  }
  std::printf("%d of %lld results differ from the baseline's\n", differ, static_cast<long long>(c.m * c.n));
  EXPECT_GT(differ, 0);  // else the data crossed no threshold and this test showed nothing
}

TEST_F(GemmBf16, RefusesOperandsThatAreNotBfloat16) {
  const Tensor a = ag::ones({16, 64}), b = ag::ones({64, 32});
  Tensor out = ag::zeros({16, 32});
  EXPECT_ERROR(
      [&] {
        kc::sgemm(16, 32, 64, {a.data_ptr(), DType::kFloat32, 64, 1}, {b.data_ptr(), DType::kFloat32, 32, 1}, {},
                  out.data_ptr(), DType::kFloat32, {.kernel = &pairs()});
      },
      "sgemm", pairs().name, "bfloat16", "float32");
}

// Runs without the pair kernel too: the level picks it, or the widening kernel, for linear.
TEST(GemmBf16Level, LinearUnderBf16AutocastUsesTheLevelsKernel) {
  const kc::MicroKernel& kernel = kc::default_micro_kernel(DType::kBFloat16);
  const bool flushes = kernel.packing == kc::Packing::kBFloat16Pairs;
  EXPECT_EQ(flushes, ag::effective_cpu_isa() >= ag::CpuIsa::kAvx512Bf16);
  EXPECT_EQ(&kernel, &kc::micro_kernel(ag::effective_cpu_isa(), DType::kBFloat16));
  std::printf("AMPGRAD_CPU_ISA=%s: BF16 GEMM kernel %s\n",
              std::getenv("AMPGRAD_CPU_ISA") ? std::getenv("AMPGRAD_CPU_ISA") : "(unset)", kernel.name);
  // x [64, 40] float32 with a first row of values that are subnormal in bfloat16; autocast casts
  // x and w to bfloat16, so that row of x @ w^T is zero exactly when the pair kernel runs.
  std::vector<double> xv = agt::random_values(64 * 40, 1, 2, 23);
  for (int q = 0; q < 40; ++q) xv[q] = std::ldexp(1.0 + q % 5, -130);
  const Tensor x = Tensor::from_vector(xv, {64, 40}, DType::kFloat32);
  const Tensor w = Tensor::from_vector(agt::random_values(48 * 40, 1, 2, 29), {48, 40}, DType::kFloat32);
  Tensor y;
  {
    ag::amp::AutocastGuard autocast(ag::Device::kCPU, DType::kBFloat16);
    y = ag::ops::linear(x, w, Tensor());
  }
  ASSERT_EQ(y.dtype(), DType::kBFloat16);
  const std::vector<double> values = y.to_double_vector();
  for (int j = 0; j < 48; ++j) {
    if (flushes) {
      EXPECT_EQ(values[j], 0.0) << j;
    } else {
      EXPECT_GT(values[j], 0.0) << j;
    }
    EXPECT_GT(values[48 + j], 40.0) << j;  // an ordinary row: 40 products of at least 1
  }
}

}  // namespace
