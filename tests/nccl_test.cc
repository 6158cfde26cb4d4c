// The NCCL process group as a single-rank job on one GPU (NCCL refuses two ranks on one GPU):
// its collectives (reduce-scatter and all-gather, out of place and in place), a device mismatch in
// either direction, and DistributedDataParallel and ZeroRedundancyOptimizer (stages 1 and 2) on
// CUDA matching plain training bit for bit. Skips without NCCL in the build or without a GPU.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "amp/autocast.h"
#include "amp/grad_scaler.h"
#include "distributed/data_parallel.h"
#include "distributed/process_group.h"
#include "distributed/zero_redundancy_optimizer.h"
#include "framework/copy.h"
#include "framework/device.h"
#include "framework/tensor_impl.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "ops/ops.h"
#include "optim/adam.h"
#include "test_util.h"

#if defined(AMPGRAD_WITH_NCCL)
#include "distributed/process_group_nccl.h"
#endif

namespace ag = ampgrad;
namespace dist = ampgrad::distributed;
using ag::Device;
using ag::DType;
using ag::Tensor;

namespace {

#if defined(AMPGRAD_WITH_NCCL)

// One group for the whole binary (MPI starts once per process, as a single-rank job).
dist::ProcessGroup& nccl() {
  static std::shared_ptr<dist::ProcessGroup> group = dist::new_group(dist::Backend::kNCCL);
  return *group;
}

#define REQUIRE_GPU()                                                                        \
  do {                                                                                       \
    if (!ag::cuda_is_available()) GTEST_SKIP() << "no CUDA device (no GPU or no driver)"; \
  } while (false)

TEST(Nccl, CollectivesOnOneRank) {
  REQUIRE_GPU();
  ASSERT_EQ(nccl().size(), 1);
  EXPECT_EQ(nccl().device(), Device::kCUDA);
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kFloat64}) {
    for (dist::ReduceOp op : {dist::ReduceOp::kSum, dist::ReduceOp::kAvg, dist::ReduceOp::kMax}) {
      Tensor t = Tensor::from_vector(std::vector<float>{1, -2, 0.5f, 3}, {2, 2}, dtype, Device::kCUDA);
      nccl().all_reduce(t, op);  // one rank: every reduction is the identity
      EXPECT_EQ(t.to_vector(), (std::vector<float>{1, -2, 0.5f, 3})) << ag::dtype_name(dtype);
    }
  }
  Tensor b = ag::full({5}, 7.0, DType::kFloat32, Device::kCUDA);
  nccl().broadcast(b, 0);
  EXPECT_EQ(b.to_vector(), std::vector<float>(5, 7.0f));
  nccl().barrier();
  EXPECT_EQ(nccl().all_reduce_int(3, dist::ReduceOp::kSum), 3);
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    const Tensor values = Tensor::from_vector(std::vector<float>{1, -2, 0.5f, 3}, {4}, dtype, Device::kCUDA);
    Tensor out = ag::zeros({4}, dtype, Device::kCUDA);
    nccl().reduce_scatter(out, values, dist::ReduceOp::kAvg);
    EXPECT_EQ(out.to_vector(), values.to_vector()) << ag::dtype_name(dtype);
    Tensor gathered = ag::zeros({4}, dtype, Device::kCUDA);
    nccl().all_gather(gathered, values);
    EXPECT_EQ(gathered.to_vector(), values.to_vector()) << ag::dtype_name(dtype);
    // In place, as ZeRO's flat buffers gather: the input is the output's own (only) part.
    Tensor flat = ag::full({4}, 7.0, dtype, Device::kCUDA);
    Tensor part = ag::alias_elements(flat, 0, {4});
    ag::copy_(part, values);
    nccl().all_gather(flat, part);
    EXPECT_EQ(flat.to_vector(), values.to_vector()) << ag::dtype_name(dtype);
  }
}

