// The parts of distributed/ that need no MPI job: bucket assignment (PyTorch's rules), the
// sampler's shards and per-epoch shuffles, the cross-rank argument check's messages, and the two
// timeouts (collectives, start-up).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <vector>

#include "distributed/buckets.h"
#include "distributed/collective_check.h"
#include "distributed/mpi_reduce.h"
#include "distributed/process_group.h"
#include "distributed/sampler.h"
#include "framework/tensor.h"
#include "test_util.h"

namespace ag = ampgrad;
namespace dist = ampgrad::distributed;
using ag::Device;
using ag::DType;

namespace {

constexpr int64_t kMiB = 1 << 20;

TEST(Buckets, ReverseOrderFirstBucketSmallThenCapped) {
  // Ten 400 KiB float32 parameters: the first bucket closes at >= 1 MiB (3 parameters), the next
  // ones at >= 2 MiB (6 parameters), the rest stays open.
  std::vector<dist::BucketParam> params(10, {.bytes = 400 * 1024, .dtype = DType::kFloat32, .device = Device::kCPU});
  const auto buckets = dist::assign_buckets(params, kMiB, 2 * kMiB);
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets[0], (std::vector<size_t>{9, 8, 7}));
  EXPECT_EQ(buckets[1], (std::vector<size_t>{6, 5, 4, 3, 2, 1}));
  EXPECT_EQ(buckets[2], (std::vector<size_t>{0}));
}

TEST(Buckets, DtypesNeverShareABucketAndEachHasItsOwnFirstCap) {
  std::vector<dist::BucketParam> params;
  for (int i = 0; i < 6; ++i) {
    params.push_back({.bytes = 600 * 1024, .dtype = i % 2 ? DType::kFloat16 : DType::kFloat32, .device = Device::kCPU});
  }
  const auto buckets = dist::assign_buckets(params, kMiB, 25 * kMiB);
  ASSERT_EQ(buckets.size(), 4u);
  EXPECT_EQ(buckets[0], (std::vector<size_t>{5, 3}));  // float16's first bucket: 1.2 MiB >= 1 MiB
  EXPECT_EQ(buckets[1], (std::vector<size_t>{4, 2}));  // float32's first bucket
  EXPECT_EQ(buckets[2], (std::vector<size_t>{1}));
  EXPECT_EQ(buckets[3], (std::vector<size_t>{0}));
  // Every parameter is in exactly one bucket.
  std::vector<size_t> all;
  for (const auto& b : buckets) all.insert(all.end(), b.begin(), b.end());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, (std::vector<size_t>{0, 1, 2, 3, 4, 5}));
}

TEST(Buckets, OneLargeParameterFillsABucketAlone) {
  std::vector<dist::BucketParam> params = {{.bytes = 100, .dtype = DType::kFloat32, .device = Device::kCPU},
                                           {.bytes = 100 * kMiB, .dtype = DType::kFloat32, .device = Device::kCPU},
                                           {.bytes = 100, .dtype = DType::kFloat32, .device = Device::kCPU}};
  const auto buckets = dist::assign_buckets(params, kMiB, 25 * kMiB);
  ASSERT_EQ(buckets.size(), 2u);
  EXPECT_EQ(buckets[0], (std::vector<size_t>{2, 1}));
  EXPECT_EQ(buckets[1], (std::vector<size_t>{0}));
  EXPECT_TRUE(dist::assign_buckets({}, kMiB, kMiB).empty());
}

std::vector<int64_t> all_ranks(int64_t size, int replicas, int64_t epoch, dist::DistributedSamplerOptions options) {
  std::vector<int64_t> out;
  for (int r = 0; r < replicas; ++r) {
    dist::DistributedSampler s(size, replicas, r, options);
    s.set_epoch(epoch);
    const auto mine = s.indices();
    EXPECT_EQ(static_cast<int64_t>(mine.size()), s.size());
    out.insert(out.end(), mine.begin(), mine.end());
  }
  return out;
}

