// DistributedDataParallel as an MPI job (2 and 4 ranks): N ranks with batch B against one process
// with batch N*B (FP32, FP16 autocast, FP16 parameters), replicas bit-identical after every step,
// an inf on one rank making every rank skip and back off, gradient accumulation under no_sync(),
// bucketing and overlap not changing a bit, activation checkpointing not changing a bit, errors on
// every rank, and bit-exact resume.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "amp/autocast.h"
#include "amp/float8.h"
#include "amp/grad_scaler.h"
#include "ddp_test_util.h"
#include "distributed/checkpoint.h"
#include "distributed/data_parallel.h"
#include "distributed/process_group.h"
#include "distributed/sampler.h"
#include "framework/autograd.h"
#include "framework/copy.h"
#include "framework/error.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "ops/ops.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "test_util.h"
#include "utils/activation_checkpoint.h"

namespace ag = ampgrad;
namespace dist = ampgrad::distributed;
using ag::DType;
using ag::Tensor;
using namespace ag::ddp_testing;

namespace {

enum class Precision { kFloat32, kAutocast, kFloat16Parameters, kFloat8 };  // kFloat8: FP8 linears in BF16 autocast

struct Config {
  Precision precision = Precision::kFloat32;
  int steps = 100;
  int64_t batch = 8;     // rows per rank per step (the reference takes world size * batch)
  int accumulate = 1;    // micro-batches per step, all but the last under no_sync()
  bool distributed = true;
  dist::DataParallelOptions ddp = {};
  uint64_t init_seed = 100;  // rank r starts from init_seed + r; the broadcast makes it rank 0's
  // Called after backward (gradients reduced) and before the step: for fault injection.
  std::function<void(int step, ag::nn::Module& model)> after_backward = nullptr;
  // Called on each micro-batch's inputs before the forward.
  std::function<void(int step, int micro, Tensor& x)> on_input = nullptr;
  bool checkpoint = false;  // the middle Linear + ReLU under utils::checkpoint (CheckpointedMlp)
};

// make_mlp's layers with the middle Linear + ReLU run under utils::checkpoint, as the GPT example
// runs its blocks: their parameters' gradients come from the recomputation in the backward and
// must still reach DDP's hooks once each. The parameters are the MLP's, in the same order.
class CheckpointedMlp : public ag::nn::Module {
 public:
  explicit CheckpointedMlp(const ag::nn::Sequential& mlp) : mlp_(register_module("mlp", mlp)) {}
  Tensor forward(const Tensor& x) override {
    const Tensor h = mlp_[1](mlp_[0](x));
    const Tensor middle =
        ag::utils::checkpoint([this](const std::vector<Tensor>& in) { return mlp_[3](mlp_[2](in[0])); }, {h});
    return mlp_[4](middle);
  }

