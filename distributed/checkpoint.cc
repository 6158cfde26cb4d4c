// Rank-0 checkpoints (see checkpoint.h). The per-rank generator states travel in the file's user
// metadata under reserved keys that load_checkpoint takes out again.
#include "distributed/checkpoint.h"

#include <exception>
#include <map>
#include <string>
#include <vector>

#include "framework/error.h"
#include "framework/random.h"

namespace ampgrad::distributed {

namespace {

const std::string kWorldSizeKey = "ampgrad.distributed.world_size";
const std::string kRandomKeyPrefix = "ampgrad.distributed.random.";

}  // namespace

void save_checkpoint(const std::string& path, const checkpoint::TrainingState& state, ProcessGroup& group) {
  const std::vector<std::string> generators = group.all_gather_bytes(random::get_state());
  std::string error;
  if (group.rank() == 0) {
    checkpoint::TrainingState with_ranks = state;
    with_ranks.user_metadata[kWorldSizeKey] = std::to_string(group.size());
    for (size_t r = 0; r < generators.size(); ++r) {
      with_ranks.user_metadata[kRandomKeyPrefix + std::to_string(r)] = generators[r];
    }
    try {
      checkpoint::save_checkpoint(path, with_ranks);
    } catch (const std::exception& e) {  // an Error, or one from a library (JSON, memory)
      error = e.what();
    }
  }
  agree_on_outcome(group, error, "distributed::save_checkpoint(" + path + ")",
                   "rank 0 writes the file: its folder must exist and be writable there");
}

void load_checkpoint(const std::string& path, checkpoint::TrainingState& state, ProcessGroup& group) {
  std::string error;
  try {
    checkpoint::load_checkpoint(path, state);
    std::map<std::string, std::string>& meta = state.user_metadata;
    const auto size = meta.find(kWorldSizeKey);
    const auto mine = meta.find(kRandomKeyPrefix + std::to_string(group.rank()));
    if (size != meta.end() && size->second == std::to_string(group.size()) && mine != meta.end()) {
      random::set_state(mine->second);
    }
    // The reserved keys are this file's business, not the caller's.
    for (auto it = meta.begin(); it != meta.end();) {
      it = it->first == kWorldSizeKey || it->first.rfind(kRandomKeyPrefix, 0) == 0 ? meta.erase(it) : std::next(it);
    }
  } catch (const std::exception& e) {  // an Error, or one from a library (JSON, memory)
    error = e.what();
  }
  agree_on_outcome(group, error, "distributed::load_checkpoint(" + path + ")",
                   "every rank must be able to read the path (a shared file system, or a copy on each machine)");
}

namespace {

void check_zero_optimizer(const checkpoint::TrainingState& state, ZeroRedundancyOptimizer& zero, const char* what) {
  AG_CHECK(state.optimizer == nullptr || state.optimizer == &zero.optimizer(), "distributed::", what, ": ",
           "state.optimizer is another optimizer than the ZeroRedundancyOptimizer's; hint: leave it null (or set ",
           "it to zero.optimizer()): the sharded state comes from the ZeroRedundancyOptimizer");
}

}  // namespace

void save_checkpoint(const std::string& path, const checkpoint::TrainingState& state, ZeroRedundancyOptimizer& zero) {
  check_zero_optimizer(state, zero, "save_checkpoint");
  // Rank 0 writes the file, so only it holds the whole state (null elsewhere, where nothing is written).
  const std::unique_ptr<optim::Optimizer> whole = zero.consolidated_optimizer(0);
  checkpoint::TrainingState consolidated = state;
  consolidated.optimizer = whole.get();
  save_checkpoint(path, consolidated, zero.group());
}

void load_checkpoint(const std::string& path, checkpoint::TrainingState& state, ZeroRedundancyOptimizer& zero) {
  check_zero_optimizer(state, zero, "load_checkpoint");
  // An optimizer over copies of the parameters (nothing gathered into it) takes the file's state;
  // the shards take theirs from it. Built on every rank, agreed on before the load's collectives.
  std::unique_ptr<optim::Optimizer> whole;
  std::string error;
  try {
    whole = zero.make_unsharded_optimizer();
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree_on_outcome(zero.group(), error, "distributed::load_checkpoint(" + path + ")",
                   "each rank builds one optimizer over copies of every parameter to read the file into");
  checkpoint::TrainingState consolidated = state;
  consolidated.optimizer = whole.get();
  load_checkpoint(path, consolidated, zero.group());
  state.user_metadata = consolidated.user_metadata;
  zero.load_consolidated_optimizer(*whole);
}

}  // namespace ampgrad::distributed
