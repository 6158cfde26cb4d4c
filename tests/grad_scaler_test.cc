// GradScaler's schedule step by step against DESIGN.md's update rule, its state machine's errors,
// option validation, the disabled pass-through, checkpoint round trips and the found-inf hook.
// (Skipped steps, clipping and fault injection on real models: grad_scaler_training_test.cc; the
// float32 range of the scale, steps without gradients and loading `enabled`: grad_scaler_edges_test.cc.)
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "amp/autocast.h"
#include "amp/found_inf_sync.h"
#include "amp/grad_scaler.h"
#include "amp/unscale.h"
#include "amp_test_util.h"
#include "framework/allocator.h"
#include "framework/autograd.h"
#include "framework/device.h"
#include "framework/dtype.h"
#include "framework/error.h"
#include "framework/parallel.h"
#include "framework/random.h"
#include "framework/tensor.h"
#include "nn/module.h"
#include "nn/utils.h"
#include "ops/ops.h"
#include "optim/adam.h"
#include "optim/optimizer.h"
#include "optim/sgd.h"

namespace ag = ampgrad;
using ag::Tensor;
using ag::amp::GradScaler;
using ag::amp::GradScalerOptions;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// A one-parameter problem whose (already scaled) gradient the test chooses directly.
Tensor parameter(std::vector<float> values) {
  Tensor p = Tensor::from_vector(values, {static_cast<int64_t>(values.size())});
  p.set_requires_grad(true);
  return p;
}

struct Toy {
  Toy() : p(parameter({1, 1})), opt({p}, {.lr = 0.5}) {}

  /// One iteration: scale(loss), a scaled gradient of `g` everywhere, step, update.
  bool iterate(GradScaler& scaler, float g) {
    opt.zero_grad();
    scaler.scale(ag::ops::sum(p));
    p.set_grad(ag::full({2}, g));
    const bool stepped = scaler.step(opt);
    scaler.update();
    return stepped;
  }

  Tensor p;
  ag::optim::SGD opt;
};

struct Expected {
  float grad;
  bool stepped;
  double scale;
  int64_t tracker;
};

void run_schedule(GradScaler& scaler, const std::vector<Expected>& steps) {
  Toy toy;
  for (size_t i = 0; i < steps.size(); ++i) {
    const float before = toy.p.to_vector()[0];
    const double scale_before = scaler.get_scale();
    EXPECT_EQ(toy.iterate(scaler, steps[i].grad), steps[i].stepped) << "iteration " << i;
    EXPECT_EQ(scaler.get_scale(), steps[i].scale) << "iteration " << i;
    EXPECT_EQ(scaler.growth_tracker(), steps[i].tracker) << "iteration " << i;
    const float expected_p = steps[i].stepped ? before - 0.5f * static_cast<float>(steps[i].grad / scale_before) : before;
    EXPECT_FLOAT_EQ(toy.p.to_vector()[0], expected_p) << "iteration " << i;
  }
}

TEST(GradScalerSchedule, BacksOffOnInfAndNaNAndGrowsAfterExactlyGrowthIntervalCleanSteps) {
  GradScaler scaler({.init_scale = 1024, .growth_factor = 2, .backoff_factor = 0.5, .growth_interval = 3});
  EXPECT_EQ(scaler.get_scale(), 1024.0);
  run_schedule(scaler, {
                           {1, true, 1024, 1},
                           {1, true, 1024, 2},
                           {1, true, 2048, 0},  // the third clean step grows and resets the tracker
                           {kInf, false, 1024, 0},
                           {1, true, 1024, 1},
                           {1, true, 1024, 2},
                           {kNaN, false, 512, 0},  // NaN backs off too, and resets the tracker at 2
                           {-kInf, false, 256, 0},
                           {1, true, 256, 1},
                           {1, true, 256, 2},
                           {1, true, 512, 0},
                           {1, true, 512, 1},
                       });
}

