// ampgrad's data-parallel training (namespace ampgrad::distributed): process groups on MPI and
// NCCL, DistributedDataParallel, ZeroRedundancyOptimizer, DistributedSampler and rank-0 checkpoints. Target //:distributed;
// see docs/data_parallel.md.
#pragma once

#include "ampgrad.h"
#include "distributed/buckets.h"
#include "distributed/checkpoint.h"
#include "distributed/data_parallel.h"
#include "distributed/process_group.h"
#include "distributed/sampler.h"
#include "distributed/zero_redundancy_optimizer.h"
