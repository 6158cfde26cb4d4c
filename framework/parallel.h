// A small fork-join pool for CPU work (GEMMs, optimizer updates, conversions): parallel_for(chunks,
// fn) with dynamic scheduling. It lives in framework so every layer above can share one pool.
// Idle workers sleep on a condition variable instead of spinning, so a shared, busy machine (or a
// core lent to another process) slows a GEMM by its share of the CPU, not by a spin-wait collapse.
#pragma once

#include <cstdint>
#include <functional>

namespace ampgrad {

/// Runs fn(c) for every c in [0, chunks), on up to num_threads() threads (the caller is one of
/// them); returns when all have run and rethrows the first exception. Chunks are handed out one
/// at a time, so a thread that is descheduled holds up at most one chunk. A call made from inside
/// fn, or while another thread's call is running, runs serially on the calling thread.
void parallel_for(int64_t chunks, const std::function<void(int64_t)>& fn);

/// Threads the CPU kernels use (default: every core, or OMP_NUM_THREADS when set).
void set_num_threads(int num_threads);
/// The threads the CPU kernels use now.
int num_threads();

/// The grain for element-wise loops: below 64K elements (256 KB of floats) waking a helper
/// costs more than it saves.
inline constexpr int64_t kElementwiseGrain = int64_t{1} << 16;

/// parallel_range's parallel path (always splits).
void parallel_range_pieces(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

/// Runs fn(lo, hi) over [0, n) in pieces of at least `grain` elements, in parallel when n is at
/// least 2 * grain: for element-wise loops that are memory-bound on one core. Small ranges call
/// fn directly, without building a std::function (a small step makes dozens of such calls).
template <typename Fn>
void parallel_range(int64_t n, int64_t grain, Fn&& fn) {
  if (n < 2 * grain || num_threads() == 1) return fn(int64_t{0}, n);
  parallel_range_pieces(n, grain, fn);
}

}  // namespace ampgrad
