// The CPU allocator: alignment, byte counters, and its per-thread cache of freed blocks (reused
// for the next tensor of the same size class, counted as reserved, returned at thread exit). The
// caching allocator behind CUDA and pinned memory over a fake device: reuse, the out-of-memory
// retry and hint, a failing release, blocks that are not yet reusable.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>

#include "framework/allocator.h"
#include "framework/caching_allocator.h"
#include "framework/autograd.h"
#include "framework/device.h"
#include "framework/dtype.h"
#include "framework/error.h"
#include "framework/parallel.h"
#include "framework/random.h"
#include "framework/tensor.h"

namespace ag = ampgrad;
using ag::Tensor;

namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kCaching = false;  // the cache is off under AddressSanitizer, so it sees every free
#else
constexpr bool kCaching = true;
#endif

TEST(CpuAllocator, BlocksAreAlignedAndCounted) {
  const ag::MemoryStats before = ag::memory_stats(ag::Device::kCPU);
  {
    const Tensor t = ag::zeros({3, 5});
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data<float>()) % ag::kCpuAlignment, 0u);
    const ag::MemoryStats during = ag::memory_stats(ag::Device::kCPU);
    EXPECT_EQ(during.current_bytes, before.current_bytes + 60);
    EXPECT_GE(during.peak_bytes, during.current_bytes);
    EXPECT_GE(during.reserved_bytes, during.current_bytes);
  }
  EXPECT_EQ(ag::memory_stats(ag::Device::kCPU).current_bytes, before.current_bytes);
}

TEST(CpuAllocator, FreedBlocksAreReusedForTheSameSizeClass) {
  if (!kCaching) GTEST_SKIP() << "no block cache under AddressSanitizer";
  for (const int64_t n : {int64_t{10}, int64_t{3000}, int64_t{700000}}) {  // 64 B class, power of two, large
    const void* first = nullptr;
    {
      const Tensor t = ag::zeros({n});
      first = t.data<float>();
    }
    const int64_t cached = ag::memory_stats(ag::Device::kCPU).reserved_bytes -
                           ag::memory_stats(ag::Device::kCPU).current_bytes;
    EXPECT_GE(cached, n * 4) << "the freed block is kept";
    const Tensor again = ag::zeros({n + 1});  // a slightly different size in the same class
    EXPECT_EQ(again.data<float>(), first) << n << " floats";
  }
}

TEST(CpuAllocator, SizeClassesWasteAtMostAQuarter) {
  // 513 KiB: a power-of-two class would take 1 MiB; quarter steps take 640 KiB.
  const ag::MemoryStats before = ag::memory_stats(ag::Device::kCPU);
  const int64_t floats = 513 * 1024 / 4;
  const Tensor t = ag::zeros({floats});
  const ag::MemoryStats during = ag::memory_stats(ag::Device::kCPU);
  EXPECT_LE(during.reserved_bytes - before.reserved_bytes, floats * 4 * 5 / 4);
  EXPECT_GE(during.reserved_bytes, during.current_bytes);
}

TEST(CpuAllocator, ThreadExitReturnsItsCachedBlocks) {
  if (!kCaching) GTEST_SKIP() << "no block cache under AddressSanitizer";
  const ag::MemoryStats before = ag::memory_stats(ag::Device::kCPU);
  std::thread([] {
    for (int i = 0; i < 10; ++i) ag::zeros({1000 + i * 1000});  // freed at once: cached by this thread
    EXPECT_GT(ag::memory_stats(ag::Device::kCPU).reserved_bytes, ag::memory_stats(ag::Device::kCPU).current_bytes);
  }).join();
  const ag::MemoryStats after = ag::memory_stats(ag::Device::kCPU);
  EXPECT_EQ(after.current_bytes, before.current_bytes);
  EXPECT_EQ(after.reserved_bytes - after.current_bytes, before.reserved_bytes - before.current_bytes);
}

