// The CPU fork-join pool behind parallel_for and set_num_threads.
#include "framework/parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "framework/error.h"

namespace ampgrad {

namespace {

thread_local bool inside_pool_task = false;

// Default size: OMP_NUM_THREADS when set (as before, when Eigen's OpenMP threads did this), else every core.
int default_threads() {
  if (const char* env = std::getenv("OMP_NUM_THREADS")) {
    const int n = std::atoi(env);
    if (n >= 1) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

class Pool {
 public:
  Pool() : threads_(default_threads()) {}

  int threads() const { return threads_.load(); }

  void set_threads(int n) {
    std::lock_guard run(run_mutex_);  // not while a job is running
    threads_ = n;
  }

  void run(int64_t chunks, const std::function<void(int64_t)>& fn) {
    const int helpers = static_cast<int>(std::min<int64_t>(threads_.load(), chunks)) - 1;
    if (inside_pool_task || helpers <= 0) return run_serially(chunks, fn);
    std::unique_lock run(run_mutex_, std::try_to_lock);
    if (!run.owns_lock()) return run_serially(chunks, fn);
    start_workers(helpers);
    {
      std::lock_guard lock(mutex_);
      fn_ = &fn;
      chunks_ = chunks;
      next_chunk_ = 0;
      error_ = nullptr;
      open_slots_ = helpers;
      ++generation_;
    }
    wake_.notify_all();
    work();  // the caller takes chunks too
    std::unique_lock lock(mutex_);
    // Every chunk is taken: close the job, so a helper that has not woken yet does not join late,
    // and wait only for the helpers still inside a chunk.
    open_slots_ = 0;
    done_.wait(lock, [&] { return working_ == 0; });
    fn_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  // Grows the pool to `count` workers; a worker beyond the current job's helper count just
  // finds no chunk left, so shrinking needs no teardown.
  void start_workers(int count) {
    while (static_cast<int>(workers_.size()) < count) {
      workers_.emplace_back([this] { worker_loop(); });
      workers_.back().detach();  // the pool lives as long as the process
    }
  }

  void work() {
    inside_pool_task = true;
    for (int64_t c = next_chunk_.fetch_add(1); c < chunks_; c = next_chunk_.fetch_add(1)) {
      try {
        (*fn_)(c);
      } catch (...) {
        std::lock_guard lock(mutex_);
        if (!error_) error_ = std::current_exception();
      }
    }
    inside_pool_task = false;
  }

  static void run_serially(int64_t chunks, const std::function<void(int64_t)>& fn) {
    for (int64_t c = 0; c < chunks; ++c) fn(c);
  }

  void worker_loop() {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return generation_ != seen && open_slots_ > 0; });
        seen = generation_;
        --open_slots_;
        ++working_;
      }
      work();
      {
        std::lock_guard lock(mutex_);
        if (--working_ == 0) done_.notify_one();
      }
    }
  }

  std::atomic<int> threads_;
  std::mutex run_mutex_;  // one job at a time
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t chunks_ = 0;
  std::atomic<int64_t> next_chunk_{0};
  std::exception_ptr error_;
  int open_slots_ = 0;  // helpers that may still join the current job
  int working_ = 0;     // helpers inside it
  uint64_t generation_ = 0;
};

Pool& pool() {
  static Pool* instance = new Pool();  // never destroyed: its detached workers outlive statics
  return *instance;
}

}  // namespace

void parallel_for(int64_t chunks, const std::function<void(int64_t)>& fn) { pool().run(chunks, fn); }

void parallel_range_pieces(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t wanted = std::min<int64_t>(2 * num_threads(), n / std::max<int64_t>(grain, 1));
  if (wanted <= 1) return fn(0, n);
  const int64_t per = (n + wanted - 1) / wanted;
  const int64_t pieces = (n + per - 1) / per;  // every piece non-empty
  parallel_for(pieces, [&](int64_t piece) { fn(piece * per, std::min(n, (piece + 1) * per)); });
}

void set_num_threads(int num_threads) {
  AG_CHECK(num_threads >= 1, "set_num_threads: need at least 1 thread, got ", num_threads);
  pool().set_threads(num_threads);
}

int num_threads() { return pool().threads(); }

}  // namespace ampgrad
