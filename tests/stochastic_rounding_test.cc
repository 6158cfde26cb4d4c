// Stochastic rounding: the bit-level roundings against a double-precision reference over every
// kind of value, their unbiasedness, and MasterWeights::kStochasticRounding: no master is kept,
// updates below half the spacing accumulate on average, the bits follow the documented key on any
// chunking, and runs and resumed checkpoints repeat bit for bit. (CUDA against the CPU:
// cuda_kernels_test.)
#include <gtest/gtest.h>

#include <bit>
#include <cstdio>
#include <cmath>
#include <filesystem>
#include <limits>
#include <random>
#include <vector>

#include "amp/grad_scaler.h"
#include "amp_test_util.h"
#include "checkpoint/checkpoint.h"
#include "framework/counter_random.h"
#include "framework/multi_tensor.h"
#include "framework/random.h"
#include "framework/stochastic_rounding.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "ops/ops.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "optim/update_kernels.h"

namespace ag = ampgrad;
using ag::DType;
using ag::Tensor;
using ag::optim::MasterWeights;

namespace {

// The reference: x's neighbours in the 16-bit format from its round-to-nearest conversion, and
// "up" (away from zero) with probability p, the distance to the lower one over the spacing, in
// double: when the random fraction u (of `fraction_bits` bits) is below p, or (`from_top`) when
// u >= 1 - p. Both conventions round up for a share p of the random values.
template <typename ToBits, typename ToFloat>
uint16_t reference(float x, uint64_t random, int fraction_bits, bool from_top, uint16_t max_finite_bits,
                   ToBits to_bits, ToFloat to_float) {
  const uint16_t nearest = to_bits(x);
  if (std::isnan(x)) return nearest;
  if (std::isinf(x) || static_cast<double>(to_float(nearest)) == static_cast<double>(x)) return nearest;
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double magnitude = std::fabs(static_cast<double>(x));
  uint16_t lower = nearest & 0x7fff;  // the magnitude bits of the neighbour toward zero
  if (lower > max_finite_bits || std::fabs(static_cast<double>(to_float(nearest))) > magnitude) --lower;
  const double low = to_float(lower);
  // Past the largest finite value the upper neighbour is inf, one spacing above it.
  const double high = lower == max_finite_bits ? low + (low - to_float(lower - 1)) : to_float(lower + 1);
  const double fraction = (magnitude - low) / (high - low);
  const double u = static_cast<double>(random & ((uint64_t{1} << fraction_bits) - 1)) / std::ldexp(1.0, fraction_bits);
  const bool up = from_top ? u >= 1.0 - fraction : u < fraction;
  return sign | static_cast<uint16_t>(up ? lower + 1 : lower);
}

uint16_t bf16_reference(float x, uint64_t random) {
  return reference(
      x, random, 16, /*from_top=*/true, 0x7f7f, [](float v) { return ag::float_to_bfloat16(v).bits; },
      [](uint16_t b) { return static_cast<double>(ag::bfloat16_to_float(ag::BFloat16{b})); });
}

uint16_t fp16_reference(float x, uint64_t random) {
  return reference(
      x, random, 24, /*from_top=*/false, 0x7bff, [](float v) { return ag::float_to_half(v).bits; },
      [](uint16_t b) { return static_cast<double>(ag::half_to_float(ag::Half{b})); });
}

// Floats of every kind: random bit patterns (all binades, subnormals, NaNs, infs), and values in
// the 16-bit formats' subnormal ranges and around their largest finite values.
std::vector<float> test_values() {
  std::mt19937_64 gen(7);
  std::vector<float> values = {0.0f, -0.0f, 1.0f, -1.0f, std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                               std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min(),
                               65504.0f, 65519.0f, 65520.0f, 65535.0f, 65536.0f, 6.1e-5f, 3e-8f, 1e-40f};
  for (int i = 0; i < 20000; ++i) values.push_back(std::bit_cast<float>(static_cast<uint32_t>(gen())));
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  for (int i = 0; i < 5000; ++i) {
    values.push_back(unit(gen) * 1e-4f);      // float16 subnormals and the smallest normals
    values.push_back(unit(gen) * 1e-38f);     // bfloat16 subnormals
    values.push_back(unit(gen) * 70000.0f);   // float16's top binades and past them
    values.push_back(unit(gen) * 3.4e38f);    // bfloat16's top binade
  }
  return values;
}

TEST(StochasticRounding, Bfloat16BitsMatchTheReference) {
  std::mt19937_64 gen(1);
  for (const float x : test_values()) {
    for (int k = 0; k < 4; ++k) {
      const uint32_t random = static_cast<uint32_t>(gen());
      const uint16_t got = ag::stochastic::bfloat16_bits(std::bit_cast<uint32_t>(x), random);
      ASSERT_EQ(got, bf16_reference(x, random)) << x << " (bits " << std::hex << std::bit_cast<uint32_t>(x)
                                                << ") random " << random;
    }
  }
}

TEST(StochasticRounding, Float16BitsMatchTheReference) {
  std::mt19937_64 gen(2);
  for (const float x : test_values()) {
    for (int k = 0; k < 4; ++k) {
      const uint32_t random = static_cast<uint32_t>(gen());
      const uint16_t got = ag::stochastic::float16_bits(std::bit_cast<uint32_t>(x), random);
      if (std::isnan(x)) {  // a quiet NaN of x's sign (the payload is the conversion's own)
        ASSERT_EQ(got & 0xfe00, (std::signbit(x) ? 0x8000 : 0) | 0x7e00) << std::hex << got;
        continue;
      }
      ASSERT_EQ(got, fp16_reference(x, random)) << x << " (bits " << std::hex << std::bit_cast<uint32_t>(x)
                                                << ") random " << random;
    }
  }
}

// Over all 2^16 random values, bfloat16 rounds up exactly (dropped bits) times: the probability is
// exact, not approximately right.
TEST(StochasticRounding, Bfloat16RoundsUpWithExactlyTheRightProbability) {
  for (const float x : {1.0f + 0x1p-10f, -3.0e-39f, 0.1f, 123.456f}) {
    const uint32_t u = std::bit_cast<uint32_t>(x);
    int64_t up = 0;
    for (uint32_t r = 0; r < 65536; ++r) up += ag::stochastic::bfloat16_bits(u, r) != (u >> 16);
    EXPECT_EQ(up, static_cast<int64_t>(u & 0xffffu)) << x;
  }
}

// The Weyl counter steps by addition within a 2^32-aligned block of indices (the CPU's fast path)
// and not across one (where it takes the general path).
TEST(StochasticRounding, TheWeylCounterStepsByAdditionWithinA32BitBlock) {
  namespace st = ag::stochastic;
  for (const uint64_t key : {uint64_t{5}, uint64_t{0xfedcba9876543210ull}}) {
    const uint64_t base = uint64_t{3} << 32;
    EXPECT_EQ(st::weyl_counter(key, base + 10) + 7 * st::kWeylStep, st::weyl_counter(key, base + 17));
    EXPECT_EQ(st::weyl_counter(key, base - 3) + 2 * st::kWeylStep, st::weyl_counter(key, base - 1));
    EXPECT_NE(st::weyl_counter(key, base - 1) + st::kWeylStep, st::weyl_counter(key, base));
    EXPECT_EQ(st::random_bits(key, base + 17), st::finalise(st::weyl_counter(key, base + 17)));
  }
}

// Consecutive elements' random bits are uniform in their low bits (which bfloat16 uses) and high
// bits alike: each of 256 buckets within 6 standard deviations of its share.
TEST(StochasticRounding, RandomBitsOfConsecutiveElementsAreUniform) {
  constexpr int64_t kCount = int64_t{1} << 20;
  for (const uint64_t key : {uint64_t{0}, uint64_t{0x123456789abcdefull}}) {
    std::vector<int64_t> low(256), high(256), middle(256);
    for (int64_t i = 0; i < kCount; ++i) {
      const uint32_t r = ag::stochastic::random_bits(key, static_cast<uint64_t>(i) + (uint64_t{1} << 32) - 7);
      ++low[r & 0xff];
      ++middle[(r >> 12) & 0xff];
      ++high[r >> 24];
    }
    const double expected = kCount / 256.0, sd = std::sqrt(expected);
    for (int b = 0; b < 256; ++b) {
      for (const auto* counts : {&low, &middle, &high}) {
        ASSERT_NEAR(static_cast<double>((*counts)[b]), expected, 6 * sd) << "bucket " << b << " key " << key;
      }
    }
  }
}

// The mean of many roundings of a value is the value, within the sampling error; round to
// nearest is off by up to half a spacing every time.
TEST(StochasticRounding, IsUnbiased) {
  const int64_t n = 200000;
  for (const float x : {1.0f + 0x1p-10f, 0.3f, -2.7e-6f, 1000.1f}) {
    double sum_bf16 = 0, sum_fp16 = 0;
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t random = ag::stochastic::random_bits(99, static_cast<uint64_t>(i));
      const uint32_t u = std::bit_cast<uint32_t>(x);
      sum_bf16 += ag::bfloat16_to_float(ag::BFloat16{ag::stochastic::bfloat16_bits(u, random)});
      sum_fp16 += ag::half_to_float(ag::Half{ag::stochastic::float16_bits(u, random)});
    }
    // One rounding's standard deviation is at most half the spacing; allow 5 standard errors.
    const double bf16_spacing = std::ldexp(1.0, std::ilogb(x) - 7), fp16_spacing = std::ldexp(1.0, std::max(std::ilogb(x), -14) - 10);
    EXPECT_NEAR(sum_bf16 / n, x, 5 * 0.5 * bf16_spacing / std::sqrt(double(n))) << x;
    EXPECT_NEAR(sum_fp16 / n, x, 5 * 0.5 * fp16_spacing / std::sqrt(double(n))) << x;
  }
}