TEST(GradScalerSchedule, OtherFactorsFollowTheSameRule) {
  GradScaler scaler({.init_scale = 100, .growth_factor = 3, .backoff_factor = 0.25, .growth_interval = 1});
  run_schedule(scaler, {{1, true, 300, 0}, {1, true, 900, 0}, {kNaN, false, 225, 0}, {1, true, 675, 0}});
}

TEST(GradScalerSchedule, MinAndMaxScaleBoundTheSchedule) {
  GradScaler scaler({.init_scale = 1024, .growth_interval = 1, .min_scale = 256, .max_scale = 4096});
  run_schedule(scaler, {
                           {1, true, 2048, 0},
                           {1, true, 4096, 0},
                           {1, true, 4096, 0},  // at max_scale
                           {kInf, false, 2048, 0},
                           {kInf, false, 1024, 0},
                           {kInf, false, 512, 0},
                           {kInf, false, 256, 0},
                           {kNaN, false, 256, 0},  // at min_scale
                           {1, true, 512, 0},
                       });
  scaler.update(1e9);
  EXPECT_EQ(scaler.get_scale(), 4096.0);
  scaler.update(1.0);
  EXPECT_EQ(scaler.get_scale(), 256.0);
}

TEST(GradScalerSchedule, WarnsOnceWhenTheScaleFallsBelowOne) {
  GradScaler scaler({.init_scale = 2, .growth_interval = 100});
  Toy toy;
  testing::internal::CaptureStderr();
  EXPECT_FALSE(toy.iterate(scaler, kInf));  // 1: not below one yet
  const std::string at_one = testing::internal::GetCapturedStderr();
  EXPECT_EQ(at_one, "");
  testing::internal::CaptureStderr();
  EXPECT_FALSE(toy.iterate(scaler, kInf));  // 0.5
  EXPECT_FALSE(toy.iterate(scaler, kInf));  // 0.25
  const std::string below = testing::internal::GetCapturedStderr();
  EXPECT_EQ(scaler.get_scale(), 0.25);
  EXPECT_NE(below.find("below 1"), std::string::npos) << below;
  EXPECT_EQ(below.find("below 1"), below.rfind("below 1")) << "warned more than once: " << below;
}

TEST(GradScalerSchedule, UpdateWithANewScaleSetsItAndStartsTheNextIteration) {
  GradScaler scaler({.init_scale = 1024, .growth_interval = 3});
  Toy toy;
  EXPECT_TRUE(toy.iterate(scaler, 1.0f));
  toy.opt.zero_grad();
  scaler.scale(ag::ops::sum(toy.p));
  toy.p.set_grad(ag::full({2}, 1.0));
  EXPECT_TRUE(scaler.step(toy.opt));
  scaler.update(10.0);
  EXPECT_EQ(scaler.get_scale(), 10.0);
  EXPECT_TRUE(toy.iterate(scaler, 1.0f));  // a fresh iteration: no "step twice" error
  EXPECT_EQ(scaler.get_scale(), 10.0);
  for (double bad : {0.0, -1.0, static_cast<double>(kInf), static_cast<double>(kNaN)}) {
    EXPECT_ERROR([&] { scaler.update(bad); }, "new_scale");
  }
}

TEST(GradScalerStateMachine, MisuseThrowsClearErrors) {
  Toy toy;
  GradScaler fresh;
  EXPECT_ERROR([&] { fresh.update(); }, "scale() was not called");
  EXPECT_ERROR([&] { fresh.step(toy.opt); }, "scale() was not called");
  EXPECT_ERROR([&] { fresh.unscale_(toy.opt); }, "scale() was not called");

  GradScaler scaler;
  scaler.scale(ag::ops::sum(toy.p)).backward();
  EXPECT_ERROR([&] { scaler.update(); }, "step(opt)");  // update with no step
  scaler.unscale_(toy.opt);
  EXPECT_ERROR([&] { scaler.unscale_(toy.opt); }, "unscale_() was already called");
  EXPECT_TRUE(scaler.step(toy.opt));  // step after an explicit unscale_ does not unscale again
  EXPECT_FLOAT_EQ(toy.p.to_vector()[0], 0.5f);
  EXPECT_ERROR([&] { scaler.step(toy.opt); }, "step() was already called");
  EXPECT_ERROR([&] { scaler.unscale_(toy.opt); }, "after step()");
  scaler.update();  // the errors left the scaler usable
  EXPECT_EQ(scaler.growth_tracker(), 1);
  EXPECT_TRUE(toy.iterate(scaler, 1.0f));
}

