// Precision checks shared by the CPU and CUDA suites (model_ops_test.cc, cuda_test.cc), each
// against float64 on the same stored inputs.
#pragma once

#include "test_util.h"

namespace ampgrad::test {

/// cross_entropy of float32 logits [0, 0.5, -1] + c (target 0), for offsets c up to +-1e6, on
/// `device`: the loss and the logits' gradient within float32 rounding of float64's, as PyTorch's
/// are (the log-normaliser is never rounded at the offset's magnitude).
::testing::AssertionResult check_cross_entropy_at_large_offsets(Device device);

}  // namespace ampgrad::test