 private:
  ag::nn::Sequential mlp_;
};

struct Result {
  std::vector<std::vector<double>> params;
  std::vector<bool> stepped;
  std::vector<double> scales;
  bool replicas_always_identical = true;
  dist::DataParallelStats stats;
  // Every weight's FP8 scales and closed amax histories at the end (history[0], the last step's
  // own, is reduced at the next forward).
  std::vector<float> float8_states;
  int64_t middle_forwards = 0;  // runs of the middle Linear (twice a micro-batch when checkpointed)
};

Result train(const Data& data, const Config& c) {
  const int n = world().size(), r = world().rank();
  ag::nn::Sequential mlp = make_mlp(c.distributed ? c.init_seed + r : c.init_seed);
  std::optional<CheckpointedMlp> checkpointed;
  ag::nn::Module& model = c.checkpoint ? checkpointed.emplace(mlp) : static_cast<ag::nn::Module&>(mlp);
  Result result;
  mlp[2].register_forward_hook([&result](ag::nn::Module&, const Tensor&, const Tensor&) { ++result.middle_forwards; });
  if (c.precision == Precision::kFloat16Parameters) model.to(DType::kFloat16);
  std::unique_ptr<dist::DistributedDataParallel> ddp;
  if (c.distributed) ddp = std::make_unique<dist::DistributedDataParallel>(model, world(), c.ddp);
  ag::nn::Module& net = ddp ? static_cast<ag::nn::Module&>(*ddp) : model;
  ag::optim::Adam opt(model.parameters(), {.lr = 3e-3});
  const bool amp = c.precision != Precision::kFloat32;
  // A fixed scale that none of these runs overflows: the ranks' per-batch gradients are N times the
  // reference's, and a scale that overflowed in one but not the other would skip different steps.
  ag::amp::GradScaler scaler({.init_scale = 256, .growth_interval = 1000000, .enabled = amp});
  std::optional<LocalFoundInf> local;
  if (!c.distributed) local.emplace();

  const int64_t rows = c.distributed ? c.batch : c.batch * n;
  const int64_t micro = rows / c.accumulate;
  for (int step = 0; step < c.steps; ++step) {
    const int64_t begin = (step * n * c.batch + (c.distributed ? r * c.batch : 0)) % (data.rows() - rows);
    opt.zero_grad();
    for (int m = 0; m < c.accumulate; ++m) {
      std::optional<dist::DistributedDataParallel::NoSyncGuard> no_sync;
      if (ddp && m + 1 < c.accumulate) no_sync.emplace(*ddp);
      Tensor x = data.batch_x(begin + m * micro, micro), y = data.batch_y(begin + m * micro, micro);
      if (c.on_input) c.on_input(step, m, x);
      Tensor loss;
      {
        const bool fp8 = c.precision == Precision::kFloat8;
        ag::amp::AutocastGuard autocast(ag::Device::kCPU, fp8 ? DType::kBFloat16 : DType::kFloat16, amp);
        ag::amp::Float8Guard float8(ag::Device::kCPU, {.amax_history_len = 4}, fp8);
        loss = ag::ops::mse_loss(net(x).to(DType::kFloat32), y);
      }
      // Each micro-batch's mean, weighted so the accumulated gradient is the whole batch's mean.
      if (c.accumulate > 1) loss = ag::ops::scale(loss, 1.0 / c.accumulate);
      scaler.scale(loss).backward();
    }
    if (c.after_backward) c.after_backward(step, model);
    result.stepped.push_back(scaler.step(opt));
    scaler.update();
    result.scales.push_back(scaler.get_scale());
    if (c.distributed) result.replicas_always_identical &= static_cast<bool>(replicas_identical(model));
  }
  result.params = snapshot(model);
  if (ddp) result.stats = ddp->stats();
  for (const Tensor& p : model.parameters()) {
    const ag::Float8LinearState* state = ag::amp::float8_state(p);
    if (state == nullptr) continue;
    for (const ag::Float8ScalingState* s : {&state->input, &state->weight, &state->grad_output}) {
      result.float8_states.push_back(s->scale());
      result.float8_states.insert(result.float8_states.end(), s->amax_history().begin() + 1, s->amax_history().end());
    }
  }
  return result;
}

int count(const std::vector<bool>& v, bool value) { return static_cast<int>(std::count(v.begin(), v.end(), value)); }

const Data& shared_data() {
  static const Data data = make_data(4096);
  return data;
}

// ---- Equivalence with one process over the whole batch ------------------------------------------

// The tolerances: the ranks' gradients are the same sums as the reference's, added in another
// order (per-rank sums, then the average over ranks), so they differ by rounding, and 100 Adam
// steps carry that along. Measured at 2 and 4 ranks (printed): float32 about 6e-8, float16
// (whose GEMM outputs round to 11 bits) 2e-3 to 6e-3; the bounds leave room for other machines.
void expect_equivalent(Precision precision, double tolerance) {
  Config c{.precision = precision};
  const Result ddp = train(shared_data(), c);
  c.distributed = false;
  const Result reference = train(shared_data(), c);
  EXPECT_TRUE(ddp.replicas_always_identical);
  EXPECT_EQ(count(ddp.stepped, false), 0);
  EXPECT_EQ(count(reference.stepped, false), 0);
  const double diff = max_relative_difference(ddp.params, reference.params);
  if (world().rank() == 0) {
    std::printf("  %d ranks vs one process, 100 steps: max relative difference %.3g\n", world().size(), diff);
  }
  EXPECT_LE(diff, tolerance);
  // And the check has teeth: training moved the parameters (by about 0.16) well beyond the tolerance.
  Config untrained = c;
  untrained.steps = 0;
  EXPECT_GT(max_relative_difference(train(shared_data(), untrained).params, reference.params), 5 * tolerance);
}

TEST(DataParallelEquivalence, Float32MatchesOneProcessWithTheWholeBatch) {
  expect_equivalent(Precision::kFloat32, 1e-6);
}

TEST(DataParallelEquivalence, AutocastFloat16MatchesOneProcessWithTheWholeBatch) {
  expect_equivalent(Precision::kAutocast, 2e-2);
}

TEST(DataParallelEquivalence, Float16ParametersMatchOneProcessAndReduceHalfTheBytes) {
  expect_equivalent(Precision::kFloat16Parameters, 2e-2);
  Config c{.precision = Precision::kFloat16Parameters, .steps = 1};
  const Result fp16 = train(shared_data(), c);
  c.precision = Precision::kFloat32;
  const Result fp32 = train(shared_data(), c);
  EXPECT_EQ(fp16.stats.parameters, fp32.stats.parameters);
  EXPECT_EQ(fp32.stats.bytes_per_sync, 4 * fp32.stats.parameters);
  EXPECT_EQ(fp16.stats.bytes_per_sync, 2 * fp16.stats.parameters);
}

// ---- Replicas -----------------------------------------------------------------------------------

TEST(DataParallelReplicas, StartAsRankZerosModel) {
  ag::nn::Sequential model = make_mlp(100 + world().rank());  // a different model on every rank
  EXPECT_EQ(static_cast<bool>(replicas_identical(model)), world().size() == 1);
  const std::vector<std::vector<double>> rank0 = snapshot(make_mlp(100));
  dist::DistributedDataParallel ddp(model, world());
  EXPECT_TRUE(replicas_identical(model));
  EXPECT_EQ(snapshot(model), rank0);
  // The wrapped module is the wrapper's child "module", as in PyTorch.
  const auto names = ddp.named_parameters();
  ASSERT_EQ(names.size(), model.named_parameters().size());
  EXPECT_EQ(names[0].first, "module.0.weight");
  EXPECT_TRUE(names[0].second.is_same(model.parameters()[0]));
}

// A layer with a float buffer and an int64 buffer, both different on every rank.
class WithBuffers : public ag::nn::Module {
 public:
  explicit WithBuffers(int rank)
      : lin(register_module("lin", ag::nn::Linear(8, 1))),
        gain(register_buffer("gain", ag::full({1}, 1.0 + rank))),
        seen(register_buffer("seen", Tensor::from_vector(std::vector<int64_t>{rank, 7}, {2}))) {}
  Tensor forward(const Tensor& x) override { return lin(x) * gain; }
  ag::nn::Linear lin;
  Tensor& gain;
  Tensor& seen;
};

TEST(DataParallelReplicas, BuffersAreRankZerosAtConstructionAndBeforeEachForward) {
  WithBuffers model(world().rank());
  dist::DistributedDataParallel ddp(model, world());
  EXPECT_EQ(model.gain.to_vector(), (std::vector<float>{1.0f}));
  EXPECT_EQ(model.seen.to_double_vector(), (std::vector<double>{0, 7}));
  ag::copy_(model.gain, ag::full({1}, 5.0 + world().rank()));  // drifts apart, as running stats would
  ddp(shared_data().batch_x(0, 4));
  EXPECT_EQ(model.gain.to_vector(), (std::vector<float>{5.0f}));
  EXPECT_TRUE(replicas_identical(model));
}

TEST(DataParallelReplicas, TiedWeightsAreReducedOnceAndMatchOneProcess) {
  // One Linear used twice: its gradient has two contributions and must be averaged once, whole.
  const auto run = [](bool distributed) {
    ag::manual_seed(9);
    ag::nn::Linear shared(8, 8);
    ag::nn::Sequential model{shared, ag::nn::ReLU(), shared, ag::nn::Linear(8, 1)};
    std::unique_ptr<dist::DistributedDataParallel> ddp;
    if (distributed) ddp = std::make_unique<dist::DistributedDataParallel>(model, world());
    ag::nn::Module& net = ddp ? static_cast<ag::nn::Module&>(*ddp) : model;
    ag::optim::SGD opt(model.parameters(), {.lr = 0.05});
    const int n = world().size(), r = world().rank();
    for (int step = 0; step < 10; ++step) {
      const int64_t rows = distributed ? 8 : 8 * n, begin = step * 8 * n + (distributed ? 8 * r : 0);
      opt.zero_grad();
      ag::ops::mse_loss(net(shared_data().batch_x(begin, rows)), shared_data().batch_y(begin, rows)).backward();
      opt.step();
    }
    EXPECT_EQ(model.parameters().size(), 4u);  // the shared weight and bias once
    if (ddp) {
      EXPECT_EQ(ddp->stats().syncs, 10);
      EXPECT_TRUE(replicas_identical(model));
    }
    return snapshot(model);
  };
  const auto ddp = run(true);
  EXPECT_LE(max_relative_difference(ddp, run(false)), 1e-6);
}

TEST(DataParallelReplicas, ChangingTheModelAfterWrappingIsAnError) {
  ag::nn::Sequential model = make_mlp(1);
  dist::DistributedDataParallel ddp(model, world());
  model.to(DType::kFloat16);
  EXPECT_ERROR([&] { ddp(shared_data().batch_x(0, 4)); }, "parameter 0.weight was Tensor[32, 8] float32 cpu when",
               "now Tensor[32, 8] float16 cpu", "convert the model (to()) before wrapping it");
}

TEST(DataParallelReplicas, BucketsAndOverlapDoNotChangeABit) {
  Config c{.precision = Precision::kAutocast, .steps = 10};
  const Result one_bucket = train(shared_data(), [&] {
    Config one = c;
    one.ddp = {.bucket_cap_mb = 100, .first_bucket_cap_mb = 100};
    return one;
  }());
  Config tiny = c;
  tiny.ddp = {.bucket_cap_mb = 1e-6, .first_bucket_cap_mb = 1e-6};  // one bucket per parameter
  const Result many = train(shared_data(), tiny);
  tiny.ddp.overlap = false;
  const Result serial = train(shared_data(), tiny);
  EXPECT_EQ(one_bucket.stats.buckets, 1);
  EXPECT_EQ(many.stats.buckets, 6);
  EXPECT_EQ(many.params, one_bucket.params);
  EXPECT_EQ(serial.params, one_bucket.params);
  // With overlap, buckets leave while backward is still producing gradients; without, none do.
  EXPECT_GE(many.stats.last_overlapped_buckets, 1);
  EXPECT_EQ(serial.stats.last_overlapped_buckets, 0);
  EXPECT_EQ(many.stats.syncs, 10);
}

// ---- Loss scaling that every rank agrees on -----------------------------------------------------

constexpr int kInfStep = 3;

// The last rank alone gets an inf in one gradient element after the reduction, so only the
// found-inf agreement can tell the other ranks.
void inject_inf_after_reduction(int step, ag::nn::Module& model) {
  if (step != kInfStep || world().rank() != world().size() - 1) return;
  Tensor g = model.parameters()[2].grad();
  std::vector<float> v = g.to_vector();
  v[0] = std::numeric_limits<float>::infinity();
  ag::copy_(g, Tensor::from_vector(v, g.shape(), g.dtype()));
}

TEST(DataParallelFoundInf, AnInfOnOneRankMakesEveryRankSkipAndBackOff) {
  for (Precision precision : {Precision::kAutocast, Precision::kFloat16Parameters}) {
    const Result run = train(shared_data(), {.precision = precision, .steps = 6,
                                             .after_backward = inject_inf_after_reduction});
    EXPECT_TRUE(run.replicas_always_identical);
    EXPECT_EQ(run.stepped, (std::vector<bool>{true, true, true, false, true, true}));
    EXPECT_EQ(run.scales[kInfStep], 128.0);  // 256 backed off once, on every rank
    EXPECT_EQ(run.scales.back(), 128.0);
  }
}

TEST(DataParallelFoundInf, AnInfInOneRanksInputReachesEveryRank) {
  // Before the reduction: the averaged gradient is inf everywhere, and every rank skips.
  const Result run = train(shared_data(), {.precision = Precision::kAutocast, .steps = 6,
                                           .on_input = [](int step, int, Tensor& x) {
                                             if (step == kInfStep && world().rank() == 0) {
                                               x = x * std::numeric_limits<float>::infinity();
                                             }
                                           }});
  EXPECT_TRUE(run.replicas_always_identical);
  EXPECT_EQ(count(run.stepped, false), 1);
  EXPECT_FALSE(run.stepped[kInfStep]);
}

TEST(DataParallelFoundInf, WithoutTheAgreementTheReplicasWouldDiverge) {
  // The control for the tests above: the same injection with each rank deciding alone.
  if (world().size() == 1) GTEST_SKIP() << "needs two ranks";
  LocalFoundInf local;
  const Result run = train(shared_data(), {.precision = Precision::kAutocast, .steps = 6,
                                           .after_backward = inject_inf_after_reduction});
  EXPECT_FALSE(run.replicas_always_identical);
  EXPECT_EQ(run.stepped[kInfStep], world().rank() != world().size() - 1);
}

// ---- FP8 ----------------------------------------------------------------------------------------

// Whether `values` are the same on every rank.
bool same_on_every_rank(const std::vector<float>& values) {
  Tensor most = Tensor::from_vector(values, {static_cast<int64_t>(values.size())});
  Tensor least = -most;
  world().all_reduce(most, dist::ReduceOp::kMax);
  world().all_reduce(least, dist::ReduceOp::kMax);
  return most.to_vector() == (-least).to_vector();
}

// Each rank's batch has its own amaxes. Reduced with MAX before each training forward, they give
// every rank the same FP8 scales and amax histories after every step, with gradient accumulation
// too (each micro-batch is an FP8 step, its forward under no_sync()); without the reduction they
// differ (the replicas stay identical either way: the gradients are averaged).
TEST(DataParallelFloat8, AmaxesAreReducedSoEveryRankScalesAlike) {
  if (world().size() == 1) GTEST_SKIP() << "needs two ranks";
  for (const int accumulate : {1, 2}) {
    for (const bool reduce : {true, false}) {
      SCOPED_TRACE(std::string(reduce ? "reduced" : "not reduced") + ", micro-batches " + std::to_string(accumulate));
      Config c{.precision = Precision::kFloat8, .steps = 5, .accumulate = accumulate};
      c.ddp.reduce_float8_amax = reduce;
      const Result run = train(shared_data(), c);
      EXPECT_TRUE(run.replicas_always_identical);
      ASSERT_EQ(run.float8_states.size(), 3u * 3u * 4u);  // three linears' weights, 3 states of 1 + 3 values
      EXPECT_EQ(same_on_every_rank(run.float8_states), reduce);
    }
  }
}

// ---- Activation checkpointing ------------------------------------------------------------------

// The middle layer's parameters get their gradients from checkpoint's recomputation, late in the
// backward and in another order; DDP must still reduce each once, and the result must be the run
// without checkpointing, bit for bit (FP16 autocast: with GradScaler's unscale, step and update).
TEST(DataParallelCheckpointing, CheckpointedLayersTrainToTheSameBitsAsWithout) {
  for (Precision precision : {Precision::kFloat32, Precision::kAutocast}) {
    Config c{.precision = precision, .steps = 20};
    const Result plain = train(shared_data(), c);
    c.checkpoint = true;
    const Result checkpointed = train(shared_data(), c);
    EXPECT_EQ(plain.middle_forwards, 20);
    EXPECT_EQ(checkpointed.middle_forwards, 40);  // the recomputation ran
    EXPECT_TRUE(checkpointed.replicas_always_identical);
    EXPECT_EQ(checkpointed.stats.syncs, 20);
    EXPECT_EQ(count(checkpointed.stepped, false), 0);
    EXPECT_TRUE(checkpointed.params == plain.params) << "checkpointing changed the trained parameters";
    // Under no_sync() too: the checkpointed micro-batches' gradients accumulate, then reduce once.
    c.accumulate = 2;
    c.batch = 16;
    const Result accumulated = train(shared_data(), c);
    c.checkpoint = false;
    EXPECT_TRUE(accumulated.params == train(shared_data(), c).params) << "checkpointing changed the accumulated run";
    EXPECT_EQ(accumulated.stats.syncs, 20);
  }
}

// ---- Gradient accumulation ----------------------------------------------------------------------

TEST(DataParallelAccumulation, FourMicroBatchesWithOneSyncEqualTheUnaccumulatedRun) {
  for (Precision precision : {Precision::kFloat32, Precision::kAutocast}) {
    Config c{.precision = precision, .steps = 20, .batch = 16};
    const Result whole = train(shared_data(), c);
    c.accumulate = 4;
    const Result accumulated = train(shared_data(), c);
    EXPECT_TRUE(accumulated.replicas_always_identical);
    EXPECT_EQ(accumulated.stats.syncs, 20);  // one reduction per step, not per micro-batch
    EXPECT_EQ(count(accumulated.stepped, false), 0);
    const double diff = max_relative_difference(accumulated.params, whole.params);
    if (world().rank() == 0) std::printf("  accumulated vs whole batch: max relative difference %.3g\n", diff);
    EXPECT_LE(diff, precision == Precision::kFloat32 ? 1e-5 : 1e-2);
  }
}

TEST(DataParallelAccumulation, AnInfInOneRanksAccumulatingMicroBatchSkipsOnEveryRank) {
  const Result run = train(shared_data(), {.precision = Precision::kAutocast, .steps = 5, .batch = 16,
                                           .accumulate = 4, .on_input = [](int step, int micro, Tensor& x) {
                                             // under no_sync(): only this rank's local sum sees it
                                             if (step == 2 && micro == 1 && world().rank() == world().size() - 1) {
                                               x = x * std::numeric_limits<float>::infinity();
                                             }
                                           }});
  EXPECT_TRUE(run.replicas_always_identical);
  EXPECT_EQ(run.stepped, (std::vector<bool>{true, true, false, true, true}));
}

// ---- Errors on every rank -----------------------------------------------------------------------

TEST(DataParallelErrors, ModelsThatDifferAcrossRanksAreAnErrorOnEveryRank) {
  if (world().size() == 1) GTEST_SKIP() << "needs two ranks";
  const bool last = world().rank() == world().size() - 1;
  ag::nn::Sequential model{ag::nn::Linear(8, last ? 33 : 32), ag::nn::ReLU(), ag::nn::Linear(last ? 33 : 32, 1)};
  EXPECT_ERROR([&] { dist::DistributedDataParallel ddp(model, world()); }, "the ranks' models differ",
               "rank 0 has '0.weight: Tensor[32, 8] float32 cpu' where rank",
               " has '0.weight: Tensor[33, 8] float32 cpu' (entry 0;");
  ag::nn::Sequential typed = make_mlp(1);
  if (last) typed.to(DType::kFloat16);
  EXPECT_ERROR([&] { dist::DistributedDataParallel ddp(typed, world()); }, "float16");
}

// A module whose second layer never takes part in the loss.
class WithUnused : public ag::nn::Module {
 public:
  WithUnused()
      : used(register_module("used", ag::nn::Linear(8, 1))), unused(register_module("unused", ag::nn::Linear(8, 1))) {}
  Tensor forward(const Tensor& x) override { return used(x); }
  ag::nn::Linear used, unused;
};

TEST(DataParallelErrors, AParameterWithoutGradientIsReportedAtTheNextForward) {
  WithUnused model;
  dist::DistributedDataParallel ddp(model, world());
  const Tensor x = shared_data().batch_x(0, 4);
  ag::ops::sum(ddp(x)).backward();
  EXPECT_ERROR([&] { ddp(x); }, "produced no gradient for unused.weight, unused.bias", "2 of 4 parameters");
  // Frozen parameters are fine: they are neither reduced nor waited for.
  WithUnused frozen;
  frozen.unused.weight.set_requires_grad(false);
  frozen.unused.bias.set_requires_grad(false);
  dist::DistributedDataParallel ok(frozen, world());
  for (int i = 0; i < 2; ++i) ag::ops::sum(ok(x)).backward();
  EXPECT_EQ(ok.stats().syncs, 2);
}

TEST(DataParallelErrors, ASecondBackwardThroughTheSameForwardIsAnError) {
  ag::nn::Sequential model = make_mlp(1);
  dist::DistributedDataParallel ddp(model, world());
  const Tensor loss = ag::ops::sum(ddp(shared_data().batch_x(0, 4)));
  loss.backward(Tensor(), ag::RetainGraph::kYes);
  EXPECT_ERROR([&] { loss.backward(); }, "after this forward's gradients were already averaged");
  // The inner module's own backward after a synchronised one is caught the same way; under
  // no_sync() it is fine (that is gradient accumulation).
  EXPECT_ERROR([&] { ag::ops::sum(model(shared_data().batch_x(0, 4))).backward(); }, "already averaged");
  {
    auto no_sync = ddp.no_sync();
    ag::ops::sum(model(shared_data().batch_x(0, 4))).backward();
  }
}

TEST(DataParallelErrors, BadOptionsAreRejected) {
  ag::nn::Sequential model = make_mlp(1);
  EXPECT_ERROR([&] { dist::DistributedDataParallel ddp(model, world(), {.bucket_cap_mb = 0}); }, "bucket caps");
}

// ---- Checkpoints and the sampler ----------------------------------------------------------------

std::string checkpoint_path() {
  // One name for every rank: rank 0 writes it and all read it (Bazel gives each test its own TEST_TMPDIR).
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/ddp_resume_" + std::to_string(world().size()) + ".safetensors";
}

// `steps` steps of AMP training on sampler shards with per-rank input noise from the global
// generator (so resuming must restore each rank's own generator too).
void train_on_shards(ag::nn::Module& net, ag::optim::Optimizer& opt, ag::amp::GradScaler& scaler, int first_step,
                     int steps) {
  const Data& data = shared_data();
  dist::DistributedSampler sampler(data.rows(), world(), {.seed = 5});
  for (int step = first_step; step < first_step + steps; ++step) {
    sampler.set_epoch(step);  // a short "epoch" per step keeps the test small
    const std::vector<int64_t> idx = sampler.indices();
    std::vector<float> xs, ys;
    for (int k = 0; k < 8; ++k) {
      const int64_t i = idx[static_cast<size_t>(k)];
      xs.insert(xs.end(), data.x.begin() + i * data.in, data.x.begin() + (i + 1) * data.in);
      ys.push_back(data.y[static_cast<size_t>(i)]);
    }
    const Tensor x = Tensor::from_vector(xs, {8, data.in}) + ag::randn({8, data.in}) * 0.01f;
    const Tensor y = Tensor::from_vector(ys, {8, 1});
    opt.zero_grad();
    Tensor loss;
    {
      ag::amp::AutocastGuard autocast(ag::Device::kCPU, DType::kFloat16);
      loss = ag::ops::mse_loss(net(x), y);
    }
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
  }
}

TEST(DataParallelCheckpoint, RankZeroWritesEveryRankLoadsAndTheResumeIsBitExact) {
  const std::string path = checkpoint_path();
  shared_data();  // made (and seeded) before the per-rank seeds below
  ag::nn::Sequential model = make_mlp(3);
  dist::DistributedDataParallel ddp(model, world());
  ag::manual_seed(1000 + world().rank());  // each rank its own noise (after make_mlp, which seeds)
  ag::optim::Adam opt(model.parameters(), {.lr = 1e-2});
  ag::amp::GradScaler scaler({.init_scale = 1024, .growth_interval = 3});
  train_on_shards(ddp, opt, scaler, 0, 5);
  dist::save_checkpoint(path, {.model = &ddp, .optimizer = &opt, .scaler = &scaler, .user_metadata = {{"step", "5"}}},
                        world());
  train_on_shards(ddp, opt, scaler, 5, 5);
  const std::vector<std::vector<double>> uninterrupted = snapshot(model);

  // A fresh job state (other weights, other generator), resumed from the file.
  ag::nn::Sequential model2 = make_mlp(4);
  dist::DistributedDataParallel ddp2(model2, world());
  ag::manual_seed(77);
  ag::optim::Adam opt2(model2.parameters(), {.lr = 1e-2});
  ag::amp::GradScaler scaler2;
  ag::checkpoint::TrainingState state{.model = &ddp2, .optimizer = &opt2, .scaler = &scaler2};
  dist::load_checkpoint(path, state, world());
  EXPECT_EQ(state.user_metadata, (std::map<std::string, std::string>{{"step", "5"}}));  // reserved keys removed
  train_on_shards(ddp2, opt2, scaler2, 5, 5);
  EXPECT_EQ(snapshot(model2), uninterrupted);
  EXPECT_TRUE(replicas_identical(model2));
}

TEST(DataParallelCheckpoint, FailuresAreErrorsOnEveryRank) {
  ag::nn::Sequential model = make_mlp(3);
  EXPECT_ERROR([&] { dist::save_checkpoint("/nonexistent/dir/x.safetensors", {.model = &model}, world()); },
               "save_checkpoint(/nonexistent/dir/x.safetensors) failed: rank 0: ", "rank 0 writes the file");
  // Only the last rank's file is missing: every rank reports it.
  const std::string path = checkpoint_path() + ".missing";
  dist::save_checkpoint(path, {.model = &model}, world());
  world().barrier();
  const std::string mine = world().rank() == world().size() - 1 ? path + ".elsewhere" : path;
  ag::checkpoint::TrainingState state{.model = &model};
  EXPECT_ERROR([&] { dist::load_checkpoint(mine, state, world()); }, "load_checkpoint(",
               "rank " + std::to_string(world().size() - 1) + ": ", "every rank must be able to read the path");
}

TEST(DistributedSamplerJob, ShardsAreDisjointAndCoverTheDataSetEveryEpoch) {
  for (int64_t size : {100, 101, 7}) {
    dist::DistributedSampler sampler(size, world());
    for (int64_t epoch : {0, 1}) {
      sampler.set_epoch(epoch);
      const std::vector<int64_t> mine = sampler.indices();
      const std::vector<std::string> all = world().all_gather_bytes(
          std::string(reinterpret_cast<const char*>(mine.data()), mine.size() * sizeof(int64_t)));
      std::multiset<int64_t> seen;
      for (const std::string& bytes : all) {
        const auto* p = reinterpret_cast<const int64_t*>(bytes.data());
        seen.insert(p, p + bytes.size() / sizeof(int64_t));
        EXPECT_EQ(static_cast<int64_t>(bytes.size() / sizeof(int64_t)), sampler.size());
      }
      for (int64_t i = 0; i < size; ++i) EXPECT_GE(seen.count(i), 1u) << "index " << i << " epoch " << epoch;
      // Padding repeats at most world size - 1 indices.
      EXPECT_EQ(static_cast<int64_t>(seen.size()), sampler.size() * world().size());
      EXPECT_LT(static_cast<int64_t>(seen.size()) - size, world().size());
    }
  }
}

}  // namespace