// A backward between unscale_ and step adds scaled gradients to unscaled ones (FP32 parameters) or
// is dropped (FP16 ones, whose master already holds the unscaled gradient): step() refuses both,
// stepping nothing. Work on gradients that is not a backward (clipping) stays allowed.
TEST(GradScalerStateMachine, BackwardBetweenUnscaleAndStepThrows) {
  Tensor p32 = parameter({1, 2});
  Tensor p16 = Tensor::from_vector(std::vector<float>{3, 4}, {2}, ag::DType::kFloat16);
  p16.set_requires_grad(true);
  ag::optim::SGD opt({p32, p16}, {.lr = 0.5});
  const auto loss = [&] { return ag::ops::sum(p32) + ag::ops::sum(p16.to(ag::DType::kFloat32)); };
  GradScaler scaler({.init_scale = 4});
  scaler.scale(loss()).backward();
  scaler.unscale_(opt);
  scaler.scale(loss()).backward();
  EXPECT_ERROR([&] { scaler.step(opt); }, "GradScaler::step", "after unscale_()", "param0", "hint");
  EXPECT_EQ(p32.to_vector(), (std::vector<float>{1, 2}));
  EXPECT_EQ(p16.to_vector(), (std::vector<float>{3, 4}));

  // Only the FP16 parameter gets a new gradient: caught as well.
  GradScaler second({.init_scale = 4});
  opt.zero_grad();
  second.scale(loss()).backward();
  second.unscale_(opt);
  second.scale(ag::ops::sum(p16.to(ag::DType::kFloat32))).backward();
  EXPECT_ERROR([&] { second.step(opt); }, "after unscale_()", "param1");

  // Accumulating before unscale_, and clipping after it, are the intended use: they step.
  GradScaler third({.init_scale = 4});
  opt.zero_grad();
  third.scale(loss()).backward();
  third.scale(loss()).backward();
  third.unscale_(opt);
  ag::nn::utils::clip_grad_norm_(opt.parameters(), 1e9);
  EXPECT_TRUE(third.step(opt));
  EXPECT_EQ(p32.to_vector(), (std::vector<float>{0, 1}));  // gradient 2 (two backwards), lr 0.5
  EXPECT_EQ(p16.to_vector(), (std::vector<float>{2, 3}));
}

TEST(GradScalerStateMachine, EachOptimizerHasItsOwnStateAndAnyInfBacksOff) {
  Tensor a = parameter({1}), b = parameter({1});
  ag::optim::SGD opt_a({a}, {.lr = 1.0}), opt_b({b}, {.lr = 1.0});
  GradScaler scaler({.init_scale = 8});
  scaler.scale(ag::ops::sum(a) + ag::ops::sum(b)).backward();
  b.set_grad(ag::full({1}, kInf));
  scaler.unscale_(opt_a);
  scaler.unscale_(opt_b);  // not "twice": a different optimizer
  EXPECT_TRUE(scaler.step(opt_a));
  EXPECT_FALSE(scaler.step(opt_b));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 4.0);
  EXPECT_EQ(a.to_vector()[0], 0.0f);
  EXPECT_EQ(b.to_vector()[0], 1.0f);
}

