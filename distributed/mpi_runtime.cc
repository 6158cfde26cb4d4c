// The communication thread: MPI's initialisation and finalisation, the queue of collectives, their
// progress and their deadlines (see mpi_runtime.h).
#include "distributed/mpi_runtime.h"

#include <algorithm>
#include <cstdlib>

#include "framework/error.h"

namespace ampgrad::distributed::detail {

namespace {

using Clock = std::chrono::steady_clock;

Clock::duration seconds(double s) { return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s)); }

// Between two MPI_Test rounds the thread sleeps this long: MPI_Iallreduce advances only inside
// MPI calls, so polling is what overlaps communication with compute, while a spinning thread would
// take a core from the compute on a machine with as many ranks as cores.
constexpr auto kPollInterval = std::chrono::microseconds(20);
constexpr auto kIdleWake = std::chrono::milliseconds(100);  // heartbeat while idle

}  // namespace

void mpi_check(int code, const char* call) {
  if (code == MPI_SUCCESS) [[likely]]
    return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) length = 0;
  AG_FAIL("MPI call `", call, "` failed with error ", code, ": ", std::string(text, static_cast<size_t>(length)));
}

std::string rank_label(int rank, int size, Backend backend) {
  return ::ampgrad::detail::str_cat("rank ", rank, " of ", size, " (", backend_name(backend), ")");
}

// ---- MpiWork ---------------------------------------------------------------------------------

MpiWork::MpiWork(std::string what, std::vector<MpiPhase> phases, std::vector<Tensor> tensors, double timeout_seconds,
                 std::vector<Tensor> held)
    : what_(std::move(what)), phases_(std::move(phases)), tensors_(std::move(tensors)), held_(std::move(held)),
      timeout_seconds_(timeout_seconds) {
  AG_CHECK(!phases_.empty(), "internal: ", what_, " has no MPI phase");
}

void MpiWork::complete(State state, const std::string& error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (state_ == State::kDone || state_ == State::kFailed) return;
    state_ = state;
    error_ = error;
  }
  done_.notify_all();
}

bool MpiWork::is_completed() {
  std::lock_guard<std::mutex> lock(mutex_);
  return state_ == State::kDone || state_ == State::kFailed;
}

void MpiWork::wait() {
  AG_CHECK(runtime_ != nullptr, "internal: ", what_, " was never submitted");
  MpiRuntime& runtime = *runtime_;
  std::unique_lock<std::mutex> lock(mutex_);
  while (state_ == State::kQueued || state_ == State::kRunning) {
    done_.wait_for(lock, kIdleWake);
    if (state_ == State::kQueued || state_ == State::kRunning) {
      // The deadline is the communication thread's to enforce; this covers it being stuck inside
      // an MPI call, when it enforces nothing.
      const double stale = runtime.seconds_since_heartbeat();
      if (stale > timeout_seconds_) {
        const std::string reason = ::ampgrad::detail::str_cat(
            what_, ": the communication thread has been inside one MPI call for ", stale,
            " s (timeout ", timeout_seconds_, " s): another rank failed, exited or is stuck; this process group ",
            "can no longer be used; hint: look at the other ranks' output for the first error");
        lock.unlock();
        runtime.mark_broken(reason);
        throw Error(reason);
      }
    }
  }
  if (state_ == State::kFailed) throw Error(error_);
  if (!versions_bumped_) {
    versions_bumped_ = true;
    for (Tensor& t : tensors_) t.bump_version();  // their values changed under any cached copy
  }
}

// ---- MpiRuntime: lifetime ---------------------------------------------------------------------