TEST(Sampler, PadsOrDropsLikePyTorch) {
  // 10 samples on 4 ranks: ceil -> 3 each, 2 repeated; drop_last -> 2 each.
  dist::DistributedSampler padded(10, 4, 3, {.shuffle = false});
  EXPECT_EQ(padded.size(), 3);
  EXPECT_EQ(padded.indices(), (std::vector<int64_t>{3, 7, 1}));  // 0..9 then 0, 1: rank 3 takes 3, 7, 11 -> 1
  dist::DistributedSampler dropped(10, 4, 3, {.shuffle = false, .drop_last = true});
  EXPECT_EQ(dropped.indices(), (std::vector<int64_t>{3, 7}));
  std::vector<int64_t> all = all_ranks(10, 4, 0, {.shuffle = false, .drop_last = true});
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST(Sampler, ShufflesReproduciblyPerEpochAndSeed) {
  const auto e0 = all_ranks(1000, 3, 0, {.seed = 1});
  EXPECT_EQ(all_ranks(1000, 3, 0, {.seed = 1}), e0);  // reproducible
  EXPECT_NE(all_ranks(1000, 3, 1, {.seed = 1}), e0);  // a new order each epoch
  EXPECT_NE(all_ranks(1000, 3, 0, {.seed = 2}), e0);  // and per seed
  std::set<int64_t> covered(e0.begin(), e0.end());
  EXPECT_EQ(covered.size(), 1000u);  // a permutation: 1002 entries, 2 of them padding
  std::vector<int64_t> identity(1000);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_NE(std::vector<int64_t>(e0.begin(), e0.begin() + 1000), identity);
}

TEST(Sampler, BadArgumentsAreErrors) {
  EXPECT_ERROR([] { dist::DistributedSampler(10, 2, 2); }, "rank 2 is not in [0, num_replicas = 2)");
  EXPECT_ERROR([] { dist::DistributedSampler(-1, 2, 0); }, "dataset_size must be >= 0");
  EXPECT_ERROR([] { dist::DistributedSampler(1, 2, 0, {.drop_last = true}); }, "leave nothing for 2 ranks");
}

TEST(CollectiveCheck, NamesEveryRanksTensorAndTheDeviceHint) {
  namespace detail = dist::detail;
  const ag::Tensor t = ag::ones({2, 3});
  std::vector<detail::CollectiveRecord> records(2, detail::describe_collective(
                                                       detail::Collective::kAllReduce, 0, t, Device::kCPU,
                                                       &detail::mpi_supports));
  EXPECT_NO_THROW(detail::check_collective(records, "all_reduce", dist::Backend::kMPI, Device::kCPU));
  // A tensor on the wrong device (as a CUDA tensor given to an MPI group would be described).
  records[1].device = static_cast<int32_t>(Device::kCUDA);
  records[1].problem = static_cast<int32_t>(detail::Problem::kWrongDevice);
  EXPECT_ERROR([&] { detail::check_collective(records, "all_reduce", dist::Backend::kMPI, Device::kCPU); },
               "rank 0: Tensor[2, 3] float32 cpu (sum); rank 1: Tensor[2, 3] float32 cuda (sum) [unusable]",
               "an MPI group reduces cpu tensors; hint: use Backend::kNCCL for CUDA tensors");
  // Here on one rank, a group for the other device: the local check says the same.
  const auto wrong = detail::describe_collective(detail::Collective::kBroadcast, 0, t, Device::kCUDA,
                                                 &detail::mpi_supports);
  EXPECT_ERROR([&] { detail::check_local(wrong, "broadcast", dist::Backend::kNCCL, Device::kCUDA); },
               "Tensor[2, 3] float32 cpu (root 0)", "hint: use Backend::kMPI for CPU tensors");
}

// Start-up and collectives have separate deadlines: a short collective timeout (the failure test's
// 3 s) must not bound MPI's start-up on a busy machine.
TEST(Timeouts, StartupAndCollectivesAreSeparateAndComeFromTheirOwnVariables) {
  ::unsetenv("AMPGRAD_DISTRIBUTED_TIMEOUT");
  ::unsetenv("AMPGRAD_DISTRIBUTED_STARTUP_TIMEOUT");
  EXPECT_EQ(dist::collective_timeout({}), dist::kDefaultTimeoutSeconds);
  EXPECT_EQ(dist::startup_timeout({}), dist::kDefaultStartupTimeoutSeconds);
  ::setenv("AMPGRAD_DISTRIBUTED_TIMEOUT", "3", 1);
  EXPECT_EQ(dist::collective_timeout({}), 3.0);
  EXPECT_EQ(dist::startup_timeout({}), dist::kDefaultStartupTimeoutSeconds);  // untouched by the other
  ::setenv("AMPGRAD_DISTRIBUTED_STARTUP_TIMEOUT", "45.5", 1);
  EXPECT_EQ(dist::startup_timeout({}), 45.5);
  EXPECT_EQ(dist::startup_timeout({.timeout_seconds = 0, .startup_timeout_seconds = 7}), 7.0);  // options win
  EXPECT_EQ(dist::collective_timeout({.timeout_seconds = 2, .startup_timeout_seconds = 0}), 2.0);
  ::setenv("AMPGRAD_DISTRIBUTED_STARTUP_TIMEOUT", "soon", 1);
  EXPECT_ERROR([] { (void)dist::default_startup_timeout_seconds(); }, "AMPGRAD_DISTRIBUTED_STARTUP_TIMEOUT=soon",
               "seconds");
  ::unsetenv("AMPGRAD_DISTRIBUTED_TIMEOUT");
  ::unsetenv("AMPGRAD_DISTRIBUTED_STARTUP_TIMEOUT");
}

}  // namespace
