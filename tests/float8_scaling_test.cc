// The FP8 scaling recipes' arithmetic against PyTorch: delayed scaling step by step (Transformer
// Engine's algorithm in float32 tensors, tests/data/make_float8_scaling_reference.py) over 48
// recipes and amaxes that include 0, inf, NaN and reciprocals that overflow; current scaling and
// the scaled saturating cast on tensors of every magnitude.
#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "ampgrad.h"
#include "checkpoint/safetensors.h"
#include "framework/float8_scaling.h"
#include "test_util.h"

namespace ag = ampgrad;
namespace ck = ampgrad::checkpoint;
using ag::DType;
using ag::Float8Recipe;
using ag::Float8ScalingState;
using ag::Tensor;

namespace {

constexpr const char* kReferenceFile = "tests/data/float8_scaling_reference.safetensors";

const Tensor& named(const std::string& name) {
  static const ck::NamedTensors file = ck::load_safetensors(kReferenceFile);
  for (const auto& [n, t] : file.tensors) {
    if (n == name) return t;
  }
  ADD_FAILURE() << "no tensor " << name << " in " << kReferenceFile;
  static const Tensor none;
  return none;
}

// Bit equality that counts every NaN as one value.
bool same_float(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

TEST(Float8Scaling, DelayedScalingMatchesTransformerEnginesAlgorithmStepByStep) {
  const std::vector<int64_t> configs = named("configs").to_vector<int64_t>();
  const std::vector<float> amaxes = named("amaxes").to_vector();
  const std::vector<float> scales = named("scales").to_vector();
  const std::vector<float> histories = named("histories").to_vector();
  const size_t steps = amaxes.size(), num_configs = configs.size() / 5;
  ASSERT_EQ(num_configs, 48u);
  ASSERT_EQ(scales.size(), num_configs * steps);
  for (size_t c = 0; c < num_configs; ++c) {
    const Float8Recipe recipe{.scaling = ag::Float8Scaling::kDelayed,
                              .amax_history_len = static_cast<int>(configs[5 * c]),
                              .margin = static_cast<int>(configs[5 * c + 2]),
                              .amax_compute = configs[5 * c + 1] != 0 ? ag::Float8AmaxCompute::kMostRecent
                                                                      : ag::Float8AmaxCompute::kMax,
                              .power_of_two_scales = configs[5 * c + 3] != 0};
    const DType format = configs[5 * c + 4] == 0 ? DType::kFloat8E4M3 : DType::kFloat8E5M2;
    SCOPED_TRACE("config " + std::to_string(c) + ": length " + std::to_string(recipe.amax_history_len) + ", margin " +
                 std::to_string(recipe.margin) + (recipe.power_of_two_scales ? ", power of two" : "") +
                 (configs[5 * c + 1] != 0 ? ", most recent " : ", max ") + std::string(ag::dtype_name(format)));
    Float8ScalingState state(recipe.amax_history_len);
    int wrong = 0;
    for (size_t s = 0; s < steps; ++s) {
      state.record_amax(amaxes[s]);
      state.update(recipe, format);
      const float want = scales[c * steps + s];
      if (!same_float(state.scale(), want) && ++wrong <= 3) {
        ADD_FAILURE() << "step " << s << " (amax " << amaxes[s] << "): scale " << state.scale() << ", PyTorch " << want;
      }
      for (int i = 0; i < recipe.amax_history_len; ++i) {
        const float h = histories[(c * steps + s) * 16 + static_cast<size_t>(i)];
        if (!same_float(state.amax_history()[static_cast<size_t>(i)], h) && ++wrong <= 3) {
          ADD_FAILURE() << "step " << s << ": history[" << i << "] " << state.amax_history()[static_cast<size_t>(i)]
                        << ", PyTorch " << h;
        }
      }
    }
    EXPECT_EQ(wrong, 0);
  }
}

TEST(Float8Scaling, CurrentScalingAndTheScaledSaturatingCastMatchPyTorch) {
  const Tensor x = named("current.x");
  const int64_t rows = x.size(0), cols = x.size(1);
  const std::vector<float> values = x.to_vector();
  for (const auto& [name, format] : {std::pair{"e4m3", DType::kFloat8E4M3}, std::pair{"e5m2", DType::kFloat8E5M2}}) {
    SCOPED_TRACE(name);
    const std::vector<float> want_scales = named(std::string("current.") + name + ".scale").to_vector();
    const std::vector<int64_t> want_codes = named(std::string("current.") + name + ".codes").to_vector<int64_t>();
    const Float8Recipe recipe{.scaling = ag::Float8Scaling::kCurrent};
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = values.data() + r * cols;
      float amax = 0.0f;
      for (int64_t j = 0; j < cols; ++j) amax = std::max(amax, std::fabs(row[j]));
      Float8ScalingState state;
      state.set_from_amax(amax, recipe, format);
      EXPECT_TRUE(same_float(state.scale(), want_scales[static_cast<size_t>(r)])) << "row " << r << ": " << state.scale();
      std::vector<uint8_t> codes(static_cast<size_t>(cols));
      if (format == DType::kFloat8E4M3) {
        ag::float_to_float8_saturated(row, state.scale(), reinterpret_cast<ag::Float8E4M3*>(codes.data()), codes.size());
      } else {
        ag::float_to_float8_saturated(row, state.scale(), reinterpret_cast<ag::Float8E5M2*>(codes.data()), codes.size());
      }
      int wrong = 0;
      for (int64_t j = 0; j < cols; ++j) wrong += codes[static_cast<size_t>(j)] != want_codes[static_cast<size_t>(r * cols + j)];
      EXPECT_EQ(wrong, 0) << "row " << r << " (amax " << amax << ")";
    }
  }
}

TEST(Float8Scaling, ScaleRulesAtTheEdges) {
  const DType e4m3 = DType::kFloat8E4M3;
  EXPECT_EQ(ag::float8_scale(448.0f, e4m3, 0, false, 7.0f), 1.0f);
  EXPECT_EQ(ag::float8_scale(448.0f, e4m3, 2, false, 7.0f), 0.25f);
  EXPECT_EQ(ag::float8_scale(1.0f, DType::kFloat8E5M2, 0, false, 7.0f), 57344.0f);
  EXPECT_EQ(ag::float8_scale(1.0f, e4m3, 0, true, 7.0f), 256.0f);  // 448 rounded down to a power of two
  for (float kept : {0.0f, INFINITY, -INFINITY, NAN}) EXPECT_EQ(ag::float8_scale(kept, e4m3, 0, false, 7.0f), 7.0f);
  EXPECT_EQ(ag::float8_scale(1e-44f, e4m3, 0, false, 7.0f), FLT_MAX);
  EXPECT_EQ(ag::float8_scale(FLT_MAX, e4m3, 64, false, 7.0f), FLT_MIN);
  EXPECT_EQ(ag::float8_scale(1e-40f, e4m3, 2, false, 7.0f), FLT_MAX / 4);  // the quotient overflows, then the margin
  // A NaN recorded in a step keeps the scale for as long as the window holds it.
  const Float8Recipe recipe{.amax_history_len = 3};
  Float8ScalingState state(3);
  state.record_amax(2.0f);
  state.update(recipe, e4m3);
  EXPECT_EQ(state.scale(), 224.0f);
  state.record_amax(NAN);
  state.record_amax(1.0f);  // a later, finite amax in the same step does not hide the NaN
  state.update(recipe, e4m3);
  EXPECT_EQ(state.scale(), 224.0f);
  for (int s = 0; s < 2; ++s) {
    state.record_amax(4.0f);
    state.update(recipe, e4m3);
    EXPECT_EQ(state.scale(), 224.0f) << s;  // NaN still in the window
  }
  state.record_amax(4.0f);
  state.update(recipe, e4m3);
  EXPECT_EQ(state.scale(), 112.0f);  // NaN left: max(4, 4, 4)
}

TEST(Float8Scaling, BadRecipesAreRefusedByName) {
  EXPECT_ERROR([] { Float8Recipe{.amax_history_len = 0}.validate("Float8Guard"); }, "amax_history_len");
  EXPECT_ERROR([] { Float8Recipe{.margin = -1}.validate("Float8Guard"); }, "margin");
  Float8ScalingState state;
  EXPECT_ERROR([&] { state.restore(0.0f, {1.0f}); }, "scale");
  EXPECT_ERROR([&] { state.restore(1.0f, {}); }, "history");
}

TEST(Float8Scaling, RecipeFormats) {
  EXPECT_EQ(Float8Recipe{}.forward_dtype(), DType::kFloat8E4M3);
  EXPECT_EQ(Float8Recipe{}.backward_dtype(), DType::kFloat8E5M2);
  EXPECT_EQ(Float8Recipe{.format = ag::Float8Format::kE4M3}.backward_dtype(), DType::kFloat8E4M3);
}

// A window resumed at another length keeps history[0] and its newest entries (the last ones).
TEST(Float8Scaling, AResizedWindowKeepsTheNewestAmaxes) {
  const DType e4m3 = DType::kFloat8E4M3;
  Float8ScalingState state;
  state.restore(1.0f, {9.0f, 1.0f, 2.0f, 3.0f, 4.0f});  // 1 the oldest, 4 the newest; 9 this step's
  state.update(Float8Recipe{.amax_history_len = 3}, e4m3);  // keeps 9, 3, 4, then closes the step
  EXPECT_EQ(state.amax_history(), (std::vector<float>{0.0f, 4.0f, 9.0f}));
  EXPECT_EQ(state.scale(), 448.0f / 9.0f);
  state.update(Float8Recipe{.amax_history_len = 5}, e4m3);  // two empty places before the oldest
  EXPECT_EQ(state.amax_history(), (std::vector<float>{0.0f, 0.0f, 4.0f, 9.0f, 0.0f}));
  EXPECT_EQ(state.scale(), 448.0f / 9.0f);
}

}  // namespace
