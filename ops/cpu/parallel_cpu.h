// A small fork-join pool for the CPU kernels: parallel_for(chunks, fn) with dynamic scheduling.
// Idle workers sleep on a condition variable instead of spinning, so a shared, busy machine (or a
// core lent to another process) slows a GEMM by its share of the CPU, not by a spin-wait collapse.
#pragma once

#include <cstdint>
#include <functional>

namespace ampgrad::kernels::cpu {

/// Runs fn(c) for every c in [0, chunks), on up to num_threads() threads (the caller is one of
/// them); returns when all have run and rethrows the first exception. Chunks are handed out one
/// at a time, so a thread that is descheduled holds up at most one chunk. A call made from inside
/// fn, or while another thread's call is running, runs serially on the calling thread.
void parallel_for(int64_t chunks, const std::function<void(int64_t)>& fn);

/// Threads parallel_for uses (the caller included).
int pool_threads();

}  // namespace ampgrad::kernels::cpu
