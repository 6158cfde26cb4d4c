// The BF16 pair kernel (AVX512_BF16, VDPBF16PS): against the baseline kernel, the same bits while
// no subnormal turns up, over the shapes that reach the packing's edges (ragged m, n and k, odd k,
// k = 1, k split into blocks, c split into column blocks), every transpose, with and without bias,
// float32 and bfloat16 results, 1-3 threads; against a software model of the instruction, bit for
// bit, where subnormals, NaNs and infs turn up; within a documented bound of the baseline. A CPU
// without AVX512_BF16 skips these, saying what it lacks. GemmBf16Level runs everywhere: linear
// under BF16 autocast uses the level's kernel, which gives a row the same bits alone and inside a
// batch, flushed exactly when the level is avx512_bf16; tests/BUILD runs it again under
// AMPGRAD_CPU_ISA=avx512, which must flush nothing.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "amp/autocast.h"
#include "framework/cpu_features.h"
#include "framework/dtype.h"
#include "framework/parallel.h"
#include "framework/tensor.h"
#include "ops/linear/linear_gemm_cpu.h"
#include "ops/linear/linear_kernels.h"
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

// ---- a software model of VDPBF16PS ------------------------------------------------------------
//
// One lane, as Intel's pseudo-code and notes give it: srcdest += src1.high * src2.high, then
// srcdest += src1.low * src2.low, each an FP32 FMA rounded once to nearest even, with "daz in, ftz
// out" whatever MXCSR says:
// - a subnormal input (a bfloat16 half, or the accumulator) is read as a zero of its own sign;
// - a tiny result is a zero of the exact result's sign (as MXCSR.FTZ gives). x86 detects tininess
//   after rounding, to 24 bits with an unbounded exponent: |exact| < 2^-126 - 2^-151. A float FMA
//   rounds into the subnormals instead, so just below 2^-126 it can give 2^-126 where the
//   instruction gives 0; the test is done on the exact sum (a b is exact in double, and TwoSum
//   gives acc + a b as s + e exactly).
// - NaN (Intel's Table 5-1): the first NaN of src1 low, src2 low, src1 high, src2 high, srcdest,
//   quieted, so a later k's NaN replaces an earlier one; with no NaN input, an invalid operation
//   (inf x 0, inf - inf) gives x86's default NaN 0xFFC00000. The kernel passes a as src1 and b as
//   src2; the data below never puts a NaN in both a and b at the same k, the one case that order
//   decides.
// A GEMM element is bias (or +0), then one instruction per word of a row of a and a column of b:
// k high, k + 1 low, and an odd k's last word padded with +0 in a and -0 in b.

namespace model {

constexpr uint16_t kPadA = 0x0000, kPadB = 0x8000;  // +0 and -0
constexpr uint32_t kDefaultNan = 0xffc00000u;

float from_bits(uint32_t u) { return std::bit_cast<float>(u); }
uint32_t to_bits(float f) { return std::bit_cast<uint32_t>(f); }
float widen(uint16_t b) { return from_bits(uint32_t{b} << 16); }
float daz(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x; }

// acc + a b, rounded once, tiny results flushed (a, b and acc are never subnormal here).
float fma_ftz(float acc, float a, float b) {
  const float rounded = std::fma(a, b, acc);
  if (!std::isfinite(rounded)) return rounded;
  const double p = static_cast<double>(a) * b, c = acc, s = p + c, c_part = s - p;
  const double e = (p - (s - c_part)) + (c - c_part);  // s + e == p + c exactly (TwoSum)
  constexpr double kTiny = 0x1p-126 - 0x1p-151;       // below this, rounding gives less than 2^-126
  const bool tiny = s != 0 && (std::abs(s) < kTiny || (std::abs(s) == kTiny && e != 0 && (e < 0) != (s < 0)));
  return tiny ? std::copysign(0.0f, static_cast<float>(s)) : rounded;
}

// One instruction on one lane.
float vdpbf16ps(float acc, uint32_t a_word, uint32_t b_word) {
  const float a_high = daz(widen(a_word >> 16)), a_low = daz(widen(a_word & 0xffff));
  const float b_high = daz(widen(b_word >> 16)), b_low = daz(widen(b_word & 0xffff));
  acc = daz(acc);
  for (float x : {a_low, b_low, a_high, b_high, acc}) {
    if (std::isnan(x)) return from_bits(to_bits(x) | 0x00400000u);
  }
  const float sum = fma_ftz(fma_ftz(acc, a_high, b_high), a_low, b_low);
  return std::isnan(sum) ? from_bits(kDefaultNan) : sum;
}

}  // namespace model