TEST(CpuAllocator, TensorsFreedOnAnotherThreadJoinThatThreadsCache) {
  // A tensor made here and dropped on a worker thread: the block joins the worker's cache (it
  // stays reserved, not in use) and goes back to the system when the worker exits.
  Tensor t = ag::ones({5000});  // 20000 bytes in a 20480-byte block
  const ag::MemoryStats with_t = ag::memory_stats(ag::Device::kCPU);
  ag::MemoryStats on_worker;
  std::thread([&on_worker, t = std::move(t)]() mutable {
    t = Tensor();
    on_worker = ag::memory_stats(ag::Device::kCPU);
  }).join();
  EXPECT_EQ(on_worker.current_bytes, with_t.current_bytes - 20000);
  EXPECT_EQ(on_worker.reserved_bytes, with_t.reserved_bytes - (kCaching ? 0 : 20480)) << "kept by the worker";
  const ag::MemoryStats after = ag::memory_stats(ag::Device::kCPU);
  EXPECT_EQ(after.current_bytes, with_t.current_bytes - 20000);
  EXPECT_EQ(after.reserved_bytes, with_t.reserved_bytes - 20480) << "the worker's cache was not released at its exit";
  const Tensor u = ag::ones({5000});  // this thread's allocator is unaffected
  EXPECT_EQ(u.to_vector()[4999], 1.0f);
}

constexpr int64_t kMiB = int64_t{1} << 20;

// Bytes the CPU allocator holds that no live tensor uses.
int64_t cached_cpu_bytes() {
  const ag::MemoryStats s = ag::memory_stats(ag::Device::kCPU);
  return s.reserved_bytes - s.current_bytes;
}

TEST(CpuAllocator, ALargeBlockFreedOnOneThreadServesTheNextRequestOnAnother) {
  // Blocks over 1 MiB are cached process-wide: a pool thread's freed output is the next step's
  // buffer wherever that step asks for it.
  if (!kCaching) GTEST_SKIP() << "no block cache under AddressSanitizer";
  const void* freed = nullptr;
  std::thread([&] { freed = Tensor::empty({3 * kMiB / 4}).data<float>(); }).join();  // 3 MiB, freed at once
  const int64_t reserved = ag::memory_stats(ag::Device::kCPU).reserved_bytes;
  const Tensor again = Tensor::empty({3 * kMiB / 4});
  EXPECT_EQ(again.data<float>(), freed);
  EXPECT_EQ(ag::memory_stats(ag::Device::kCPU).reserved_bytes, reserved) << "taken from the cache, not the system";
}

TEST(CpuAllocator, TheLargeBlockCacheIsBoundedAndLetsTheOldestGoFirst) {
  // After empty_cache the bound is 256 MiB (the live peak is far below it). 160 distinct sizes of
  // 2 to 42 MiB, each freed at once, would cache 3.5 GB without a bound.
  if (!kCaching) GTEST_SKIP() << "no block cache under AddressSanitizer";
  ag::empty_cache(ag::Device::kCPU);
  const int64_t before = cached_cpu_bytes();
  const auto floats = [](int i) { return (2 * kMiB + i * kMiB / 4) / 4; };  // one 256 KiB class apart
  for (int i = 0; i < 160; ++i) Tensor::empty({floats(i)});
  const int64_t cached = cached_cpu_bytes() - before;
  EXPECT_LE(cached, 256 * kMiB);
  EXPECT_GT(cached, 200 * kMiB) << "the cache is used up to its bound";
  // The newest freed block is still cached; the oldest went back to the system.
  const int64_t reserved = ag::memory_stats(ag::Device::kCPU).reserved_bytes;
  {
    const Tensor newest = Tensor::empty({floats(159)});
    EXPECT_EQ(ag::memory_stats(ag::Device::kCPU).reserved_bytes, reserved);
  }
  {
    const Tensor oldest = Tensor::empty({floats(0)});
    EXPECT_EQ(ag::memory_stats(ag::Device::kCPU).reserved_bytes, reserved + floats(0) * 4);
  }
}

