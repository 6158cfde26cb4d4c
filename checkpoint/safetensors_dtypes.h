// The safetensors dtypes that ampgrad has no dtype of its own for (the FNUZ and E8M0 8-bit floats,
// the integers other than I64, BOOL, and C64/F4/F6, which it cannot hold), read exactly into wider
// ones. Used by the safetensors reader.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "framework/tensor.h"

namespace ampgrad::checkpoint::detail {

/// Bits per element of `name` if it is one of those dtypes of the format ("I16": 16, "F4": 4),
/// else 0 (ampgrad's own dtypes, and names the format does not define).
int foreign_dtype_bits(std::string_view name);

/// The `n` elements of dtype `name` (foreign_dtype_bits(name) > 0) at `src`, little-endian, as a
/// CPU tensor of `shape` that holds each value exactly: float32 for the 8-bit floats ampgrad lacks
/// (F8_E4M3FNUZ, F8_E5M2FNUZ, F8_E8M0), int64 for BOOL (0/1) and the integers. None,
/// with the reason in `why`, for C64, the packed F4/F6 floats and a U64 above int64's maximum.
std::optional<Tensor> read_foreign_dtype(std::string_view name, const char* src, const Shape& shape, int64_t n,
                                         std::string& why);

}  // namespace ampgrad::checkpoint::detail