// A product given as bfloat16 bits: a [m, k] and b [k, n] row-major, bias n values or none.
struct BitsProduct {
  int64_t m, n, k;
  std::vector<uint16_t> a, b, bias;

  // c through sgemm (float32) with `kernel`, or the level's kernel when null, as float bits.
  std::vector<uint32_t> run(const kc::MicroKernel* kernel) const {
    std::vector<float> c(static_cast<size_t>(m * n), std::nanf(""));
    const kc::MatrixView bias_view =
        bias.empty() ? kc::MatrixView{} : kc::MatrixView{bias.data(), DType::kBFloat16, 0, 1};
    kc::sgemm(m, n, k, {a.data(), DType::kBFloat16, k, 1}, {b.data(), DType::kBFloat16, n, 1}, bias_view, c.data(),
              DType::kFloat32, {.kernel = kernel});
    std::vector<uint32_t> out(c.size());
    for (size_t i = 0; i < c.size(); ++i) out[i] = model::to_bits(c[i]);
    return out;
  }

  // c as the pair kernel must sum it (model::vdpbf16ps per word), or as the baseline's FMA chain
  // (bias, then one float FMA per k, subnormals kept).
  enum class Sums { kPairs, kFmaChain };
  std::vector<uint32_t> modelled(Sums sums) const {
    std::vector<uint32_t> out(static_cast<size_t>(m * n));
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        float acc = bias.empty() ? 0.0f : model::widen(bias[j]);
        for (int64_t q = 0; q < k; q += sums == Sums::kPairs ? 2 : 1) {
          const uint16_t a0 = a[i * k + q], b0 = b[q * n + j];
          if (sums == Sums::kFmaChain) {
            acc = std::fma(model::widen(a0), model::widen(b0), acc);
            continue;
          }
          const bool whole = q + 1 < k;
          const uint16_t a1 = whole ? a[i * k + q + 1] : model::kPadA, b1 = whole ? b[(q + 1) * n + j] : model::kPadB;
          acc = model::vdpbf16ps(acc, (uint32_t{a0} << 16) | a1, (uint32_t{b0} << 16) | b1);
        }
        out[i * n + j] = model::to_bits(acc);
      }
    }
    return out;
  }
};

