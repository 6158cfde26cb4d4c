// Precision checks shared by the CPU and CUDA suites (model_ops_test.cc, cuda_test.cc), each
// against float64 on the same stored inputs.
#pragma once

#include "test_util.h"

namespace ampgrad::test {

/// cross_entropy of logits [0, 0.5, -1] + c in `dtype` (float32 or float64; target 0, with and
/// without label smoothing), for offsets c up to +-1e6, on `device`: the loss and the logits'
/// gradient within the dtype's rounding of float64's on the stored logits, as PyTorch's are (the
/// log-normaliser is never rounded at the offset's magnitude).
::testing::AssertionResult check_cross_entropy_at_large_offsets(Device device, DType dtype = DType::kFloat32);

/// cross_entropy of `low` (float16 or bfloat16) logits [64, 50304] under autocast on `device`, as
/// a GPT's classifier runs: the loss is float32 and equals the float32 path's on the same logits
/// bit for bit, the logits' gradient is that path's rounded once to `low`, and from the forward
/// through the backward the device's allocator holds no more than the gradient itself (+1/8):
/// no float32 copy of the logits (which would add twice their bytes) is made or kept.
::testing::AssertionResult check_cross_entropy_reads_16bit_logits_in_place(Device device, DType low);

}  // namespace ampgrad::test
