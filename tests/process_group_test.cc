// ProcessGroupMPI as an MPI job (2 and 4 ranks): all-reduce sum/avg/max in float32, float64 and
// float16 against values computed here, broadcast, barrier, async collectives in flight together,
// results bit-identical on every rank, reduce-scatter and all-gather, and mismatched arguments as an
// Error on every rank.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "distributed/process_group.h"
#include "framework/dtype.h"
#include "framework/error.h"
#include "framework/tensor.h"
#include "framework/tensor_impl.h"
#include "framework/copy.h"
#include "test_util.h"

namespace ag = ampgrad;
namespace dist = ampgrad::distributed;
using ag::DType;
using ag::Tensor;

namespace {

dist::ProcessGroup& world() { return dist::default_group(); }

// Rank r holds {r + 1, 2 (r + 1), -(r + 1), 0.5}: small integers, exact in every dtype.
Tensor rank_values(DType dtype) {
  const float v = static_cast<float>(world().rank() + 1);
  return Tensor::from_vector(std::vector<float>{v, 2 * v, -v, 0.5f}, {2, 2}, dtype);
}

// The bytes of every rank's copy of `t`, so tests can require bit-identical results.
std::vector<std::string> gather_bytes(const Tensor& t) {
  const std::string mine(static_cast<const char*>(t.data_ptr()), t.numel() * ag::element_size(t.dtype()));
  return world().all_gather_bytes(mine);
}

TEST(ProcessGroup, RankAndSizeMatchTheJob) {
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  ASSERT_NE(size, nullptr) << "not started by mpirun";
  EXPECT_EQ(world().size(), std::atoi(size));
  EXPECT_EQ(world().rank(), std::atoi(std::getenv("OMPI_COMM_WORLD_RANK")));
  EXPECT_EQ(dist::get_rank(), world().rank());
  EXPECT_EQ(dist::get_world_size(), world().size());
  EXPECT_EQ(world().backend(), dist::Backend::kMPI);
  EXPECT_EQ(world().device(), ag::Device::kCPU);
}

TEST(ProcessGroup, AllReduceSumAvgMaxInEveryDtype) {
  const int n = world().size();
  const double s = n * (n + 1) / 2.0;  // sum of r + 1 over ranks
  for (DType dtype : ag::kFloatingDTypes) {
    SCOPED_TRACE(ag::dtype_name(dtype));
    Tensor sum = rank_values(dtype), avg = rank_values(dtype), max = rank_values(dtype);
    world().all_reduce(sum, dist::ReduceOp::kSum);
    world().all_reduce(avg, dist::ReduceOp::kAvg);
    world().all_reduce(max, dist::ReduceOp::kMax);
    EXPECT_EQ(sum.to_double_vector(), (std::vector<double>{s, 2 * s, -s, 0.5 * n}));
    EXPECT_EQ(avg.to_double_vector(), (std::vector<double>{s / n, 2 * s / n, -s / n, 0.5}));
    EXPECT_EQ(max.to_double_vector(), (std::vector<double>{1.0 * n, 2.0 * n, -1, 0.5}));
    EXPECT_EQ(sum.dtype(), dtype);
  }
}

// A tensor of any rank a tensor may have takes part (checked and unchecked), and a mismatch in
// its 25th dimension is found and named.
TEST(ProcessGroup, TensorsOfEveryRankReduceAndBroadcast) {
  ag::Shape nine(9, 1);
  nine[8] = 4;
  Tensor t = Tensor::from_vector(std::vector<float>{1, 2, 3, 4}, nine);
  world().all_reduce(t, dist::ReduceOp::kSum);
  const auto n = static_cast<float>(world().size());
  EXPECT_EQ(t.to_vector(), (std::vector<float>{n, 2 * n, 3 * n, 4 * n}));
  EXPECT_EQ(t.shape(), nine);
  Tensor most = ag::full(ag::Shape(ag::kMaxDims, 1), world().rank() + 1.0);
  world().broadcast(most, 0);
  EXPECT_EQ(most.to_vector(), std::vector<float>{1.0f});
  ag::Shape last(ag::kMaxDims, 1);
  if (world().rank() == 1) last.back() = 2;
  Tensor mismatched = ag::ones(last);
  EXPECT_ERROR([&] { world().all_reduce(mismatched, dist::ReduceOp::kSum); }, "do not match",
               ", 1, 1] float32 cpu", ", 1, 2] float32 cpu");
}

TEST(ProcessGroup, Int64SumMaxAndBroadcastButNoAverage) {
  const int n = world().size(), r = world().rank();
  Tensor t = Tensor::from_vector(std::vector<int64_t>{r, int64_t{1} << 40, -r}, {3});
  Tensor m = Tensor::from_vector(std::vector<int64_t>{1}, {1});
  world().all_reduce(t, dist::ReduceOp::kSum);
  EXPECT_EQ(t.to_double_vector(), (std::vector<double>{n * (n - 1) / 2.0, n * 0x1p40, -n * (n - 1) / 2.0}));
  Tensor mx = Tensor::from_vector(std::vector<int64_t>{r, -r}, {2});
  world().all_reduce(mx, dist::ReduceOp::kMax);
  EXPECT_EQ(mx.to_double_vector(), (std::vector<double>{n - 1.0, 0.0}));
  Tensor b = Tensor::from_vector(std::vector<int64_t>{r + 100}, {1});
  world().broadcast(b, n - 1);
  EXPECT_EQ(b.to_double_vector(), (std::vector<double>{n + 99.0}));
  EXPECT_ERROR([&] { world().all_reduce(m, dist::ReduceOp::kAvg); }, "kAvg needs a floating dtype");
}

TEST(ProcessGroup, Float16AverageDividesFirstSoItCannotOverflowWhereTheSumWould) {
  // 60000 on every rank: the sum (>= 120000) overflows float16 (max 65504), the average does not.
  Tensor avg = ag::full({3}, 60000.0, DType::kFloat16);
  world().all_reduce(avg, dist::ReduceOp::kAvg);
  EXPECT_EQ(avg.to_vector(), (std::vector<float>{60000, 60000, 60000}));
  Tensor sum = ag::full({3}, 60000.0, DType::kFloat16);
  world().all_reduce(sum, dist::ReduceOp::kSum);
  EXPECT_TRUE(std::isinf(sum.to_vector()[0]));  // a float16 sum overflows as float16 does
}

TEST(ProcessGroup, InfAndNaNPropagateThroughEveryReduction) {
  const float kInf = std::numeric_limits<float>::infinity();
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (dist::ReduceOp op : {dist::ReduceOp::kSum, dist::ReduceOp::kAvg, dist::ReduceOp::kMax}) {
      SCOPED_TRACE(std::string(ag::dtype_name(dtype)) + " " + std::string(dist::reduce_op_name(op)));
      // Only the last rank has the inf and the NaN: every rank must see them.
      const bool last = world().rank() == world().size() - 1;
      Tensor t = Tensor::from_vector(std::vector<float>{last ? kInf : 1.0f, last ? NAN : 1.0f, 1.0f}, {3}, dtype);
      world().all_reduce(t, op);
      const std::vector<float> v = t.to_vector();
      EXPECT_TRUE(std::isinf(v[0]));
      EXPECT_TRUE(std::isnan(v[1]));
      EXPECT_TRUE(std::isfinite(v[2]));
    }
  }
}

