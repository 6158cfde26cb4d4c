// Input checks shared by ops: every failure names the op, the tensors (shape, dtype, device)
// and a hint.
#pragma once

#include <initializer_list>
#include <string>

#include "framework/error.h"
#include "framework/tensor.h"

namespace ampgrad::ops {

/// "x: Tensor[2, 3] float32 cpu, w: Tensor[4, 3] float16 cpu" for error messages.
std::string describe(std::initializer_list<std::pair<const char*, const Tensor*>> named);

/// All defined tensors on one device, with one dtype.
void check_same_device(const char* op, std::initializer_list<std::pair<const char*, const Tensor*>> named);
void check_same_dtype(const char* op, std::initializer_list<std::pair<const char*, const Tensor*>> named);
/// Defined and of the given rank.
void check_rank(const char* op, const char* name, const Tensor& t, int64_t rank);

}  // namespace ampgrad::ops