Tensor parameter(int64_t n, double value, DType dtype) {
  Tensor p = ag::full({n}, value, dtype);
  p.set_requires_grad(true);
  return p;
}

// SGD(lr) on sum(p): every step subtracts lr from every weight.
void descend(ag::optim::Optimizer& opt, Tensor& p, int steps) {
  for (int i = 0; i < steps; ++i) {
    opt.zero_grad();
    ag::ops::sum(p).backward();
    opt.step();
  }
}

// A weight of 1 updated by -1e-4 500 times: below half BF16's spacing (2^-9 just below 1), so
// round to nearest never moves it; stochastic rounding moves it by the full 0.05 on average.
TEST(StochasticRoundingOptimizer, SmallUpdatesAccumulateOnAverageWithoutAMaster) {
  const int64_t n = 8192;
  const auto train = [&](MasterWeights mode) {
    Tensor p = parameter(n, 1.0, DType::kBFloat16);
    ag::optim::SGD sgd({p}, {.lr = 1e-4});
    sgd.set_master_weights(mode);
    descend(sgd, p, 500);
    EXPECT_EQ(p.dtype(), DType::kBFloat16);
    double mean = 0;
    for (float v : p.to_vector()) mean += v;
    return std::pair{p, mean / static_cast<double>(n)};
  };
  EXPECT_EQ(train(MasterWeights::kNone).second, 1.0) << "round to nearest loses every update";
  const auto [p, mean] = train(MasterWeights::kStochasticRounding);
  EXPECT_FALSE(p.master().defined()) << "no master is kept";
  // Each weight is a sum of 500 unbiased roundings of spacing <= 2^-8: its standard deviation is
  // at most 2^-9 sqrt(500) ~ 0.044, the mean's over 8192 weights ~ 5e-4.
  EXPECT_NEAR(mean, 1.0 - 500 * 1e-4, 2.5e-3);
}