TEST(GradScalerFoundInfSync, TheHookDecidesForEveryOptimizerOncePerUnscale) {
  // A hook standing in for other ranks: it sees each local flag and may report another rank's inf.
  std::vector<bool> seen;
  bool other_rank_found_inf = false;
  ag::amp::set_found_inf_sync([&](bool local) {
    seen.push_back(local);
    return local || other_rank_found_inf;
  });
  Toy toy;
  GradScaler scaler({.init_scale = 8, .growth_interval = 100});
  EXPECT_TRUE(toy.iterate(scaler, 1.0f));  // clean here and elsewhere: steps
  other_rank_found_inf = true;
  EXPECT_FALSE(toy.iterate(scaler, 1.0f));  // clean here, inf elsewhere: skips and backs off too
  EXPECT_EQ(scaler.get_scale(), 4.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  EXPECT_FLOAT_EQ(toy.p.to_vector()[0], 1.0f - 0.5f / 8.0f);  // only the first step moved it
  EXPECT_EQ(seen, (std::vector<bool>{false, false}));
  // Explicit unscale_ then step: still one call; a disabled scaler makes none.
  other_rank_found_inf = false;
  scaler.scale(ag::ops::sum(toy.p));
  toy.p.set_grad(ag::full({2}, kInf));
  scaler.unscale_(toy.opt);
  EXPECT_FALSE(scaler.step(toy.opt));
  scaler.update();
  GradScaler disabled({.enabled = false});
  toy.iterate(disabled, 1.0f);
  EXPECT_EQ(seen, (std::vector<bool>{false, false, true}));
  ag::amp::set_found_inf_sync({});  // the default again: each process decides alone
  EXPECT_TRUE(toy.iterate(scaler, 1.0f));
  EXPECT_EQ(seen.size(), 3u);
}

TEST(GradScalerOptionsTest, InvalidOptionsAreRejected) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  const std::vector<std::pair<GradScalerOptions, const char*>> bad = {
      {{.growth_factor = 1.0}, "growth_factor"},   {{.growth_factor = 0.5}, "growth_factor"},
      {{.growth_factor = inf}, "growth_factor"},   {{.growth_factor = nan}, "growth_factor"},
      {{.backoff_factor = 0.0}, "backoff_factor"}, {{.backoff_factor = 1.0}, "backoff_factor"},
      {{.backoff_factor = 1.5}, "backoff_factor"}, {{.backoff_factor = -0.5}, "backoff_factor"},
      {{.backoff_factor = nan}, "backoff_factor"}, {{.growth_interval = 0}, "growth_interval"},
      {{.growth_interval = -3}, "growth_interval"}, {{.init_scale = inf}, "init_scale"},
      {{.init_scale = 0.0}, "init_scale"},         {{.init_scale = -2.0}, "init_scale"},
      {{.init_scale = nan}, "init_scale"},         {{.min_scale = -1.0}, "min_scale"},
      {{.init_scale = 8, .min_scale = 4, .max_scale = 2}, "min_scale"},
      {{.max_scale = nan}, "max_scale"},
      // The scale never leaves [min_scale, max_scale], so it cannot start outside it either.
      {{.init_scale = 65536, .max_scale = 1024}, "init_scale"},
      {{.init_scale = 1, .min_scale = 16}, "init_scale"},
  };
  for (const auto& [options, field] : bad) {
    SCOPED_TRACE(field);
    EXPECT_ERROR([&] { GradScaler scaler(options); }, field);
  }
  EXPECT_NO_THROW(GradScaler({.init_scale = 1e-3, .growth_factor = 1.0001, .backoff_factor = 0.999,
                              .growth_interval = 1, .min_scale = 1e-3, .max_scale = 1e-3}));
}

TEST(GradScalerDisabled, EveryCallIsAPassThrough) {
  GradScaler scaler({.init_scale = 1024, .enabled = false});
  EXPECT_FALSE(scaler.is_enabled());
  EXPECT_EQ(scaler.get_scale(), 1.0);
  scaler.update();  // no error even before scale()
  Toy toy;
  const Tensor loss = ag::ops::sum(toy.p * toy.p);
  const Tensor scaled = scaler.scale(loss);
  EXPECT_TRUE(scaled.is_same(loss));
  scaled.backward();
  scaler.unscale_(toy.opt);
  EXPECT_EQ(toy.p.grad().to_vector(), (std::vector<float>{2, 2}));  // not divided by anything
  EXPECT_TRUE(scaler.step(toy.opt));
  EXPECT_EQ(toy.p.to_vector(), (std::vector<float>{0, 0}));  // plain SGD: 1 - 0.5 * 2
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 1.0);
}

