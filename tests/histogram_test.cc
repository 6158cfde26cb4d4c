// add_histogram's bucketing against PyTorch's: the expected numbers come from
// torch.utils.tensorboard.summary.make_histogram's algorithm run under NumPy 2.4 on the same float32 values.
#include <cmath>
#include <limits>
#include <vector>

#include "tests/test_util.h"
#include "utils/event.h"
#include "utils/histogram.h"

namespace ampgrad::utils {
namespace {

const std::vector<float> kMixed = {-2.5f, -1e-3f, 0.0f, 0.0f, 1e-7f, 0.3f, 0.3f, 7.0f};

TEST(Histogram, TensorflowEdgesArePyTorchsDefaultBins) {
  const std::vector<double>& edges = tensorflow_bin_edges();
  ASSERT_EQ(edges.size(), 1549u);
  EXPECT_EQ(edges[774], 0.0);
  EXPECT_EQ(edges[775], 1e-12);
  EXPECT_EQ(edges[776], 1.1000000000000002e-12);
  EXPECT_EQ(edges[773], -1e-12);
  for (size_t i = 1; i < edges.size(); ++i) ASSERT_LT(edges[i - 1], edges[i]) << i;
  for (size_t i = 0; i < edges.size(); ++i) ASSERT_EQ(edges[i], -edges[edges.size() - 1 - i]) << i;
  EXPECT_LT(edges.back(), 1e20);
  EXPECT_GE(edges.back() * 1.1, 1e20);
}

TEST(Histogram, TensorflowBinsMatchPyTorchOnSmallValues) {
  const Histogram h = make_histogram(std::vector<float>{0.1f, 0.2f, 0.3f});
  EXPECT_EQ(h.bucket_limit, (std::vector<double>{0.09312398815580714, 0.10243638697138786, 0.11268002566852665,
                                                 0.12394802823537933, 0.13634283105891729, 0.14997711416480902,
                                                 0.16497482558128992, 0.18147230813941892, 0.19961953895336082,
                                                 0.2195814928486969, 0.24153964213356663, 0.2656936063469233,
                                                 0.29226296698161564, 0.3214892636797772}));
  EXPECT_EQ(h.bucket, (std::vector<double>{0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1}));
  EXPECT_EQ(h.min, 0.10000000149011612);
  EXPECT_EQ(h.max, 0.30000001192092896);
  EXPECT_EQ(h.num, 3);
  EXPECT_NEAR(h.sum, 0.6000000163912773, 1e-16);  // NumPy sums pairwise; both are float64 sums of 3 values
  EXPECT_NEAR(h.sum_squares, 0.14000000864267365, 1e-16);
}

TEST(Histogram, TensorflowBinsMatchPyTorchAcrossZero) {
  const Histogram h = make_histogram(kMixed);
  ASSERT_EQ(h.bucket_limit.size(), 614u);
  ASSERT_EQ(h.bucket.size(), 614u);
  EXPECT_EQ(h.bucket_limit.front(), -2.6170109961884593);
  EXPECT_EQ(h.bucket_limit.back(), 7.466637793298873);
  // (index, count, right limit) of every non-empty bucket; both zeros land in [0, 1e-12).
  const std::vector<std::tuple<size_t, double, double>> nonzero = {
      {1, 1, -2.379100905625872}, {83, 1, -0.0009598705768327891}, {302, 2, 1e-12},
      {423, 1, 1.0197997569961407e-07}, {580, 2, 0.3214892636797772}, {613, 1, 7.466637793298873}};
  size_t k = 0;
  for (size_t i = 0; i < h.bucket.size(); ++i) {
    if (h.bucket[i] == 0) continue;
    ASSERT_LT(k, nonzero.size());
    EXPECT_EQ(i, std::get<0>(nonzero[k]));
    EXPECT_EQ(h.bucket[i], std::get<1>(nonzero[k]));
    EXPECT_EQ(h.bucket_limit[i], std::get<2>(nonzero[k]));
    ++k;
  }
  EXPECT_EQ(k, nonzero.size());
  EXPECT_EQ(h.min, -2.5);
  EXPECT_EQ(h.max, 7.0);
  EXPECT_NEAR(h.sum, 5.099000123794362, 1e-14);
  EXPECT_NEAR(h.sum_squares, 55.43000101430522, 1e-13);
}

TEST(Histogram, FixedCountMatchesNumpyEqualWidthBins) {
  Histogram h = make_histogram(kMixed, HistogramBins::fixed(5));
  EXPECT_EQ(h.bucket_limit, (std::vector<double>{-2.5, -0.6000000000000001, 1.2999999999999998, 3.1999999999999993, 5.1, 7.0}));
  EXPECT_EQ(h.bucket, (std::vector<double>{0, 1, 6, 0, 0, 1}));

  h = make_histogram(std::vector<float>{0.5f, 1.0f, 1.0f, 2.0f}, HistogramBins::fixed(3));  // 1.0 sits on an edge
  EXPECT_EQ(h.bucket_limit, (std::vector<double>{0.5, 1.0, 1.5, 2.0}));
  EXPECT_EQ(h.bucket, (std::vector<double>{0, 1, 2, 1}));

  h = make_histogram(std::vector<float>{1.0f, 1.0f, 1.0f}, HistogramBins::fixed(3));  // all equal: range +-0.5
  EXPECT_EQ(h.bucket_limit, (std::vector<double>{0.8333333333333333, 1.1666666666666665}));
  EXPECT_EQ(h.bucket, (std::vector<double>{0, 3}));
}

TEST(Histogram, LeavesOutInfAndNan) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const Histogram h = make_histogram(std::vector<float>{1.0f, inf, -inf, nan, 3.0f}, HistogramBins::fixed(2));
  EXPECT_EQ(h.num, 2);
  EXPECT_EQ(h.min, 1.0);
  EXPECT_EQ(h.max, 3.0);
  EXPECT_EQ(h.sum, 4.0);
  EXPECT_EQ(h.sum_squares, 10.0);
  double counted = 0;
  for (double c : h.bucket) counted += c;
  EXPECT_EQ(counted, 2);
}

TEST(Histogram, RejectsWhatCannotBeBucketed) {
  EXPECT_TRUE(test::throws_error([] { make_histogram(std::vector<float>{}); }, {"add_histogram", "0 values"}));
  EXPECT_TRUE(test::throws_error([] { make_histogram(std::vector<float>{NAN, INFINITY}); }, {"2 of them inf/NaN"}));
  EXPECT_TRUE(test::throws_error([] { make_histogram(std::vector<float>{3e20f}); }, {"1e20", "fixed"}));
  EXPECT_TRUE(test::throws_error([] { make_histogram(std::vector<float>{1.0f}, HistogramBins{-2}); }, {"count -2"}));
  EXPECT_NO_THROW(make_histogram(std::vector<float>{3e20f}, HistogramBins::fixed(4)));
}

}  // namespace
}  // namespace ampgrad::utils
