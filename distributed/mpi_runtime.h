// The process's MPI, driven by one communication thread that makes every MPI call
// (MPI_THREAD_FUNNELED): it starts non-blocking collectives in submission order and polls them,
// which is what makes them progress while the caller computes, and fails each one that misses its
// deadline. Internal to distributed/.
#pragma once

#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "distributed/process_group.h"

namespace ampgrad::distributed::detail {

/// One MPI step of a collective, run on the communication thread. `start` issues a non-blocking
/// call into *request (or does its work at once and leaves MPI_REQUEST_NULL); `finish` runs
/// when it completed. An Error thrown by `finish` fails the collective on this rank only in the
/// way every rank sees it too (a shape mismatch found from gathered facts): the group stays usable.
/// An Error from `start` or an MPI failure breaks the group.
struct MpiPhase {
  std::function<void(MPI_Request* request)> start;
  std::function<void()> finish;
};

class MpiRuntime;

/// A collective of one or more phases (each starts after the previous one finished).
class MpiWork final : public Work {
 public:
  /// `what` names it in errors ("all_reduce(sum) of Tensor[4] float32 cpu on rank 1 of 2 (mpi)");
  /// `tensors` are kept alive while MPI may still write them and get their version bumped by
  /// wait(); the work fails unless it completes within timeout_seconds of its start.
  /// `tensors` are written (their versions are bumped by wait()); `held` are only read, and kept
  /// alive until the work is done.
  MpiWork(std::string what, std::vector<MpiPhase> phases, std::vector<Tensor> tensors, double timeout_seconds,
          std::vector<Tensor> held = {});
  void wait() override;
  bool is_completed() override;

 private:
  friend class MpiRuntime;
  enum class State { kQueued, kRunning, kDone, kFailed };
  void complete(State state, const std::string& error);
  bool last_phase_started() const { return state_ != State::kQueued && phase_ + 1 >= phases_.size(); }

  const std::string what_;
  std::vector<MpiPhase> phases_;
  std::vector<Tensor> tensors_;
  std::vector<Tensor> held_;
  const double timeout_seconds_;
  MpiRuntime* runtime_ = nullptr;  // set by submit
  // Touched by the communication thread only.
  size_t phase_ = 0;
  MPI_Request request_ = MPI_REQUEST_NULL;
  std::chrono::steady_clock::time_point deadline_;
  // Shared with waiters.
  std::mutex mutex_;
  std::condition_variable done_;
  State state_ = State::kQueued;
  std::string error_;
  bool versions_bumped_ = false;
};

/// The one per process; never destroyed (an exit handler finalises MPI), so a communication thread
/// stuck inside MPI at exit cannot touch freed memory.
class MpiRuntime {
 public:
  /// Starts MPI on first use, waiting at most timeout_seconds (the start-up timeout) for
  /// MPI_Init_thread. Throws when
  /// MPI cannot start, or the runtime broke earlier (a missed deadline, an MPI error).
  static MpiRuntime& get(double timeout_seconds);

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }

  /// Queues `work` behind every collective submitted before it (fails it at once when broken).
  void submit(const std::shared_ptr<MpiWork>& work);

  /// Why the runtime stopped working, or "" while it works. A broken runtime fails every later
  /// collective at once: after a missed deadline the ranks no longer agree on what comes next.
  std::string broken_reason();
  void mark_broken(const std::string& reason);
  /// Process groups alive: MPI is finalised at exit only when none is (see loop()).
  void add_group(int delta);
  /// Seconds since the communication thread last looked around (it does so at least every
  /// 100 ms unless stuck inside an MPI call): what a waiter checks besides the deadline.
  double seconds_since_heartbeat();

 private:
  MpiRuntime() = default;
  void loop();
  void init_mpi();
  void progress(std::vector<std::shared_ptr<MpiWork>>& active);
  bool advance(MpiWork& work);  // starts/tests phases; true once finished; throws when broken
  void shutdown();              // the exit handler

  int world_rank_ = 0;
  int world_size_ = 1;
  bool initialized_here_ = false;  // MPI_Init was ours, so MPI_Finalize is ours too

  std::mutex mutex_;
  std::condition_variable wake_;     // the communication thread waits here for work
  std::condition_variable changed_;  // init finished, thread finished
  std::deque<std::shared_ptr<MpiWork>> queue_;
  std::vector<std::shared_ptr<MpiWork>> abandoned_;  // failed while MPI still held their buffers
  bool stop_ = false;
  int live_groups_ = 0;
  bool init_done_ = false;
  bool thread_done_ = false;
  std::string broken_;
  std::chrono::steady_clock::time_point heartbeat_ = std::chrono::steady_clock::now();
  std::thread thread_;
};

/// Throws an Error naming `call` and MPI's text for `code` unless it is MPI_SUCCESS.
void mpi_check(int code, const char* call);

/// "rank 1 of 4 (mpi)": how errors say where they happened.
std::string rank_label(int rank, int size, Backend backend);

}  // namespace ampgrad::distributed::detail
