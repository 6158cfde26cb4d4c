// The packed GEMM's packing (linear_gemm_cpu.cc): blocks of a and b laid out in panels of 32-bit
// words in the order the micro-kernel reads them (linear_gemm_micro_cpu.h, Packing). Transposes
// disappear here, and FP16/BF16/FP8 become floats, or BF16 pairs for the BF16 kernel.
#pragma once

#include <cstdint>

#include "framework/dtype.h"
#include "ops/linear/linear_gemm_cpu.h"
#include "ops/linear/linear_gemm_micro_cpu.h"

namespace ampgrad::kernels::cpu {

/// Packing a may write up to this many words past its last panel (the buffer's slack takes them).
inline constexpr int64_t kPackSlack = 8;

/// Rows of words that kc k values take in a panel.
constexpr int64_t packed_rows(int64_t kc, Packing packing) {
  return (kc + k_per_word(packing) - 1) / k_per_word(packing);
}

/// Pad values for an odd k's last BF16 pair word: +0 in a, -0 in b, so the padded product is -0,
/// which leaves every sum (-0 included) unchanged.
inline constexpr uint16_t kPadA = 0x0000, kPadB = 0x8000;

/// The BF16 pair word of x(k) and x(k + 1) (bfloat16 bits): the first in the high half, which
/// VDPBF16PS multiplies first.
constexpr uint32_t pair_word(uint16_t first, uint16_t second) { return (uint32_t{first} << 16) | second; }

/// Calls fn(T{}) with the storage type of a GEMM operand's dtype (float, Half, BFloat16 or one of
/// the 8-bit floats).
template <typename Fn>
void visit_operand(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat16: return fn(Half{});
    case DType::kBFloat16: return fn(BFloat16{});
    case DType::kFloat8E4M3: return fn(Float8E4M3{});
    case DType::kFloat8E5M2: return fn(Float8E5M2{});
    default: return fn(float{});
  }
}

/// The bfloat16 bits of each of an 8-bit float dtype's 256 codes (every value is exact in bfloat16),
/// for the BF16 pair kernel.
const uint16_t* float8_bf16_table(DType dtype);

/// a(i, p) for rows [i0, i1) of a's m_rows and k in [p0, p0 + kc), as consecutive mr-row panels
/// of packed_rows(kc) x mr words; rows from i1 to the end of the last panel are zero.
void pack_a_block(const MatrixView& a, int64_t m_rows, int64_t i0, int64_t i1, int64_t p0, int64_t kc, int64_t mr,
                  Packing packing, float* dst);

/// b(p, j) for k in [p0, p0 + kc) and the nr-column panels at j0, j0 + nr, ... below j1, one
/// after another (packed_rows(kc) x nr words each); columns from n_end are zero.
void pack_b_block(const MatrixView& b, int64_t p0, int64_t kc, int64_t j0, int64_t j1, int64_t n_end, int64_t nr,
                  Packing packing, float* dst);

}  // namespace ampgrad::kernels::cpu
