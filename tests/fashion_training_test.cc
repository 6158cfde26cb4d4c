// The Fashion-MNIST classifier of examples/fashion.h: short training runs on a subset of the real
// data (Debian's dataset-fashion-mnist; skipped with the reason when it is absent) in FP32 and AMP
// that must lower the loss and reach a sane accuracy with flat memory, the helpers the example
// uses, and data errors that say how to get the data.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "examples/fashion.h"
#include "tests/test_util.h"

namespace ampgrad {
namespace {

namespace fm = fashion;

constexpr int64_t kTrainSamples = 2048;
constexpr int64_t kTestSamples = 1000;

bool have_data() {
  return std::filesystem::exists(data::mnist_path(fm::kDefaultDataDir, data::MnistSplit::kTrain, data::MnistFile::kImages));
}

#define SKIP_WITHOUT_DATA()                                                                                   \
  if (!have_data())                                                                                          \
  GTEST_SKIP() << "Fashion-MNIST is not installed in " << fm::kDefaultDataDir                                \
               << " (apt-get install dataset-fashion-mnist; ./bazelw installs it)"

struct TrainingRun {
  float first_loss = 0;      // the first step's loss (about ln 10 = 2.30 for an untrained model)
  double last_epoch_loss = 0;
  fm::Evaluation test;
  int64_t live_bytes_epoch1 = 0, live_bytes_last = 0;
  int64_t skipped = 0;
};

// Three epochs over the first kTrainSamples training images, batch 64, the example's MLP or CNN.
TrainingRun train(fm::Precision precision, fm::Model model = fm::Model::kMlp,
                  optim::MasterWeights master_weights = optim::MasterWeights::kFp32) {
  manual_seed(0);
  const fm::Dataset train = fm::load_dataset(fm::kDefaultDataDir, data::MnistSplit::kTrain, kTrainSamples);
  const fm::Dataset test = fm::load_dataset(fm::kDefaultDataDir, data::MnistSplit::kTest, kTestSamples);
  constexpr int64_t kEpochs = 3, kBatch = 64;
  fm::Classifier classifier(model == fm::Model::kCnn ? fm::make_cnn() : fm::make_mlp(),
                            {.precision = precision,
                             .batch_size = kBatch,
                             .total_steps = kEpochs * kTrainSamples / kBatch,
                             .master_weights = master_weights});
  TrainingRun run;
  for (int64_t epoch = 1; epoch <= kEpochs; ++epoch) {
    run.last_epoch_loss = fm::train_epoch(classifier, train, [&](int64_t step, float loss) {
      if (epoch == 1 && step == 1) run.first_loss = loss;
    });
    const int64_t live = memory_stats(Device::kCPU).current_bytes;
    (epoch == 1 ? run.live_bytes_epoch1 : run.live_bytes_last) = live;
  }
  run.test = fm::evaluate(classifier.model, test, precision);
  run.skipped = kEpochs * kTrainSamples / kBatch - classifier.optimizer.steps_taken();
  return run;
}

void expect_learned(const TrainingRun& run) {
  std::printf("first loss %.4f, last epoch's mean loss %.4f, test loss %.4f, test accuracy %.4f, live bytes %lld\n",
              run.first_loss, run.last_epoch_loss, run.test.loss, run.test.accuracy,
              static_cast<long long>(run.live_bytes_last));
  EXPECT_NEAR(run.first_loss, std::log(10.0), 0.2);  // an untrained model guesses uniformly
  EXPECT_LT(run.last_epoch_loss, 0.6);               // a quarter of where it started (measured: 0.45)
  EXPECT_LT(run.test.loss, 0.7);                     // measured: 0.54
  EXPECT_GT(run.test.accuracy, 0.75);                // measured: 0.81 (FP32), 0.806 (AMP); chance is 0.10
  // Nothing accumulates from one epoch to the next (each step frees its graph and temporaries).
  EXPECT_EQ(run.live_bytes_last, run.live_bytes_epoch1);
}

TEST(FashionTraining, Fp32LossFalls) {
  SKIP_WITHOUT_DATA();
  const TrainingRun run = train(fm::Precision::kFp32);
  expect_learned(run);
  EXPECT_EQ(run.skipped, 0);
}

TEST(FashionTraining, AmpLossFallsLikeFp32) {
  SKIP_WITHOUT_DATA();
  const TrainingRun amp = train(fm::Precision::kAmp);
  expect_learned(amp);
  EXPECT_EQ(amp.skipped, 0);  // the scale starts at 2^16 and these gradients never overflow in FP16
  const TrainingRun fp32 = train(fm::Precision::kFp32);
  EXPECT_NEAR(amp.last_epoch_loss, fp32.last_epoch_loss, 0.05 * fp32.last_epoch_loss);
  EXPECT_NEAR(amp.test.accuracy, fp32.test.accuracy, 0.02);
}

// BF16 autocast without a scaler (the BF16 recipe): no step can be skipped, and the run tracks FP32
// within BF16's coarser rounding (eps 2^-7, eight times FP16's), so twice AMP's bounds.
TEST(FashionTraining, Bf16LossFallsLikeFp32) {
  SKIP_WITHOUT_DATA();
  const TrainingRun bf16 = train(fm::Precision::kAmpBf16);
  expect_learned(bf16);
  EXPECT_EQ(bf16.skipped, 0);
  const TrainingRun fp32 = train(fm::Precision::kFp32);
  EXPECT_NEAR(bf16.last_epoch_loss, fp32.last_epoch_loss, 0.1 * fp32.last_epoch_loss);
  EXPECT_NEAR(bf16.test.accuracy, fp32.test.accuracy, 0.04);
}

// FP8 linears (delayed scaling) inside BF16 autocast, no scaler: E4M3 keeps 3 mantissa bits, so
// the run tracks FP32 more loosely than BF16 does.
TEST(FashionTraining, Fp8LossFallsLikeFp32) {
  SKIP_WITHOUT_DATA();
  const TrainingRun fp8 = train(fm::Precision::kFp8);
  expect_learned(fp8);
  EXPECT_EQ(fp8.skipped, 0);
  const TrainingRun fp32 = train(fm::Precision::kFp32);
  EXPECT_NEAR(fp8.last_epoch_loss, fp32.last_epoch_loss, 0.15 * fp32.last_epoch_loss);
  EXPECT_NEAR(fp8.test.accuracy, fp32.test.accuracy, 0.04);
}

// BF16 parameters: with FP32 masters, and without them by stochastic rounding, the run tracks
// FP32 as BF16 autocast does; no master is kept in the second.
TEST(FashionTraining, Bf16ParametersWithMastersOrStochasticRoundingFallLikeFp32) {
  SKIP_WITHOUT_DATA();
  const TrainingRun fp32 = train(fm::Precision::kFp32);
  for (const optim::MasterWeights mode : {optim::MasterWeights::kFp32, optim::MasterWeights::kStochasticRounding}) {
    const TrainingRun bf16 = train(fm::Precision::kBf16Params, fm::Model::kMlp, mode);
    expect_learned(bf16);
    EXPECT_EQ(bf16.skipped, 0);
    EXPECT_NEAR(bf16.last_epoch_loss, fp32.last_epoch_loss, 0.1 * fp32.last_epoch_loss) << fm::master_weights_name(mode);
    EXPECT_NEAR(bf16.test.accuracy, fp32.test.accuracy, 0.04) << fm::master_weights_name(mode);
  }
}

// The CNN (conv-BN-ReLU-pool twice): it learns faster than the MLP on the same images, and BF16
// autocast (convolutions in BF16, batch norm in FP32) and FP16 AMP track FP32.
TEST(FashionTraining, CnnLearnsInFp32Bf16AndAmp) {
  SKIP_WITHOUT_DATA();
  const TrainingRun fp32 = train(fm::Precision::kFp32, fm::Model::kCnn);
  expect_learned(fp32);
  EXPECT_GT(fp32.test.accuracy, 0.8);  // measured: 0.834 (the MLP: 0.81)
  for (const fm::Precision precision : {fm::Precision::kAmpBf16, fm::Precision::kAmp}) {
    const TrainingRun low = train(precision, fm::Model::kCnn);
    expect_learned(low);
    // BF16 skips nothing (no scaler); FP16 AMP's scale starts at 2^16, where the convolutions' weight
    // gradients (sums over every pixel of the batch) overflow FP16 at first: the scaler backs off
    // and skips that step (measured: 1 step), as PyTorch's does.
    EXPECT_LE(low.skipped, precision == fm::Precision::kAmp ? 3 : 0) << fm::precision_name(precision);
    EXPECT_NEAR(low.last_epoch_loss, fp32.last_epoch_loss, 0.1 * fp32.last_epoch_loss) << fm::precision_name(precision);
    EXPECT_NEAR(low.test.accuracy, fp32.test.accuracy, 0.03) << fm::precision_name(precision);
  }
}

TEST(FashionData, LoadsNormalisedFlatImages) {
  SKIP_WITHOUT_DATA();
  const fm::Dataset d = fm::load_dataset(fm::kDefaultDataDir, data::MnistSplit::kTest, 100);
  EXPECT_EQ(d.images.shape(), (Shape{100, 784}));
  EXPECT_EQ(d.labels.shape(), (Shape{100}));
  // Normalised with the training set's statistics: this subset's mean and spread are near 0 and 1.
  const std::vector<double> v = d.images.to_double_vector();
  double sum = 0, sq = 0;
  for (const double x : v) sum += x, sq += x * x;
  const double mean = sum / static_cast<double>(v.size());
  EXPECT_NEAR(mean, 0.0, 0.1);
  EXPECT_NEAR(std::sqrt(sq / static_cast<double>(v.size()) - mean * mean), 1.0, 0.1);
  // t10k's first labels (Fashion-MNIST's own test file).
  EXPECT_EQ(ops::narrow(d.labels, 0, 0, 5).to_vector<int64_t>(), (std::vector<int64_t>{9, 2, 1, 1, 6}));
}

TEST(FashionData, ShuffledBatchesArePermutations) {
  manual_seed(3);
  const std::vector<Tensor> a = fm::shuffled_batches(10, 4);
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(a[2].numel(), 2);
  std::multiset<int64_t> seen;
  std::vector<int64_t> order;
  for (const Tensor& b : a) {
    for (const int64_t i : b.to_vector<int64_t>()) seen.insert(i), order.push_back(i);
  }
  EXPECT_EQ(seen, (std::multiset<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_NE(order, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  manual_seed(3);
  std::vector<int64_t> again;
  for (const Tensor& b : fm::shuffled_batches(10, 4)) {
    for (const int64_t i : b.to_vector<int64_t>()) again.push_back(i);
  }
  EXPECT_EQ(again, order);  // reproducible from the seed
}

TEST(FashionData, GatherPicksRowsAndLabels) {
  const fm::Dataset d{.images = Tensor::from_vector(std::vector<float>{0, 1, 10, 11, 20, 21}, {3, 2}),
                      .labels = Tensor::from_vector(std::vector<int64_t>{7, 8, 9}, {3})};
  const fm::Dataset b = fm::gather(d, Tensor::from_vector(std::vector<int64_t>{2, 0}, {2}));
  EXPECT_EQ(b.images.to_vector(), (std::vector<float>{20, 21, 0, 1}));
  EXPECT_EQ(b.labels.to_vector<int64_t>(), (std::vector<int64_t>{9, 7}));
  EXPECT_ERROR([&] { fm::gather(d, Tensor::from_vector(std::vector<int64_t>{3}, {1})); }, "index 3", "[0, 3)");
}

TEST(FashionData, MlpHasPyTorchNames) {
  const nn::Sequential m = fm::make_mlp({.in_features = 6, .hidden = {5, 4}, .classes = 3});
  std::vector<std::string> names;
  for (const auto& [name, p] : m.named_parameters()) names.push_back(name + shape_to_string(p.shape()));
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight[5, 6]", "0.bias[5]", "2.weight[4, 5]", "2.bias[4]",
                                             "4.weight[3, 4]", "4.bias[3]"}));
}

std::string temp_dir(const std::string& name) {
  const char* root = std::getenv("TEST_TMPDIR");
  const std::filesystem::path dir = std::filesystem::path(root != nullptr ? root : "/tmp") / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

// Every data error, whatever the file's problem, tells how to get the data.
TEST(FashionData, ErrorsSayHowToGetTheData) {
  const std::string empty = temp_dir("fashion_empty");
  EXPECT_ERROR([&] { fm::load_dataset(empty, data::MnistSplit::kTrain); }, "no file", "train-images-idx3-ubyte.gz",
               "apt-get install dataset-fashion-mnist", "--data DIR");
  const std::string broken = temp_dir("fashion_broken");
  std::ofstream(broken + "/t10k-images-idx3-ubyte.gz") << "<html>404 Not Found</html>";
  EXPECT_ERROR([&] { fm::load_dataset(broken, data::MnistSplit::kTest); }, "not an IDX file",
               "apt-get install dataset-fashion-mnist");
  const std::string truncated = temp_dir("fashion_truncated");
  // A plain IDX header for 10 images of 28 x 28, followed by 3 bytes.
  std::ofstream(truncated + "/train-images-idx3-ubyte", std::ios::binary)
      << std::string("\0\0\x08\x03\0\0\0\x0a\0\0\0\x1c\0\0\0\x1cxyz", 19);
  EXPECT_ERROR([&] { fm::load_dataset(truncated, data::MnistSplit::kTrain); }, "truncated", "[10, 28, 28]",
               "apt-get install dataset-fashion-mnist");
}

// The examples' shared command line: both flag forms, the precisions, --plot/--logdir only where
// the example writes them, and malformed or non-positive values refused.
TEST(FashionCommandLine, ParsesTheExamplesFlags) {
  const auto parse = [](std::vector<std::string> words, fm::OutputFlags outputs, fm::CommandLine& out) {
    words.insert(words.begin(), "prog");
    std::vector<char*> argv;
    for (std::string& w : words) argv.push_back(w.data());
    return fm::parse_command_line(static_cast<int>(argv.size()), argv.data(), out, outputs);
  };
  fm::CommandLine a;
  ASSERT_TRUE(parse({"--amp=bf16", "--epochs", "3", "--batch-size=32", "--lr", "5e-4", "--seed=7", "--data", "d",
                     "--train-samples", "100", "--plot", "p", "--logdir=l"},
                    fm::OutputFlags::kYes, a));
  EXPECT_EQ(a.precision, fm::Precision::kAmpBf16);
  EXPECT_EQ(a.epochs, 3);
  EXPECT_EQ(a.batch_size, 32);
  EXPECT_DOUBLE_EQ(a.lr, 5e-4);
  EXPECT_EQ(a.seed, 7u);
  EXPECT_EQ(a.data, "d");
  EXPECT_EQ(a.train_samples, 100);
  EXPECT_EQ(a.plot, "p");
  EXPECT_EQ(a.logdir, "l");
  fm::CommandLine b;
  ASSERT_TRUE(parse({"--amp"}, fm::OutputFlags::kNo, b));
  EXPECT_EQ(b.precision, fm::Precision::kAmp);
  EXPECT_EQ(b.data, fm::kDefaultDataDir);
  fm::CommandLine f;
  ASSERT_TRUE(parse({"--amp=fp8"}, fm::OutputFlags::kNo, f));
  EXPECT_EQ(f.precision, fm::Precision::kFp8);
  for (const std::vector<std::string>& bad : std::vector<std::vector<std::string>>{
           {"--plot", "p"}, {"--epochs", "0"}, {"--epochs=2x"}, {"--lr=-1"}, {"--seed=-3"}, {"--batch-size"},
           {"--unknown=1"}, {"--epochs="}}) {
    fm::CommandLine c;
    EXPECT_FALSE(parse(bad, fm::OutputFlags::kNo, c)) << bad[0];
  }
}

}  // namespace
}  // namespace ampgrad
