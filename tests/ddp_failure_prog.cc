// A small data-parallel training job in which one rank fails on purpose at step 3, for
// tests/distributed_failure_test.sh: ddp_failure_prog MODE, MODE one of
//   none   no failure: every rank prints "rank R finished"
//   throw  rank 1 throws an ampgrad::Error mid-step (before its backward) and exits with status 1
//   hang   rank 1 stops calling collectives (sleeps 600 s): the others must time out
//   kill   rank 1 dies from SIGKILL mid-step
//   late   rank 1 starts 5 s after rank 0 (sleeps before MPI starts): with a collective timeout
//          shorter than that, the job must still finish, since start-up has its own deadline
// Every rank that catches an Error prints "rank R: error: ..." and exits with status 1, without
// destroy_process_group(): a failed job must end at once, not wait for MPI_Finalize.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "ampgrad_distributed.h"

namespace ag = ampgrad;
namespace dist = ampgrad::distributed;

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "none";
  int rank = -1;
  try {
    if (mode == "late") {
      // The launcher's rank, known before MPI starts (Open MPI's name, then PMIx's and PMI's).
      const char* launch_rank = std::getenv("OMPI_COMM_WORLD_RANK");
      if (launch_rank == nullptr) launch_rank = std::getenv("PMIX_RANK");
      if (launch_rank == nullptr) launch_rank = std::getenv("PMI_RANK");
      if (launch_rank == nullptr) {
        std::fprintf(stderr, "late: the launcher set no rank variable, so no rank can start late\n");
        return 1;
      }
      if (std::string(launch_rank) == "1") std::this_thread::sleep_for(std::chrono::seconds(5));
    }
    dist::ProcessGroup& world = dist::init_process_group();
    rank = world.rank();
    ag::manual_seed(1);
    ag::nn::Sequential model{ag::nn::Linear(16, 64), ag::nn::ReLU(), ag::nn::Linear(64, 1)};
    dist::DistributedDataParallel ddp(model, world, {.first_bucket_cap_mb = 0.001});  // two buckets
    ag::optim::Adam opt(model.parameters(), {.lr = 1e-3});
    ag::amp::GradScaler scaler;
    for (int step = 0; step < 10; ++step) {
      const ag::Tensor x = ag::randn({32, 16}), y = ag::randn({32, 1});
      opt.zero_grad();
      ag::Tensor loss;
      {
        ag::amp::AutocastGuard autocast(ag::Device::kCPU, ag::DType::kFloat16);
        loss = ag::ops::mse_loss(ddp(x), y);
      }
      if (step == 3 && rank == 1) {
        if (mode == "throw") AG_FAIL("injected failure on rank 1 at step 3");
        if (mode == "hang") std::this_thread::sleep_for(std::chrono::seconds(600));
        if (mode == "kill") std::raise(SIGKILL);
      }
      scaler.scale(loss).backward();
      scaler.step(opt);
      scaler.update();
    }
    std::printf("rank %d finished\n", rank);
  } catch (const ag::Error& e) {
    std::fprintf(stderr, "rank %d: error: %s\n", rank, e.what());
    return 1;
  }
  dist::destroy_process_group();
  return 0;
}
