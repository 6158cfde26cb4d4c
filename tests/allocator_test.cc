// The CPU allocator: alignment, byte counters, and its per-thread cache of freed blocks (reused
// for the next tensor of the same size class, counted as reserved, returned at thread exit).
#include <gtest/gtest.h>

#include <cstdint>
#include <thread>

#include "framework/allocator.h"
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

TEST(CpuAllocator, TensorsFreedOnAnotherThreadAreSafe) {
  // A tensor made here and dropped on a worker thread: the block joins that thread's cache and is
  // returned to the system when it exits.
  Tensor t = ag::ones({5000});
  std::thread([t = std::move(t)]() mutable { t = Tensor(); }).join();
  const Tensor u = ag::ones({5000});
  EXPECT_EQ(u.to_vector()[4999], 1.0f);
}

}  // namespace