TEST(CpuAllocator, TheBoundGrowsWithTheLivePeakSoATrainingStepIsCachedWhole) {
  // A "step" that holds about 400 MiB at once in 30 blocks, then frees them: all of it stays cached
  // (the bound is the most ever live), and the next step takes every block from the cache.
  if (!kCaching) GTEST_SKIP() << "no block cache under AddressSanitizer";
  ag::empty_cache(ag::Device::kCPU);
  const auto step = [] {
    std::vector<Tensor> live;
    for (int i = 0; i < 30; ++i) live.push_back(Tensor::empty({(10 * kMiB + i * kMiB / 4) / 4}));
  };
  step();
  const int64_t reserved = ag::memory_stats(ag::Device::kCPU).reserved_bytes;
  EXPECT_GE(cached_cpu_bytes(), 300 * kMiB);
  for (int i = 0; i < 3; ++i) step();
  EXPECT_EQ(ag::memory_stats(ag::Device::kCPU).reserved_bytes, reserved) << "steps reuse, never grow";
}

TEST(CpuAllocator, EmptyCacheGivesTheCachedBlocksBack) {
  if (!kCaching) GTEST_SKIP() << "no block cache under AddressSanitizer";
  const Tensor kept = ag::ones({1000});
  ag::empty_cache(ag::Device::kCPU);
  const int64_t cached = cached_cpu_bytes();  // what other threads (the pool's) cache of small blocks
  { const Tensor large = Tensor::empty({8 * kMiB / 4}), small = Tensor::empty({1000}); }
  EXPECT_GE(cached_cpu_bytes(), cached + 8 * kMiB + 4000);
  const int64_t live = ag::memory_stats(ag::Device::kCPU).current_bytes;
  ag::empty_cache(ag::Device::kCPU);
  EXPECT_EQ(cached_cpu_bytes(), cached) << "this thread's blocks and every large one went back";
  EXPECT_EQ(ag::memory_stats(ag::Device::kCPU).current_bytes, live) << "live tensors are untouched";
  EXPECT_EQ(kept.to_vector()[999], 1.0f);
}

// The message of the ag::Error fn throws ("" when it throws none).
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ag::Error& e) {
    return e.what();
  }
  return "";
}

// A device whose allocations, releases and waits are scripted, and that records every release.
class FakeDevice final : public ag::DeviceMemory {
 public:
  std::string name() const override { return "fake device memory"; }
  int current_device() override { return device; }
  Allocation allocate(size_t nbytes) override {
    if (next_status != Status::kOk) {
      const Status status = next_status;
      if (fail_times > 0 && --fail_times == 0) next_status = Status::kOk;
      Allocation failed;
      failed.status = status;
      failed.error = status == Status::kOutOfMemory ? "fakeMalloc: out of memory" : "fakeMalloc: device lost";
      return failed;
    }
    Allocation ok;
    ok.ptr = reinterpret_cast<void*>(next_address);
    next_address += nbytes + 4096;
    ++allocations;
    return ok;
  }
  void release(void* ptr) override {
    ++releases[ptr];
    if (fail_release_on-- == 1) throw ag::Error("fakeFree failed");
  }
  void synchronize() override { ++waits; }
  void mark_freed(void* ptr) override { ready[ptr] = false; }
  bool reusable(void* ptr) override { return ready[ptr]; }

  int device = 0;
  Status next_status = Status::kOk;
  int fail_times = 0;        // with next_status: fail this many times, then succeed (0: always fail)
  int fail_release_on = -1;  // the n-th release (1-based) throws
  uintptr_t next_address = 0x10000;
  int allocations = 0, waits = 0;
  std::map<void*, int> releases;
  std::map<void*, bool> ready;  // what reusable() answers for each freed block
};

