// new_group and the default group (torch.distributed's init_process_group), whose creation installs
// the GradScaler found-inf hook that MAX-reduces the flag over every rank.
#include <memory>
#include <mutex>

#include "amp/found_inf_sync.h"
#include "distributed/process_group.h"
#include "distributed/process_group_mpi.h"
#include "framework/error.h"

#if defined(AMPGRAD_WITH_NCCL)
#include "distributed/process_group_nccl.h"
#endif

namespace ampgrad::distributed {

std::shared_ptr<ProcessGroup> new_group(Backend backend, ProcessGroupOptions options) {
  if (backend == Backend::kMPI) return ProcessGroupMPI::create_world(options);
#if defined(AMPGRAD_WITH_NCCL)
  return ProcessGroupNCCL::create_world(options);
#else
  AG_FAIL("ampgrad.distributed: this build has no NCCL backend (NCCL is compiled when the CUDA toolkit at build ",
          "time has include/nccl.h and lib64/libnccl.so.2); hint: use Backend::kMPI with CPU tensors");
#endif
}

// ---- The default group -------------------------------------------------------------------------

namespace {

struct DefaultGroup {
  std::mutex mutex;
  std::shared_ptr<ProcessGroup> group;
  amp::FoundInfSync previous_hook;
};

DefaultGroup& default_state() {
  static DefaultGroup state;
  return state;
}

}  // namespace

ProcessGroup& init_process_group(Backend backend, ProcessGroupOptions options) {
  DefaultGroup& state = default_state();
  std::lock_guard<std::mutex> lock(state.mutex);
  AG_CHECK(state.group == nullptr, "init_process_group: the default process group already exists; hint: call ",
           "destroy_process_group() first, or make more groups with new_group()");
  state.group = new_group(backend, options);
  // Every rank must skip or step together: the found-inf flag becomes the MAX over all ranks.
  std::weak_ptr<ProcessGroup> weak = state.group;
  state.previous_hook = amp::set_found_inf_sync([weak](bool found_inf) {
    const std::shared_ptr<ProcessGroup> group = weak.lock();
    AG_CHECK(group != nullptr, "GradScaler: the default process group was destroyed");
    return group->all_reduce_int(found_inf ? 1 : 0, ReduceOp::kMax) != 0;
  });
  return *state.group;
}

bool is_initialized() {
  DefaultGroup& state = default_state();
  std::lock_guard<std::mutex> lock(state.mutex);
  return state.group != nullptr;
}

ProcessGroup& default_group() {
  DefaultGroup& state = default_state();
  std::lock_guard<std::mutex> lock(state.mutex);
  AG_CHECK(state.group != nullptr, "ampgrad.distributed: no default process group; hint: call ",
           "distributed::init_process_group() first (and start the program with mpirun)");
  return *state.group;
}

int get_rank() { return default_group().rank(); }
int get_world_size() { return default_group().size(); }

void destroy_process_group() {
  DefaultGroup& state = default_state();
  std::lock_guard<std::mutex> lock(state.mutex);
  AG_CHECK(state.group != nullptr, "destroy_process_group: there is no default process group");
  amp::set_found_inf_sync(std::move(state.previous_hook));
  state.previous_hook = nullptr;
  state.group.reset();
}

void all_reduce(Tensor& tensor, ReduceOp op) { default_group().all_reduce(tensor, op); }
void broadcast(Tensor& tensor, int root) { default_group().broadcast(tensor, root); }
void barrier() { default_group().barrier(); }

}  // namespace ampgrad::distributed