// Whether got and want hold the same float bits, or (NanBits::kAny) are both NaN of any payload;
// names the first few elements that differ.
enum class NanBits { kSame, kAny };
::testing::AssertionResult same_floats(const std::vector<uint32_t>& got, const std::vector<uint32_t>& want, int64_t n,
                                       NanBits nan_bits) {
  int differ = 0;
  ::testing::Message first;
  for (size_t e = 0; e < got.size(); ++e) {
    const bool both_nan = std::isnan(model::from_bits(got[e])) && std::isnan(model::from_bits(want[e]));
    if (got[e] == want[e] || (both_nan && nan_bits == NanBits::kAny)) continue;
    if (++differ <= 5) {
      first << " (" << e / n << ", " << e % n << "): " << std::hex << got[e] << " not " << want[e] << std::dec << ";";
    }
  }
  if (differ == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << differ << " of " << got.size() << " elements differ:" << first;
}

uint16_t bf16(double v) { return ag::double_to_bfloat16(v).bits; }

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
// three blocks, the last odd); n past the packed-b budget: column blocks with all of k (k 4000),
// column blocks over spans of k (k 8192), and one column block over spans (k 4200).
constexpr Case kCases[] = {{64, 130, 1},   {64, 70, 2},   {50, 60, 3},    {5, 17, 97},      {8, 32, 64},
                           {9, 40, 70},    {13, 31, 601}, {130, 200, 530}, {40, 70, 1100},  {17, 45, 4097},
                           {9, 1100, 4000}, {4, 2100, 8192}, {9, 1100, 4200}};

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

TEST_F(GemmBf16, EmptyInnerDimensionGivesTheBiasUnflushed) {
  // k = 0 runs no VDPBF16PS step (the pair kernel's plain path sums nothing), so the bias comes
  // out as it is, a subnormal one too, at every m.
  for (int64_t m : {1, 3, 64}) {
    BitsProduct p{m, 20, 0, {}, {}, {}};
    for (double v : agt::random_values(20, -1, 1, 5)) p.bias.push_back(bf16(v));
    p.bias[3] = bf16(0x1p-130), p.bias[7] = bf16(-0x1p-127);
    const std::vector<uint32_t> out = p.run(&pairs());
    for (int64_t e = 0; e < m * 20; ++e) EXPECT_EQ(out[e], model::to_bits(model::widen(p.bias[e % 20]))) << e;
    p.bias.clear();
    for (uint32_t bits : p.run(&pairs())) EXPECT_EQ(bits, 0u);
  }
}

// Values in [-1, 1) (as bfloat16 bits), with, where the shape has room, elements whose sums stay
// small enough for a flush to show:
//   (0, 0): a subnormal a times 2^25, 2^25 times a subnormal b, and 2^-50 x 2^-50, in turn;
//   (1, 1): a near 2^-100 times b near 2^-26, signs alternating: products and partial sums on
//     both sides of 2^-126;
//   (2, 2): each word's products are 2^-120 and -(2^-120 - 2^-135), so the exact sum after every
//     word, at each k-block boundary too, is a subnormal multiple of 2^-135;
//   a subnormal bias in columns 1, 2 and every fifth (the accumulator's first input);
//   (3, 3), (4, 4) and (5, 5) meet two NaNs each, (6, 6) inf x 0 (see kNanCases);
//   (7, 7): its first step is 2^-126 - 1.5 2^-151, tiny after rounding to 24 bits, so flushed to
//     +0, though a float FMA (rounding into the subnormals) gives 2^-126; row 7 is zero after it.
BitsProduct special_product(int64_t m, int64_t n, int64_t k, uint64_t seed) {
  BitsProduct p{m, n, k, {}, {}, {}};
  for (double v : agt::random_values(m * k, -1, 1, seed)) p.a.push_back(bf16(v));
  for (double v : agt::random_values(k * n, -1, 1, seed + 1)) p.b.push_back(bf16(v));
  const std::vector<double> r = agt::random_values(2 * k + n, 1, 2, seed + 2);  // magnitudes
  for (int64_t j = 0; j < n; ++j) {
    p.bias.push_back(bf16(j % 5 == 0 || j == 1 || j == 2 ? -r[2 * k + j] * 0x1p-130 : r[2 * k + j] - 1.5));
  }
  // Element (i, j) of a [rows, cols] matrix, where the shape has it.
  const auto set = [](std::vector<uint16_t>& x, int64_t rows, int64_t cols, int64_t i, int64_t j, uint16_t bits) {
    if (i < rows && j < cols) x[i * cols + j] = bits;
  };
  const auto set_a = [&](int64_t i, int64_t q, uint16_t bits) { set(p.a, m, k, i, q, bits); };
  const auto set_b = [&](int64_t q, int64_t j, uint16_t bits) { set(p.b, k, n, q, j, bits); };
  for (int64_t q = 0; q < k; ++q) {
    const double sign = q % 2 == 0 ? 1 : -1, ra = r[q], rb = r[k + q];
    set_a(0, q, bf16(q % 3 == 0 ? sign * ra * 0x1p-131 : q % 3 == 1 ? ra * 0x1p25 : sign * ra * 0x1p-50));
    set_b(q, 0, bf16(q % 3 == 0 ? rb * 0x1p25 : q % 3 == 1 ? -sign * rb * 0x1p-128 : rb * 0x1p-50));
    set_a(1, q, bf16(sign * ra * 0x1p-100));
    set_b(q, 1, bf16(rb * 0x1p-26));
    set_a(2, q, bf16(q % 2 == 0 ? 0x1p-60 : 151 * 0x1p-67));  // 151 x 217 = 2^15 - 1
    set_b(q, 2, bf16(q % 2 == 0 ? 0x1p-60 : -217 * 0x1p-68));
  }
  set_a(3, 10, 0x7fa1);  // a signalling NaN at k = 10 (a word's high half), and
  set_b(11, 3, 0xffc2);  // a negative quiet one at k = 11 (its low half): the low half's wins
  set_b(20, 4, 0x7fc4);  // b's NaN at k = 20 (high) against
  set_a(4, 21, 0x7fc3);  // a's at k = 21 (low): the low half's wins, though it is a's
  set_a(5, 6, 0x7fc5);   // k = 6 against
  set_b(31, 5, 0xffe6);  // k = 31: an input's NaN wins over the accumulator's, so the later k's
  set_a(6, 0, 0x7f80);   // inf x 0 and no NaN input: the default NaN
  set_b(0, 6, 0x0000);
  for (int64_t q = 0; q < k; ++q) set_a(7, q, bf16(q == 0 ? -1.5 * 0x1p-100 : 0));
  set_b(0, 7, bf16(0x1p-51));
  if (n > 7) p.bias[7] = bf16(0x1p-126);
  return p;
}

// What the instruction gives for the NaN elements of special_product (with k >= 32).
struct NanCase {
  int64_t i, j;
  uint32_t bits;
};
constexpr NanCase kNanCases[] = {{3, 3, 0xffc20000u}, {4, 4, 0x7fc30000u}, {5, 5, 0xffe60000u}, {6, 6, 0xffc00000u}};

TEST_F(GemmBf16, MatchesTheInstructionModelBitForBit) {
  // k = 4099 spans three k blocks of the packed path and ends in a padded word; the last two
  // shapes are small enough for its plain path (the same instruction on unpacked pairs).
  constexpr Case cases[] = {{24, 40, 4099}, {13, 31, 601}, {9, 40, 70}, {7, 7, 33}, {1, 9, 40}};
  uint64_t seed = 500;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "m " << c.m << " n " << c.n << " k " << c.k);
    const BitsProduct p = special_product(c.m, c.n, c.k, seed += 3);
    const std::vector<uint32_t> got = p.run(&pairs()), want = p.modelled(BitsProduct::Sums::kPairs);
    EXPECT_TRUE(same_floats(got, want, c.n, NanBits::kSame));
    // The baseline keeps the subnormals, and its FMAs may pick the other of two NaNs (an x86 FMA
    // propagates by operand position, and the compiler picks the form): the model's FMA chain's
    // bits, and the pair kernel's NaN-ness.
    const std::vector<uint32_t> exact = p.run(&baseline()), chain = p.modelled(BitsProduct::Sums::kFmaChain);
    EXPECT_TRUE(same_floats(exact, chain, c.n, NanBits::kAny));
    for (size_t e = 0; e < got.size(); ++e) {
      EXPECT_EQ(std::isnan(model::from_bits(got[e])), std::isnan(model::from_bits(exact[e])))
          << e / c.n << ", " << e % c.n;
    }
    // What the data is there to show.
    for (const NanCase& nan : kNanCases) {
      if (nan.i < c.m && nan.j < c.n && c.k >= 32) {
        EXPECT_EQ(want[nan.i * c.n + nan.j], nan.bits) << nan.i;
      }
    }
    if (c.m > 7 && c.n > 7) {
      EXPECT_EQ(want[7 * c.n + 7], 0u);  // tiny after rounding
      EXPECT_EQ(chain[7 * c.n + 7], 0x00800000u);
    }
    for (int64_t d = 0; d < std::min({c.m, c.n, int64_t{3}}); ++d) {
      EXPECT_NE(want[d * c.n + d], chain[d * c.n + d]) << "element (" << d << ", " << d << ") flushes nothing";
    }
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

// The documented bound on |pair kernel - baseline| for a float32 result of k products and a bias,
// with u = 2^-24 and gamma_k = k u / (1 - k u):
//   2 gamma_k (|bias| + sum |a b|) + D + (1 + gamma_k) ((k + 1) 2^-126 + k 2^-150),
// D the magnitude of what the pair kernel drops: the products with a subnormal factor, and a
// subnormal bias. Both are chains of k roundings over (a subset of) the same terms, each within
// gamma_k (|bias| + sum |a b|) of its exact sum when nothing underflows; the pair kernel's flushes
// of tiny sums (under 2^-126 each, at most one per step: k, and the pad of an odd k) and the
// baseline's gradual underflow (2^-150 at most per step) add the rest. This is the second check,
// loose where results are tiny; MatchesTheInstructionModelBitForBit is the exact one.
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
  const auto subnormal = [](double x) { return x != 0 && std::abs(x) < 0x1p-126; };
  const double k = static_cast<double>(c.k), gamma = k * 0x1p-24 / (1 - k * 0x1p-24);
  int differ = 0;
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      double size = std::abs(bv_bias[j]), dropped = subnormal(bv_bias[j]) ? std::abs(bv_bias[j]) : 0;
      for (int64_t q = 0; q < c.k; ++q) {
        const double a = av[i * c.k + q], b = bv[q * c.n + j];
        size += std::abs(a * b);
        if (subnormal(a) || subnormal(b)) dropped += std::abs(a * b);
      }
      const double bound = 2 * gamma * size + dropped + (1 + gamma) * ((k + 1) * 0x1p-126 + k * 0x1p-150);
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

// Runs without the pair kernel too: a row's bits must not depend on the rows around it. m = 1 is
// under the 16K FLOP of the plain path, the batches over it (packed); k = 4099 spans k blocks.
TEST(GemmBf16Level, ARowGivesTheSameBitsAloneAndInABatch) {
  const bool flushes = kc::default_micro_kernel(DType::kBFloat16).packing == kc::Packing::kBFloat16Pairs;
  struct Shape {
    int64_t n, k;
  };
  uint64_t seed = 700;
  for (const Shape& s : {Shape{48, 40}, Shape{33, 41}, Shape{1, 4099}}) {
    // Row 0: a near 2^-122 (a subnormal at every fourth k), against b in [-1, 1) with a subnormal
    // at every fifth k; a subnormal bias in every third column. Its sums stay near 2^-120, where
    // dropped subnormal terms show and partial sums cross 2^-126.
    BitsProduct row{1, s.n, s.k, {}, {}, {}};
    const std::vector<double> ra = agt::random_values(s.k, -1, 1, seed += 3);
    for (int64_t q = 0; q < s.k; ++q) row.a.push_back(bf16(std::ldexp(ra[q], q % 4 == 0 ? -130 : -122)));
    const std::vector<double> rb = agt::random_values(s.k * s.n, -1, 1, seed + 1);
    for (int64_t e = 0; e < s.k * s.n; ++e) row.b.push_back(bf16(e / s.n % 5 == 2 ? std::ldexp(rb[e], -127) : rb[e]));
    const std::vector<double> rc = agt::random_values(s.n, -1, 1, seed + 2);
    for (int64_t j = 0; j < s.n; ++j) row.bias.push_back(bf16(std::ldexp(rc[j], j % 3 == 0 ? -128 : -120)));
    const std::vector<uint32_t> alone = row.run(nullptr);
    const std::vector<uint32_t> want = row.modelled(flushes ? BitsProduct::Sums::kPairs : BitsProduct::Sums::kFmaChain);
    // Else the row would show nothing.
    EXPECT_NE(row.modelled(BitsProduct::Sums::kPairs), row.modelled(BitsProduct::Sums::kFmaChain));
    SCOPED_TRACE(::testing::Message() << "n " << s.n << " k " << s.k << ", " << (flushes ? "flushed" : "not flushed"));
    EXPECT_TRUE(same_floats(alone, want, s.n, NanBits::kSame)) << "m 1";
    for (int64_t m : {8, 64, 200}) {
      BitsProduct batch = row;
      batch.m = m;
      for (double v : agt::random_values((m - 1) * s.k, -1, 1, seed + m)) batch.a.push_back(bf16(v));
      std::vector<uint32_t> first = batch.run(nullptr);
      first.resize(static_cast<size_t>(s.n));
      EXPECT_TRUE(same_floats(first, want, s.n, NanBits::kSame)) << "m " << m;
    }
  }
}

}  // namespace