TEST(ProcessGroup, ResultsAreBitIdenticalOnEveryRank) {
  // Random values (different per rank) summed in an order MPI picks: every rank must still get
  // the same bits, or data-parallel replicas would drift apart.
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(ag::dtype_name(dtype));
    ag::manual_seed(100 + world().rank());
    Tensor t = ag::randn({1000, 37}, dtype);
    world().all_reduce(t, dist::ReduceOp::kAvg);
    const std::vector<std::string> copies = gather_bytes(t);
    for (size_t r = 1; r < copies.size(); ++r) EXPECT_EQ(copies[r], copies[0]) << "rank " << r << " differs";
  }
}

TEST(ProcessGroup, BroadcastFromEveryRoot) {
  for (int root = 0; root < world().size(); ++root) {
    for (DType dtype : ag::kFloatingDTypes) {
      Tensor t = rank_values(dtype);
      world().broadcast(t, root);
      const float v = static_cast<float>(root + 1);
      EXPECT_EQ(t.to_vector(), (std::vector<float>{v, 2 * v, -v, 0.5f})) << "root " << root;
    }
  }
}

TEST(ProcessGroup, ManyCollectivesInFlightCompleteInAnyWaitOrder) {
  std::vector<Tensor> tensors;
  std::vector<std::shared_ptr<dist::Work>> works;
  for (int i = 0; i < 20; ++i) {
    tensors.push_back(ag::full({1000 + i}, i + world().rank(), i % 2 ? DType::kFloat16 : DType::kFloat32));
    works.push_back(world().all_reduce_async(tensors.back(), dist::ReduceOp::kSum));
  }
  for (int i = 19; i >= 0; --i) works[i]->wait();
  const int n = world().size();
  for (int i = 0; i < 20; ++i) {
    EXPECT_TRUE(works[i]->is_completed());
    EXPECT_EQ(tensors[i].to_vector()[999], static_cast<float>(n * i + n * (n - 1) / 2)) << "collective " << i;
  }
}

