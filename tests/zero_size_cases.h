// The zero-size rows: ops meeting an empty dimension, run on the CPU by ops_errors_test.cc and on
// CUDA by cuda_test.cc. Each row's result must have PyTorch's shape and values (a sum over nothing
// is 0, a mean over nothing NaN), and sum(result).backward() must give every input a gradient of
// the input's shape with PyTorch's values (zeros wherever the result is empty).
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "test_util.h"

namespace ampgrad::test {

struct ZeroSizeCase {
  std::string name;
  std::vector<Shape> shapes;  // of the differentiable inputs
  TensorFn fn;
  Shape out;  // the result's shape, as PyTorch gives it
  double value = 0.0;                // every element of the result (NaN: a NaN)
  std::vector<double> grad_values{};  // every element of input i's gradient; 0 where not listed
};

inline void PrintTo(const ZeroSizeCase& c, std::ostream* out) { *out << c.name; }

std::vector<ZeroSizeCase> zero_size_cases();

/// Runs `c` on inputs of ones in `dtype` on `device`: the result's shape and values, then
/// sum(result).backward() and every input's gradient as the header says.
::testing::AssertionResult check_zero_size_case(const ZeroSizeCase& c, DType dtype, Device device);

}  // namespace ampgrad::test