MpiRuntime& MpiRuntime::get(double timeout_seconds) {
  static std::mutex creation;
  static MpiRuntime* runtime = nullptr;  // never deleted: see the class comment
  std::unique_lock<std::mutex> create_lock(creation);
  if (runtime == nullptr) {
    runtime = new MpiRuntime();
    runtime->thread_ = std::thread([] { runtime->loop(); });
    std::atexit([] { runtime->shutdown(); });
  }
  create_lock.unlock();
  std::unique_lock<std::mutex> lock(runtime->mutex_);
  const bool ready = runtime->changed_.wait_for(lock, seconds(timeout_seconds), [] { return runtime->init_done_; });
  if (!ready && runtime->broken_.empty()) {
    runtime->broken_ = ::ampgrad::detail::str_cat(
        "MPI_Init_thread did not finish within ", timeout_seconds, " s; hint: start every rank with mpirun, and ",
        "check that the machines can reach each other; AMPGRAD_DISTRIBUTED_STARTUP_TIMEOUT (seconds) sets this deadline");
  }
  AG_CHECK(runtime->broken_.empty(), "ampgrad.distributed: MPI is not usable in this process: ", runtime->broken_);
  return *runtime;
}

void MpiRuntime::init_mpi() {
  int initialized = 0;
  mpi_check(MPI_Initialized(&initialized), "MPI_Initialized");
  if (!initialized) {
    int provided = 0;
    // FUNNELED: every MPI call is made by this thread, the one that initialised MPI.
    mpi_check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    initialized_here_ = true;
  } else {
    int provided = 0;
    mpi_check(MPI_Query_thread(&provided), "MPI_Query_thread");
    AG_CHECK(provided == MPI_THREAD_MULTIPLE, "ampgrad.distributed: the program initialised MPI itself at thread ",
             "level ", provided, ", but ampgrad makes its MPI calls from its own communication thread; hint: ",
             "initialise MPI with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...), or leave it to ampgrad");
  }
  // Errors come back as codes (turned into ampgrad::Error) instead of aborting the job.
  mpi_check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  mpi_check(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_), "MPI_Comm_rank");
  mpi_check(MPI_Comm_size(MPI_COMM_WORLD, &world_size_), "MPI_Comm_size");
}

void MpiRuntime::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  // MPI_Finalize waits for the other ranks to reach it too; bound that wait like any other.
  std::unique_lock<std::mutex> lock(mutex_);
  if (changed_.wait_for(lock, seconds(default_timeout_seconds()), [this] { return thread_done_; })) {
    lock.unlock();
    thread_.join();
  } else {
    lock.unlock();
    thread_.detach();  // stuck inside MPI: the process exits without it
  }
}

// ---- MpiRuntime: the communication thread ------------------------------------------------------

void MpiRuntime::loop() {
  std::string init_error;
  try {
    init_mpi();
  } catch (const Error& e) {
    init_error = e.what();
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    init_done_ = true;
    if (!init_error.empty() && broken_.empty()) broken_ = init_error;
  }
  changed_.notify_all();

  std::vector<std::shared_ptr<MpiWork>> active;  // started, in submission order
  if (init_error.empty()) {
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        heartbeat_ = Clock::now();
        if (stop_) break;
        if (active.empty() && queue_.empty()) {
          wake_.wait_for(lock, kIdleWake);
          continue;
        }
      }
      progress(active);
      if (!active.empty()) std::this_thread::sleep_for(kPollInterval);
    }
  }

  // Shutting down. Collectives still running keep their buffers (abandoned_). MPI_Finalize waits
  // for every rank to reach it, so it is called only after an orderly end: no group left (the
  // program called destroy_process_group()), nothing in flight, no failure. A process that exits
  // otherwise (an error unwound main while the default group was alive) skips it, and mpirun then
  // ends the whole job at once, instead of the other ranks waiting out their timeout.
  bool clean = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& work : queue_) work->complete(MpiWork::State::kFailed, "ampgrad.distributed: the process is exiting");
    queue_.clear();
    clean = init_error.empty() && broken_.empty() && active.empty() && live_groups_ == 0;
    for (auto& work : active) abandoned_.push_back(work);
  }
  if (clean && initialized_here_) MPI_Finalize();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    thread_done_ = true;
  }
  changed_.notify_all();
}