TEST(CachingAllocator, ReusesAFreedBlockOfTheSameClassOnTheSameDeviceOnceReusable) {
  FakeDevice dev;
  ag::CachingAllocator alloc(dev);
  void* a = alloc.allocate(1000);
  alloc.deallocate(a, 1000);
  EXPECT_NE(alloc.allocate(1000), a) << "not yet reusable (a queued copy may still read it)";
  dev.ready[a] = true;
  EXPECT_EQ(alloc.allocate(900), a) << "same 1024-byte class";
  void* b = alloc.allocate(1000);
  alloc.deallocate(b, 1000);
  dev.ready[b] = true;
  dev.device = 1;
  EXPECT_NE(alloc.allocate(1000), b) << "another device has its own free lists";
  const ag::MemoryStats s = alloc.stats();
  EXPECT_EQ(s.current_bytes, 1000 + 900 + 1000);
  EXPECT_EQ(s.reserved_bytes, 4 * 1024);
  EXPECT_EQ(dev.allocations, 4);
}

TEST(CachingAllocator, SizeClassesAreMultiplesOf512ThenQuarterSteps) {
  EXPECT_EQ(ag::CachingAllocator::size_class(0), 512u);
  EXPECT_EQ(ag::CachingAllocator::size_class(513), 1024u);
  EXPECT_EQ(ag::CachingAllocator::size_class(size_t{1} << 26), size_t{1} << 26);  // 64 MiB: exact
  EXPECT_EQ(ag::CachingAllocator::size_class((size_t{1} << 26) + 1), (size_t{1} << 26) * 5 / 4);
}

TEST(CachingAllocator, OutOfMemoryReleasesTheCacheRetriesAndOnlyThenHints) {
  FakeDevice dev;
  ag::CachingAllocator alloc(dev);
  void* cached = alloc.allocate(4096);
  alloc.deallocate(cached, 4096);
  dev.next_status = FakeDevice::Status::kOutOfMemory;
  dev.fail_times = 1;  // fails once, succeeds after the cache is released
  void* p = alloc.allocate(1 << 20);
  EXPECT_NE(p, nullptr);
  EXPECT_EQ(dev.releases[cached], 1) << "the cached block was given back before the retry";
  EXPECT_EQ(dev.waits, 1) << "after waiting for queued work";
  dev.next_status = FakeDevice::Status::kOutOfMemory;
  dev.fail_times = 0;
  const std::string oom = error_of([&] { (void)alloc.allocate(1 << 20); });
  for (const char* part : {"fake device memory", "out of memory", "fakeMalloc: out of memory", "in use 1048576 bytes",
                           "hint: lower the batch size"}) {
    EXPECT_NE(oom.find(part), std::string::npos) << part << " in: " << oom;
  }
  dev.next_status = FakeDevice::Status::kFailed;
  const std::string failed = error_of([&] { (void)alloc.allocate(1 << 20); });
  EXPECT_NE(failed.find("fakeMalloc: device lost"), std::string::npos) << failed;
  EXPECT_EQ(failed.find("out of memory"), std::string::npos) << "not an out-of-memory: " << failed;
  EXPECT_EQ(failed.find("batch size"), std::string::npos) << "no memory hint: " << failed;
}

TEST(CachingAllocator, AReleaseThatThrowsNeverLeadsToADoubleRelease) {
  FakeDevice dev;
  ag::CachingAllocator alloc(dev);
  std::vector<void*> blocks;
  for (size_t n : {512, 1024, 1536, 2048}) blocks.push_back(alloc.allocate(n));
  for (size_t i = 0; i < blocks.size(); ++i) alloc.deallocate(blocks[i], 512 * (i + 1));
  dev.fail_release_on = 2;
  EXPECT_NE(error_of([&] { alloc.empty_cache(); }).find("fakeFree failed"), std::string::npos);
  alloc.empty_cache();  // releases what is left, and never the block whose release threw
  for (void* b : blocks) EXPECT_EQ(dev.releases[b], 1) << b;
  EXPECT_EQ(alloc.stats().reserved_bytes, 0);
  alloc.empty_cache();
  EXPECT_EQ(dev.waits, 2) << "nothing cached: no wait";
}

}  // namespace
