// main() for the tests that run as an MPI job (tests/mpirun_test.sh starts N ranks): every rank
// runs every test; rank 0 prints the usual report, the others only their failures, tagged with the
// rank; every rank exits with the same status (failed anywhere -> 1 everywhere).
#include <gtest/gtest.h>

#include <iostream>

#include "distributed/process_group.h"

namespace {

class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (result.failed()) {
      std::cerr << "[rank " << rank_ << "] " << result.file_name() << ":" << result.line_number() << ": "
                << result.summary() << std::endl;
    }
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  namespace dist = ampgrad::distributed;
  dist::ProcessGroup& world = dist::init_process_group(dist::Backend::kMPI);
  if (world.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(world.rank()));
  }
  const int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  const bool any_failed = world.all_reduce_int(failed, dist::ReduceOp::kMax) != 0;
  dist::destroy_process_group();
  return any_failed ? 1 : 0;
}