// The documented bits: weight i of parameter k at its t-th update rounds with
// stochastic::random_bits(counter_random_bits(counter_random_bits(seed, k), t), i), whatever the
// chunking (the parameter spans several CPU chunks and threads).
TEST(StochasticRoundingOptimizer, RoundsWithTheDocumentedKeyOnAnyChunking) {
  const int64_t n = 3 * ag::multi_tensor::kCpuChunkElements + 17;
  for (const DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    Tensor other = parameter(5, 1.0, DType::kFloat32);
    Tensor p = ag::randn({n}, dtype);
    p.set_requires_grad(true);
    // A power-of-two lr and decay: both products are exact, so the FP32 update rounds the same
    // with or without fused multiply-adds.
    ag::optim::SGD sgd({other, p}, {.lr = 0x1p-8, .weight_decay = 0.5});
    sgd.set_rounding_seed(0x1234);  // kept by the switch below, not redrawn
    sgd.set_master_weights(MasterWeights::kStochasticRounding);
    ASSERT_EQ(sgd.rounding_seed(), 0x1234u);
    for (int t = 0; t < 3; ++t) {
      const std::vector<float> before = p.to_vector();
      sgd.zero_grad();
      ag::ops::sum(p * 2.0).backward();
      sgd.step();
      const std::vector<float> after = p.to_vector();
      const uint64_t key = ag::counter_random_bits(ag::counter_random_bits(0x1234, 1), static_cast<uint64_t>(t));
      for (int64_t i = 0; i < n; ++i) {
        const float updated = before[i] - 0x1p-8f * (2.0f + 0.5f * before[i]);
        const uint32_t bits = std::bit_cast<uint32_t>(updated);
        const uint32_t random = ag::stochastic::random_bits(key, static_cast<uint64_t>(i));
        const float expected = dtype == DType::kBFloat16
                                   ? ag::bfloat16_to_float(ag::BFloat16{ag::stochastic::bfloat16_bits(bits, random)})
                                   : ag::half_to_float(ag::Half{ag::stochastic::float16_bits(bits, random)});
        ASSERT_EQ(after[i], expected) << dtype << " step " << t << " element " << i;
      }
    }
  }
}