TEST(ProcessGroup, WaitBumpsTheTensorVersion) {
  Tensor t = ag::ones({4});
  const uint64_t before = t.version();
  world().all_reduce(t, dist::ReduceOp::kSum);
  EXPECT_GT(t.version(), before);  // caches keyed on the version see the new values
  // Reduce-scatter and all-gather bump what they write, not what they read (an optimizer keyed on
  // the version of what it sends would otherwise think it changed).
  for (DType dtype : {DType::kFloat32, DType::kFloat16}) {
    const int n = world().size();
    Tensor whole = ag::ones({2 * n}, dtype), part = ag::ones({2}, dtype);
    const uint64_t whole_before = whole.version(), part_before = part.version();
    world().reduce_scatter(part, whole, dist::ReduceOp::kAvg);
    EXPECT_EQ(whole.version(), whole_before);
    EXPECT_GT(part.version(), part_before);
    const uint64_t part_after = part.version();
    world().all_gather(whole, part);
    EXPECT_EQ(part.version(), part_after);
    EXPECT_GT(whole.version(), whole_before);
  }
}

TEST(ProcessGroup, BarrierAndHostCollectives) {
  world().barrier();
  const int n = world().size(), r = world().rank();
  EXPECT_EQ(world().all_reduce_int(r + 1, dist::ReduceOp::kSum), n * (n + 1) / 2);
  EXPECT_EQ(world().all_reduce_int(r, dist::ReduceOp::kMax), n - 1);
  const std::vector<std::string> all = world().all_gather_bytes(std::string(static_cast<size_t>(r), 'x'));
  ASSERT_EQ(all.size(), static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) EXPECT_EQ(all[i], std::string(static_cast<size_t>(i), 'x'));
}

TEST(ProcessGroup, MismatchedArgumentsAreAnErrorOnEveryRankAndTheGroupStaysUsable) {
  const bool odd = world().rank() % 2 == 1;
  // Shapes differ on odd ranks: every rank throws, naming each rank's tensor.
  Tensor t = ag::ones({odd ? 5 : 4});
  EXPECT_ERROR([&] { world().all_reduce(t, dist::ReduceOp::kSum); }, "do not match", "rank 0: Tensor[4] float32 cpu",
               "rank 1: Tensor[5] float32 cpu");
  EXPECT_EQ(t.to_vector()[0], 1.0f);  // nothing was reduced
  // Dtypes, ops and roots are checked the same way.
  Tensor d = ag::ones({4}, odd ? DType::kFloat16 : DType::kFloat32);
  EXPECT_ERROR([&] { world().all_reduce(d, dist::ReduceOp::kSum); }, "do not match", "float16");
  Tensor o = ag::ones({4});
  EXPECT_ERROR([&] { world().all_reduce(o, odd ? dist::ReduceOp::kMax : dist::ReduceOp::kSum); }, "(max)", "(sum)");
  EXPECT_ERROR([&] { world().broadcast(o, odd ? 1 : 0); }, "root 0", "root 1");
  // An undefined tensor on one rank is an error everywhere, with what that rank passed.
  Tensor u = world().rank() == 1 ? Tensor() : ag::ones({4});
  EXPECT_ERROR([&] { world().all_reduce(u, dist::ReduceOp::kSum); }, "rank 1: an undefined tensor [unusable]");
  // The group still works.
  Tensor ok = ag::ones({4});
  world().all_reduce(ok, dist::ReduceOp::kSum);
  EXPECT_EQ(ok.to_vector()[0], static_cast<float>(world().size()));
}

