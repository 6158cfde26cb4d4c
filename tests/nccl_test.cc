// The NCCL process group as a single-rank job on one GPU (NCCL refuses two ranks on one GPU):
// its collectives, a device mismatch in either direction, and DistributedDataParallel on CUDA
// matching plain training bit for bit. Skips without NCCL in the build or without a GPU.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "amp/autocast.h"
#include "amp/grad_scaler.h"
#include "distributed/data_parallel.h"
#include "distributed/process_group.h"
#include "framework/device.h"
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

// AMP training on the GPU, wrapped or not: with one rank the average is the identity, so the
// wrapper must not change a bit.
std::vector<std::vector<double>> train_cuda(bool wrapped) {
  ag::manual_seed(5);
  ag::nn::Sequential model{ag::nn::Linear(16, 64), ag::nn::ReLU(), ag::nn::Linear(64, 1)};
  model.to(Device::kCUDA);
  std::unique_ptr<dist::DistributedDataParallel> ddp;
  if (wrapped) ddp = std::make_unique<dist::DistributedDataParallel>(model, nccl(), dist::DataParallelOptions{
                                                                                    .first_bucket_cap_mb = 0.001});
  ag::nn::Module& net = ddp ? static_cast<ag::nn::Module&>(*ddp) : model;
  ag::optim::Adam opt(model.parameters(), {.lr = 1e-3});
  ag::amp::GradScaler scaler;
  for (int step = 0; step < 10; ++step) {
    const Tensor x = ag::randn({32, 16}).to(Device::kCUDA), y = ag::randn({32, 1}).to(Device::kCUDA);
    opt.zero_grad();
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
  EXPECT_EQ(train_cuda(true), train_cuda(false));
}

#else

TEST(Nccl, NotInThisBuild) {
  EXPECT_ERROR([] { dist::new_group(dist::Backend::kNCCL); }, "this build has no NCCL backend");
}

#endif

}  // namespace