// The update kernels on 16-bit weights without a master: each weight gets the float update the
// FP32-weight path computes from the widened weight, rounded with the documented bits
// (random_bits(key, i)). Bfloat16 weights take the fused one-pass loops (AVX-512 or AVX2, as
// AMPGRAD_CPU_ISA allows: stochastic_rounding_avx2_test runs this file at AVX2), float16 weights
// the block path; gradients 16-bit or float32 (GradScaler's unscaled ones); over several chunks.
TEST(StochasticRoundingKernels, RoundTheFloatUpdateWithTheDocumentedBits) {
  namespace k = ag::optim::kernels;
  const int64_t n = 3 * ag::multi_tensor::kCpuChunkElements + 29;
  const uint64_t key = 0x5eed5eed12345678u;
  const auto expect_rounded = [&](const Tensor& weights, const std::vector<float>& updated, const std::string& what) {
    const std::vector<float> got = weights.to_vector();
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t bits = std::bit_cast<uint32_t>(updated[i]);
      const uint32_t random = ag::stochastic::random_bits(key, static_cast<uint64_t>(i));
      const float expected = weights.dtype() == DType::kBFloat16
                                 ? ag::bfloat16_to_float(ag::BFloat16{ag::stochastic::bfloat16_bits(bits, random)})
                                 : ag::half_to_float(ag::Half{ag::stochastic::float16_bits(bits, random)});
      ASSERT_EQ(got[i], expected) << what << ", element " << i << " of " << n;
    }
  };
  const auto state = [&](double scale) { return (ag::rand({n}, DType::kFloat32) * scale).detach(); };
  const auto copy_of = [](const Tensor& t) { return t.to(DType::kFloat64).to(t.dtype()); };  // exact
  for (const DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (const DType grad_dtype : {dtype, DType::kFloat32}) {
      const std::string what = std::string(ag::dtype_name(dtype)) + " weights, " + std::string(ag::dtype_name(grad_dtype)) + " gradient";
      const Tensor w16 = ag::randn({n}, dtype);
      const Tensor grad = (ag::randn({n}, DType::kFloat32) * 1e-2).to(grad_dtype);
      for (const bool adamw : {false, true}) {
        const Tensor m = state(1e-2), v = state(1e-4);
        k::AdamScalars s{.step_size = 1e-3f, .bc2_sqrt = 0.3f, .eps = 1e-8f};
        (adamw ? s.decoupled : s.l2) = adamw ? 1 - 1e-3f * 0.1f : 0.01f;
        s.rounding_key = key;
        const Tensor w = copy_of(w16), wf = w16.to(DType::kFloat32), m16 = copy_of(m), v16 = copy_of(v);
        k::adam_update(ag::Device::kCPU, k::AdamLists{{{w}, {grad}, {m16}, {v16}, {Tensor()}}}, {s});
        k::adam_update(ag::Device::kCPU, k::AdamLists{{{wf}, {grad}, {m}, {v}, {Tensor()}}}, {s});
        expect_rounded(w, wf.to_vector(), what + (adamw ? ", AdamW" : ", Adam"));
        EXPECT_EQ(m16.to_vector(), m.to_vector()) << what;
        EXPECT_EQ(v16.to_vector(), v.to_vector()) << what;
      }
      for (const bool momentum : {false, true}) {
        const Tensor buffer = momentum ? state(1e-2) : Tensor();
        const k::SgdScalars s{.lr = 0.1f, .weight_decay = 0.01f, .momentum = momentum ? 0.9f : 0.0f,
                              .nesterov = true, .rounding_key = key};
        const Tensor w = copy_of(w16), wf = w16.to(DType::kFloat32);
        const Tensor buffer16 = momentum ? copy_of(buffer) : Tensor();
        k::sgd_update(ag::Device::kCPU, k::SgdLists{{{w}, {grad}, {buffer16}, {Tensor()}}}, {s});
        k::sgd_update(ag::Device::kCPU, k::SgdLists{{{wf}, {grad}, {buffer}, {Tensor()}}}, {s});
        expect_rounded(w, wf.to_vector(), what + (momentum ? ", SGD with momentum" : ", SGD"));
        if (momentum) {
          EXPECT_EQ(buffer16.to_vector(), buffer.to_vector()) << what;
        }
      }
    }
  }
}