// Reduce-scatter: rank r gets the reduction of part r of every rank's input (torch's
// reduce_scatter_tensor); all-gather: every rank gets every rank's part, in rank order
// (all_gather_into_tensor). Small integers, so every dtype's result is exact.
TEST(ProcessGroup, ReduceScatterSumAvgMaxAndAllGatherInEveryDtype) {
  const int n = world().size(), r = world().rank();
  constexpr int64_t kPart = 3;
  // Rank q's input element i is (q + 1) * (i + 1): part r holds i in [3r, 3r + 3).
  std::vector<float> whole;
  for (int64_t i = 0; i < kPart * n; ++i) whole.push_back(static_cast<float>((r + 1) * (i + 1)));
  const double s = n * (n + 1) / 2.0;
  for (DType dtype : ag::kFloatingDTypes) {
    SCOPED_TRACE(ag::dtype_name(dtype));
    const Tensor input = Tensor::from_vector(whole, {kPart * n}, dtype);
    for (dist::ReduceOp op : {dist::ReduceOp::kSum, dist::ReduceOp::kAvg, dist::ReduceOp::kMax}) {
      Tensor out = Tensor::empty({kPart}, dtype);
      world().reduce_scatter(out, input, op);
      std::vector<double> expected;
      for (int64_t i = r * kPart; i < (r + 1) * kPart; ++i) {
        const double k = static_cast<double>(i + 1);
        expected.push_back(op == dist::ReduceOp::kSum ? s * k : op == dist::ReduceOp::kAvg ? s * k / n : n * k);
      }
      EXPECT_EQ(out.to_double_vector(), expected) << dist::reduce_op_name(op);
    }
    EXPECT_EQ(input.to_vector(), whole);  // the input is left as it was (kAvg divides a copy)
    const Tensor mine = Tensor::from_vector(std::vector<float>{r + 1.0f, -(r + 1.0f)}, {2}, dtype);
    Tensor all = Tensor::empty({2 * n}, dtype);
    world().all_gather(all, mine);
    std::vector<double> expected;
    for (int q = 0; q < n; ++q) expected.insert(expected.end(), {q + 1.0, -(q + 1.0)});
    EXPECT_EQ(all.to_double_vector(), expected);
    // In place: the input is this rank's part of the output (what ZeRO's flat buffers gather).
    Tensor flat = ag::full({2 * n}, 7.0, dtype);
    Tensor part = ag::alias_elements(flat, 2 * r, {2});
    ag::copy_(part, mine);
    world().all_gather(flat, part);
    EXPECT_EQ(flat.to_double_vector(), expected);
  }
}

TEST(ProcessGroup, ReduceScatterOfRandomValuesIsTheAverageAndAllGatherCopiesIt) {
  // Random inputs (rank q's from seed 200 + q, so every rank can make all of them): each shard is
  // the float64 average to the dtype's rounding, and the gather puts every shard's bits in place.
  const int n = world().size(), r = world().rank();
  constexpr int64_t kPart = 1000;
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(ag::dtype_name(dtype));
    std::vector<double> average(static_cast<size_t>(n * kPart), 0.0);
    Tensor input;
    for (int q = 0; q < n; ++q) {
      ag::manual_seed(200 + q);
      const Tensor t = ag::randn({n * kPart}, dtype);
      if (q == r) input = t;
      const std::vector<double> v = t.to_double_vector();
      for (size_t i = 0; i < v.size(); ++i) average[i] += v[i] / n;
    }
    Tensor shard = Tensor::empty({kPart}, dtype);
    world().reduce_scatter(shard, input, dist::ReduceOp::kAvg);
    const std::vector<double> part = shard.to_double_vector();
    const double tolerance = dtype == DType::kFloat32 ? 1e-6 : dtype == DType::kFloat16 ? 4e-3 : 3e-2;
    for (int64_t i = 0; i < kPart; ++i) {
      ASSERT_NEAR(part[i], average[r * kPart + i], tolerance * (1 + std::abs(average[r * kPart + i]))) << i;
    }
    Tensor gathered = Tensor::empty({n * kPart}, dtype);
    world().all_gather(gathered, shard);
    const std::vector<std::string> shards = gather_bytes(shard);
    std::string expected;
    for (const std::string& b : shards) expected += b;
    EXPECT_EQ(gather_bytes(gathered)[static_cast<size_t>(r)], expected);
  }
}