TEST(GradScalerCheckpoint, StateRoundTripResumesTheScheduleIdentically) {
  const GradScalerOptions options{.init_scale = 512, .growth_factor = 4, .backoff_factor = 0.125,
                                  .growth_interval = 3, .min_scale = 1, .max_scale = 1e6};
  const std::vector<float> grads = {1, 1, kInf, 1, 1, 1, 1, 1, kNaN, 1, 1, 1, 1, 1, 1, 1, kInf, 1, 1, 1};
  GradScaler original(options);
  Toy toy_a, toy_b;
  for (size_t i = 0; i < 5; ++i) toy_a.iterate(original, grads[i]);
  const ag::amp::GradScalerState saved = original.state();
  EXPECT_EQ(saved.scale, original.get_scale());
  EXPECT_EQ(saved.growth_tracker, 2);

  GradScaler resumed({.init_scale = 7, .growth_interval = 50});
  resumed.load_state(saved);
  EXPECT_EQ(resumed.options().growth_interval, 3);
  EXPECT_EQ(resumed.options().max_scale, 1e6);
  for (size_t i = 5; i < grads.size(); ++i) {
    EXPECT_EQ(toy_a.iterate(original, grads[i]), toy_b.iterate(resumed, grads[i])) << i;
    EXPECT_EQ(resumed.get_scale(), original.get_scale()) << i;
    EXPECT_EQ(resumed.growth_tracker(), original.growth_tracker()) << i;
  }

  ag::amp::GradScalerState bad = saved;
  bad.growth_tracker = 3;
  EXPECT_ERROR([&] { resumed.load_state(bad); }, "growth_tracker");
  bad = saved;
  bad.scale = std::numeric_limits<double>::infinity();
  EXPECT_ERROR([&] { resumed.load_state(bad); }, "scale");
  bad = saved;
  bad.scale = 2e6;  // above max_scale
  EXPECT_ERROR([&] { resumed.load_state(bad); }, "scale");
  bad = saved;
  bad.options.backoff_factor = 2;
  EXPECT_ERROR([&] { resumed.load_state(bad); }, "backoff_factor");
}

}  // namespace

namespace {

// The unscale kernel itself: every length class (vector body, tail, FP16 blocks of 2048 and the
// last partial one, pieces spread over threads) and every position of a single inf or NaN is
// found, and values are g / scale rounded once.
TEST(Unscale, FindsOneNonFiniteAnywhereAndScalesExactly) {
  const double nan = std::nan(""), inf = std::numeric_limits<double>::infinity();
  for (const ag::DType dtype : {ag::DType::kFloat32, ag::DType::kFloat16}) {
    for (const int64_t n : {int64_t{1}, int64_t{7}, int64_t{2048}, int64_t{2049}, int64_t{5000}, int64_t{300001}}) {
      std::vector<double> values(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) values[i] = 0.25 * static_cast<double>((i % 97) - 48);
      Tensor out = Tensor::empty({n}, ag::DType::kFloat32);
      const Tensor clean = Tensor::from_vector(values, {n}, dtype);
      EXPECT_FALSE(ag::amp::unscale_and_check(clean, 1.0 / 1024, out)) << n;
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out.data<float>()[i], static_cast<float>(values[i] / 1024)) << i;
      for (const double bad : {inf, -inf, nan}) {
        for (const int64_t at : {int64_t{0}, n / 2, n - 1}) {
          std::vector<double> poisoned = values;
          poisoned[static_cast<size_t>(at)] = bad;
          EXPECT_TRUE(ag::amp::unscale_and_check(Tensor::from_vector(poisoned, {n}, dtype), 1.0 / 1024, out))
              << ag::dtype_name(dtype) << " n " << n << " at " << at << " value " << bad;
        }
      }
    }
  }
}

}  // namespace