// kFp32 -> kStochasticRounding -> kFp32: the masters go and come back, remade from the parameters.
TEST(StochasticRoundingOptimizer, SwitchingModesRemakesTheMasters) {
  Tensor p = parameter(64, 1.0, DType::kBFloat16);
  ag::optim::SGD sgd({p}, {.lr = 1e-3});
  ASSERT_TRUE(p.master().defined());
  sgd.set_master_weights(MasterWeights::kStochasticRounding);
  EXPECT_FALSE(p.master().defined());
  descend(sgd, p, 3);
  EXPECT_FALSE(p.master().defined());
  EXPECT_EQ(sgd.Optimizer::state()[0].counters.at("rounding_step"), 3);
  sgd.Optimizer::master_of(0);  // a step-only copy for the caller ...
  sgd.zero_grad();
  sgd.step();  // ... which a step without a gradient does not keep either
  EXPECT_FALSE(p.master().defined());
  sgd.set_master_weights(MasterWeights::kFp32);
  descend(sgd, p, 1);
  ASSERT_TRUE(p.master().defined());
  const std::vector<float> weights = p.to_vector(), master = p.master().to_vector();
  for (size_t i = 0; i < weights.size(); ++i) {
    EXPECT_EQ(weights[i], ag::bfloat16_to_float(ag::float_to_bfloat16(master[i]))) << i;
  }
}

ag::nn::Sequential small_model() {
  return ag::nn::Sequential{ag::nn::Linear(8, 32), ag::nn::ReLU(), ag::nn::Linear(32, 1)};
}