TEST(ProcessGroup, ReduceScatterAndAllGatherMismatchesAreErrorsOnEveryRank) {
  const int n = world().size();
  const bool odd = world().rank() % 2 == 1;
  // A part of the wrong size on odd ranks: every rank throws, and odd ranks name the problem.
  Tensor input = ag::ones({4 * n});
  Tensor part = ag::ones({odd ? 3 : 4});
  if (odd) {
    EXPECT_ERROR([&] { world().reduce_scatter(part, input, dist::ReduceOp::kSum); }, "reduce_scatter(sum)",
                 "1/size of its elements", "pad the whole");
  } else {
    EXPECT_ERROR([&] { world().reduce_scatter(part, input, dist::ReduceOp::kSum); }, "rank 1: Tensor[",
                 "1/size of its elements");
  }
  EXPECT_ERROR([&] { world().all_gather(input, part); }, "all_gather", "1/size of its elements");
  // Wholes that differ across ranks, and a part of another dtype.
  Tensor whole = ag::ones({(odd ? 5 : 4) * n});
  Tensor fits = ag::ones({odd ? 5 : 4});
  EXPECT_ERROR([&] { world().reduce_scatter(fits, whole, dist::ReduceOp::kAvg); }, "do not match");
  Tensor half = ag::ones({4}, DType::kFloat16);
  EXPECT_ERROR([&] { world().all_gather(input, half); }, "1/size of its elements");
  Tensor counts = Tensor::from_vector(std::vector<int64_t>(static_cast<size_t>(2 * n), 1), {2 * n});
  Tensor count = Tensor::from_vector(std::vector<int64_t>{0, 0}, {2});
  EXPECT_ERROR([&] { world().reduce_scatter(count, counts, dist::ReduceOp::kAvg); }, "kAvg needs a floating dtype");
  // Unchecked, a bad part is still this rank's error, before anything is sent.
  EXPECT_ERROR([&] { world().all_gather_async(input, half, dist::CheckAcrossRanks::kNo); }, "1/size of its elements");
  // A part that shares bytes with the whole anywhere but at this rank's own part of an all-gather's
  // output (it would be read while it is written), and a reduce-scatter in place: refused on every
  // rank, before anything is sent.
  const int r = world().rank();
  Tensor flat = ag::zeros({4 * n});
  Tensor shifted = ag::alias_elements(flat, r + 1 == n ? 4 * r - 1 : 4 * r + 1, {4});  // one element off its part
  EXPECT_ERROR([&] { world().all_gather(flat, shifted); }, "shares bytes with the whole");
  EXPECT_ERROR([&] { world().all_gather_async(flat, shifted, dist::CheckAcrossRanks::kNo); },
               "shares bytes with the whole", "alias_elements(output, rank * part");
  Tensor own = ag::alias_elements(flat, 4 * r, {4});
  EXPECT_ERROR([&] { world().reduce_scatter(own, flat, dist::ReduceOp::kSum); }, "shares bytes with the whole");
  // In place on some ranks only: MPI_IN_PLACE is all or none, so the check compares it.
  if (n > 1) {
    Tensor separate = ag::ones({4});
    EXPECT_ERROR([&] { world().all_gather(flat, odd ? own : separate); }, "do not match", "(in place)");
  }
  // The group still works.
  world().reduce_scatter(count, counts, dist::ReduceOp::kSum);
  EXPECT_EQ(count.to_double_vector(), (std::vector<double>{1.0 * n, 1.0 * n}));
}

TEST(ProcessGroup, BadLocalArgumentsAreErrors) {
  Tensor t = ag::ones({4});
  EXPECT_ERROR([&] { world().broadcast(t, world().size()); }, "root must be in [0, ");
  Tensor undefined;
  EXPECT_ERROR([&] { world().all_reduce_async(undefined, dist::ReduceOp::kSum, dist::CheckAcrossRanks::kNo); },
               "undefined");
}

TEST(ProcessGroup, TimeoutComesFromTheEnvironment) {
  EXPECT_EQ(world().timeout_seconds(), dist::default_timeout_seconds());
  EXPECT_EQ(dist::default_timeout_seconds(), std::atof(std::getenv("AMPGRAD_DISTRIBUTED_TIMEOUT")));
}

}  // namespace