TEST(Nccl, TensorsOnTheWrongDeviceAreErrors) {
  REQUIRE_GPU();
  Tensor cpu = ag::ones({4});
  EXPECT_ERROR([&] { nccl().all_reduce(cpu, dist::ReduceOp::kSum); }, "an NCCL group reduces cuda tensors",
               "Backend::kMPI for CPU tensors");
  std::shared_ptr<dist::ProcessGroup> mpi = dist::new_group(dist::Backend::kMPI);
  Tensor gpu = ag::ones({4}, DType::kFloat32, Device::kCUDA);
  EXPECT_ERROR([&] { mpi->all_reduce(gpu, dist::ReduceOp::kSum); }, "an MPI group reduces cpu tensors",
               "Backend::kNCCL for CUDA tensors");
  ag::nn::Sequential model{ag::nn::Linear(4, 2)};
  EXPECT_ERROR([&] { dist::DistributedDataParallel ddp(model, nccl()); }, "is on cpu", "reduces cuda tensors");
}

// AMP training on the GPU: plain, under DistributedDataParallel, or with ZeroRedundancyOptimizer
// at stage 1 or 2. With one rank the average is the identity and the shard is the whole model, so
// neither wrapper may change a bit.
enum class Wrapper { kNone, kDataParallel, kZero1, kZero2 };

std::vector<std::vector<double>> train_cuda(Wrapper wrapper) {
  const bool wrapped = wrapper == Wrapper::kDataParallel;
  const bool zero = wrapper == Wrapper::kZero1 || wrapper == Wrapper::kZero2;
  ag::manual_seed(5);
  ag::nn::Sequential model{ag::nn::Linear(16, 64), ag::nn::ReLU(), ag::nn::Linear(64, 1)};
  model.to(Device::kCUDA);
  std::unique_ptr<dist::DistributedDataParallel> ddp;
  if (wrapped) ddp = std::make_unique<dist::DistributedDataParallel>(model, nccl(), dist::DataParallelOptions{
                                                                                    .first_bucket_cap_mb = 0.001});
  ag::nn::Module& net = ddp ? static_cast<ag::nn::Module&>(*ddp) : model;
  std::unique_ptr<ag::optim::Adam> plain;
  std::unique_ptr<dist::ZeroRedundancyOptimizer> sharded;
  if (zero) {
    sharded = std::make_unique<dist::ZeroRedundancyOptimizer>(
        model.parameters(), dist::shard_optimizer<ag::optim::Adam>({.lr = 1e-3}), nccl(),
        dist::ZeroOptions{.stage = wrapper == Wrapper::kZero1 ? 1 : 2, .first_bucket_cap_mb = 0.001});
  } else {
    plain = std::make_unique<ag::optim::Adam>(model.parameters(), ag::optim::Adam::Options{.lr = 1e-3});
  }
  ag::optim::Optimizer& opt = zero ? sharded->optimizer() : *plain;
  ag::amp::GradScaler scaler;
  for (int step = 0; step < 10; ++step) {
    const Tensor x = ag::randn({32, 16}).to(Device::kCUDA), y = ag::randn({32, 1}).to(Device::kCUDA);
    if (sharded) {
      sharded->zero_grad();
    } else {
      opt.zero_grad();
    }
    Tensor loss;
    {
      ag::amp::AutocastGuard autocast(Device::kCUDA, DType::kFloat16);
      loss = ag::ops::mse_loss(net(x), y);
    }
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
  }
  if (ddp) {
    EXPECT_EQ(ddp->stats().syncs, 10);
  }
  std::vector<std::vector<double>> out;
  for (const Tensor& p : model.parameters()) out.push_back(p.to_double_vector());
  return out;
}

TEST(Nccl, DataParallelOnOneGpuMatchesPlainTraining) {
  REQUIRE_GPU();
  EXPECT_EQ(train_cuda(Wrapper::kDataParallel), train_cuda(Wrapper::kNone));
}

TEST(Nccl, ZeroOnOneGpuMatchesPlainTraining) {
  REQUIRE_GPU();
  const auto plain = train_cuda(Wrapper::kNone);
  EXPECT_EQ(train_cuda(Wrapper::kZero1), plain) << "stage 1";
  EXPECT_EQ(train_cuda(Wrapper::kZero2), plain) << "stage 2";
}

#else

TEST(Nccl, NotInThisBuild) {
  EXPECT_ERROR([] { dist::new_group(dist::Backend::kNCCL); }, "this build has no NCCL backend");
}

#endif

}  // namespace