// Adam over a BF16 model: the same seed gives the same bits; another rounding seed other bits.
std::vector<float> train_bf16(uint64_t seed, const ag::amp_testing::Regression& data, int steps,
                              std::optional<uint64_t> rounding_seed = std::nullopt) {
  ag::manual_seed(seed);
  ag::nn::Sequential model = small_model();
  model.to(DType::kBFloat16);
  ag::optim::Adam adam(model.parameters(), {.lr = 3e-3});
  adam.set_master_weights(MasterWeights::kStochasticRounding);
  if (rounding_seed) adam.set_rounding_seed(*rounding_seed);
  const Tensor x = data.x.to(DType::kBFloat16), y = data.y.to(DType::kBFloat16);
  for (int step = 0; step < steps; ++step) {
    adam.zero_grad();
    ag::ops::mse_loss(model(x), y).backward();
    adam.step();
  }
  std::vector<float> out;
  for (const Tensor& p : model.parameters()) {
    const std::vector<float> v = p.to_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

TEST(StochasticRoundingOptimizer, RunsRepeatBitForBitAndTheSeedMatters) {
  const ag::amp_testing::Regression data = ag::amp_testing::make_regression(3, 64, 8, 0.05);
  const std::vector<float> a = train_bf16(5, data, 20), b = train_bf16(5, data, 20);
  EXPECT_EQ(a, b);
  EXPECT_NE(train_bf16(5, data, 20, 77), a) << "the rounding seed keys the bits";
  EXPECT_EQ(train_bf16(5, data, 20, 77), train_bf16(5, data, 20, 77));
}

// BF16 parameters without masters reach the loss that FP32 masters reach (Zamirai et al.), where
// round to nearest without masters stalls.
TEST(StochasticRoundingOptimizer, Bf16TrainingMatchesFp32Masters) {
  const ag::amp_testing::Regression data = ag::amp_testing::make_regression(51, 128, 8, 0.05);
  const auto train = [&](MasterWeights mode) {
    ag::manual_seed(50);
    ag::nn::Sequential model = small_model();
    model.to(DType::kBFloat16);
    const Tensor x = data.x.to(DType::kBFloat16), y = data.y.to(DType::kBFloat16);
    ag::optim::Adam adam(model.parameters(), {.lr = 1e-3});
    adam.set_master_weights(mode);
    for (int step = 0; step < 1500; ++step) {
      adam.zero_grad();
      ag::ops::mse_loss(model(x), y).backward();
      adam.step();
    }
    return ag::amp_testing::eval_loss(model, data);
  };
  const double masters = train(MasterWeights::kFp32), stochastic = train(MasterWeights::kStochasticRounding);
  const double nearest = train(MasterWeights::kNone);
  EXPECT_NEAR(stochastic, masters, 0.15 * masters + 1e-3);
  EXPECT_GT(nearest, 1.5 * stochastic) << "round to nearest without masters must stall here for the test to mean anything";
  std::printf("loss: fp32 masters %.5f, stochastic rounding %.5f, round to nearest %.5f\n", masters, stochastic, nearest);
}

// FP16 parameters with a GradScaler: the unscaled FP32 gradients ride on step-only masters, which
// the step drops; a skipped step leaves the weights and the rounding counts as they were.
TEST(StochasticRoundingOptimizer, Fp16WithAGradScalerKeepsNoMaster) {
  ag::manual_seed(8);
  ag::nn::Sequential model = small_model();
  model.to(DType::kFloat16);
  const ag::amp_testing::Regression data = ag::amp_testing::make_regression(9, 64, 8, 0.05);
  const Tensor x = data.x.to(DType::kFloat16), y = data.y.to(DType::kFloat16);
  ag::optim::Adam adam(model.parameters(), {.lr = 1e-3});
  adam.set_master_weights(MasterWeights::kStochasticRounding);
  ag::amp::GradScaler scaler;
  const double initial = ag::amp_testing::eval_loss(model, data);
  int64_t stepped = 0;
  for (int step = 0; step < 300; ++step) {
    adam.zero_grad();
    scaler.scale(ag::ops::mse_loss(model(x), y)).backward();
    stepped += scaler.step(adam);
    scaler.update();
    for (const Tensor& p : model.parameters()) ASSERT_FALSE(p.master().defined()) << "step " << step;
  }
  EXPECT_GT(stepped, 250);
  EXPECT_EQ(adam.Optimizer::state()[0].counters.at("rounding_step"), stepped);
  EXPECT_LT(ag::amp_testing::eval_loss(model, data), 0.5 * initial);
}

// A checkpoint holds the seed and the counts: the resumed run repeats the uninterrupted one.
TEST(StochasticRoundingOptimizer, CheckpointResumeIsBitExact) {
  const ag::amp_testing::Regression data = ag::amp_testing::make_regression(4, 64, 8, 0.05);
  const Tensor x = data.x.to(DType::kBFloat16), y = data.y.to(DType::kBFloat16);
  const std::string path = (std::filesystem::path(::testing::TempDir()) / "sr.safetensors").string();
  const auto steps = [&](ag::nn::Module& model, ag::optim::Optimizer& opt, int n) {
    for (int i = 0; i < n; ++i) {
      opt.zero_grad();
      ag::ops::mse_loss(model(x), y).backward();
      opt.step();
    }
  };
  const auto weights = [](ag::nn::Module& model) {
    std::vector<float> out;
    for (const Tensor& p : model.parameters()) {
      const std::vector<float> v = p.to_vector();
      out.insert(out.end(), v.begin(), v.end());
    }
    return out;
  };
  ag::manual_seed(10);
  ag::nn::Sequential model = small_model();
  model.to(DType::kBFloat16);
  ag::optim::Adam adam(model.parameters(), {.lr = 3e-3});
  adam.set_master_weights(MasterWeights::kStochasticRounding);
  adam.set_rounding_seed(0xfedcba9876543210ull);  // the top bit set: stored as a negative int64
  steps(model, adam, 7);
  ag::checkpoint::save_checkpoint(path, {.model = &model, .optimizer = &adam});
  steps(model, adam, 6);
  const std::vector<float> uninterrupted = weights(model);

  ag::manual_seed(11);  // another init and another drawn seed: the checkpoint must restore both
  ag::nn::Sequential resumed = small_model();
  resumed.to(DType::kBFloat16);
  ag::optim::Adam adam2(resumed.parameters(), {.lr = 3e-3});
  adam2.set_master_weights(MasterWeights::kStochasticRounding);
  ag::checkpoint::TrainingState state{.model = &resumed, .optimizer = &adam2};
  ag::checkpoint::load_checkpoint(path, state);
  EXPECT_EQ(adam2.rounding_seed(), adam.rounding_seed());
  steps(resumed, adam2, 6);
  EXPECT_EQ(weights(resumed), uninterrupted);
}

}  // namespace