void MpiRuntime::progress(std::vector<std::shared_ptr<MpiWork>>& active) {
  try {
    for (auto it = active.begin(); it != active.end();) {
      it = advance(**it) ? active.erase(it) : it + 1;
    }
    // Start queued collectives, in order, while no running one still has a phase to start: a
    // later phase issued after a newer collective on one rank and before it on another would pair
    // up different collectives across ranks.
    for (;;) {
      const bool blocked =
          std::any_of(active.begin(), active.end(), [](const auto& work) { return !work->last_phase_started(); });
      if (blocked) break;
      std::shared_ptr<MpiWork> next;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (queue_.empty() || !broken_.empty()) break;
        next = std::move(queue_.front());
        queue_.pop_front();
      }
      active.push_back(next);
      if (advance(*next)) active.pop_back();
    }
    const auto now = Clock::now();
    for (const auto& work : active) {
      if (now > work->deadline_) {
        AG_FAIL("ampgrad.distributed: ", work->what_, " did not complete within ", work->timeout_seconds_,
                " s: another rank failed, exited, or is not calling the same collectives in the same order; this ",
                "process group can no longer be used; hint: look at the other ranks' output for the first error; ",
                "AMPGRAD_DISTRIBUTED_TIMEOUT (collectives) and AMPGRAD_DISTRIBUTED_STARTUP_TIMEOUT (start-up and ",
                "group setup) set the timeouts, in seconds");
      }
    }
  } catch (const Error& e) {
    // The ranks no longer agree on what comes next: fail everything, now and later.
    mark_broken(e.what());
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& work : active) {
      work->complete(MpiWork::State::kFailed, e.what());
      abandoned_.push_back(work);
    }
    active.clear();
    for (auto& work : queue_) work->complete(MpiWork::State::kFailed, e.what());
    queue_.clear();
  }
}

bool MpiRuntime::advance(MpiWork& work) {
  const auto start_phase = [&] {
    work.request_ = MPI_REQUEST_NULL;
    work.phases_[work.phase_].start(&work.request_);
  };
  if (work.state_ == MpiWork::State::kQueued) {
    {
      std::lock_guard<std::mutex> lock(work.mutex_);
      work.state_ = MpiWork::State::kRunning;
    }
    work.deadline_ = Clock::now() + seconds(work.timeout_seconds_);
    start_phase();
  }
  for (;;) {
    int completed = 0;
    mpi_check(MPI_Test(&work.request_, &completed, MPI_STATUS_IGNORE), "MPI_Test");
    if (!completed) return false;
    if (const auto& finish = work.phases_[work.phase_].finish) {
      try {
        finish();
      } catch (const Error& e) {
        work.complete(MpiWork::State::kFailed, e.what());  // every rank found the same: still usable
        return true;
      }
    }
    if (++work.phase_ == work.phases_.size()) {
      work.complete(MpiWork::State::kDone, "");
      return true;
    }
    start_phase();
  }
}

// ---- MpiRuntime: the callers' side -------------------------------------------------------------

void MpiRuntime::submit(const std::shared_ptr<MpiWork>& work) {
  work->runtime_ = this;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (broken_.empty() && !stop_) {
      queue_.push_back(work);
      wake_.notify_one();
      return;
    }
  }
  const std::string reason = broken_reason();
  work->complete(MpiWork::State::kFailed,
                 ::ampgrad::detail::str_cat("ampgrad.distributed: ", work->what_, " cannot run: ",
                                            reason.empty() ? "the process is exiting" : reason));
}

std::string MpiRuntime::broken_reason() {
  std::lock_guard<std::mutex> lock(mutex_);
  return broken_;
}

void MpiRuntime::mark_broken(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (broken_.empty()) broken_ = reason;
}

void MpiRuntime::add_group(int delta) {
  std::lock_guard<std::mutex> lock(mutex_);
  live_groups_ += delta;
}

double MpiRuntime::seconds_since_heartbeat() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::chrono::duration<double>(Clock::now() - heartbeat_).count();
}

}  // namespace ampgrad::distributed::detail
