// The one table of op cases every backend is checked against: each row names an op, its input
// shapes, how to call it and a float64 reference. ops_test.cc checks it on the CPU (forward vs
// float64, finite differences, FP16 vs FP32); cuda_test.cc runs the same rows on CUDA against the
// CPU. A new op gets a row here once.
#pragma once

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "reference.h"
#include "test_util.h"

namespace ampgrad::test {

struct OpCase {
  std::string name;
  std::vector<Shape> shapes;  // of the inputs
  TensorFn fn;
  std::function<Values(const std::vector<Values>&)> reference;  // in double, from the inputs' values
  Tol tol;  // accumulation length and term size (see all_close)
};

inline void PrintTo(const OpCase& op, std::ostream* out) { *out << op.name; }

/// The tolerance between two results that are each within `tol` of the exact one (two backends,
/// two summation orders): twice as wide, which all_close's sqrt(k) scaling gives for 4k.
inline Tol between_results(Tol tol) { return {.k = 4 * tol.k, .magnitude = tol.magnitude}; }

/// Every row.
std::vector<OpCase> op_cases();
/// The rows of each family, appended by op_cases() (one file each).
void append_tensor_cases(std::vector<OpCase>& cases);  // op_cases_tensor.cc: shapes, reductions, batched GEMMs
void append_model_cases(std::vector<OpCase>& cases);   // op_cases_model.cc: activations, losses, norms, attention
void append_conv_cases(std::vector<OpCase>& cases);    // op_cases_conv.cc: conv2d, pools, batch norm, flatten

/// The inputs of a row in `dtype` on `device`: uniform values in +-[0.1, 2.1), kept away from 0 so
/// that relu's kink is never within a finite-difference step (for the mlp row: its hidden
/// pre-activations, with these fixed seeds).
std::vector<Tensor> make_inputs(const OpCase& op, DType dtype, Device device = Device::kCPU);

}  // namespace ampgrad::test
