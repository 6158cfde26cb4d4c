// Checkpoints of a data-parallel job: rank 0 writes the one file (the replicas are identical),
// every rank can read it back, and each rank's random generator is saved and restored, so a resumed
// job continues bit for bit. Every rank learns whether it worked.
#pragma once

#include <string>

#include "checkpoint/checkpoint.h"
#include "distributed/process_group.h"
#include "distributed/zero_redundancy_optimizer.h"

namespace ampgrad::distributed {

/// Call on every rank. Rank 0 saves `state` to `path` like checkpoint::save_checkpoint (atomic),
/// adding every rank's random generator state; the others write nothing. Returns once the file is
/// complete; throws on every rank if rank 0 could not write it.
void save_checkpoint(const std::string& path, const checkpoint::TrainingState& state, ProcessGroup& group);
/// Call on every rank: each loads `path` (a path every rank can read: a shared file system, or a
/// copy on each machine) like checkpoint::load_checkpoint and restores its own random generator
/// when the job has as many ranks as the one that saved (else every rank gets rank 0's). Throws on
/// every rank, naming the ranks that failed, if any rank could not load it.
void load_checkpoint(const std::string& path, checkpoint::TrainingState& state, ProcessGroup& group);

/// save_checkpoint with the optimizer state sharded by `zero` (state.optimizer must be null or
/// zero.optimizer()): the shards are gathered into the file one process stepping the whole model
/// writes (zero.consolidated_optimizer()), which a single process, or a ZeroRedundancyOptimizer at
/// any world size, loads. A collective over zero.group(); only rank 0 holds the whole state.
void save_checkpoint(const std::string& path, const checkpoint::TrainingState& state, ZeroRedundancyOptimizer& zero);
/// load_checkpoint into `zero`: a file save_checkpoint wrote for a ZeroRedundancyOptimizer at any
/// world size, or one a single process's optimizer over the same parameters wrote; each rank keeps
/// its shard of the state. A collective over zero.group().
void load_checkpoint(const std::string& path, checkpoint::TrainingState& state, ZeroRedundancyOptimizer& zero);

}  // namespace ampgrad::distributed
