// The safetensors dtypes ampgrad has no dtype of its own for, read exactly into wider ones by bit
// conversions. A dtype in ampgrad's dtype table (F32, F16, BF16, F64, I64, F8_E4M3, F8_E5M2) never
// reaches this file: the reader reads those as they are.
#include "checkpoint/safetensors_dtypes.h"

#include <array>
#include <cmath>
#include <cstdint>

#include "framework/error.h"

namespace ampgrad::checkpoint::detail {

namespace {

enum class Widening { kFloat8, kBool, kSigned, kUnsigned, kNotRead };

// An 8-bit float: 1 sign bit (none for E8M0), `exponent_bits`, the rest mantissa.
enum class Float8NaN { kIeee, kAllOnes, kNegativeZero };  // inf/NaN at the top exponent; S.1111.111; 0x80
struct Float8Format {
  int exponent_bits = 0;
  int bias = 0;
  Float8NaN nan = Float8NaN::kIeee;
};

struct ForeignDType {
  std::string_view name;
  int bits;  // per element; the packed F4/F6 floats take less than a byte
  Widening widening;
  Float8Format float8 = {};
  const char* why_not = "";  // kNotRead only
};

constexpr ForeignDType kForeignDTypes[] = {
    {"F8_E4M3FNUZ", 8, Widening::kFloat8, {4, 8, Float8NaN::kNegativeZero}},
    {"F8_E5M2FNUZ", 8, Widening::kFloat8, {5, 16, Float8NaN::kNegativeZero}},
    {"F8_E8M0", 8, Widening::kFloat8, {8, 127, Float8NaN::kAllOnes}},  // scales: 2^(e - 127), 0xff NaN
    {"BOOL", 8, Widening::kBool},
    {"U8", 8, Widening::kUnsigned},
    {"I8", 8, Widening::kSigned},
    {"I16", 16, Widening::kSigned},
    {"U16", 16, Widening::kUnsigned},
    {"I32", 32, Widening::kSigned},
    {"U32", 32, Widening::kUnsigned},
    {"U64", 64, Widening::kUnsigned},  // read when every value fits int64
    {"C64", 64, Widening::kNotRead, {}, "complex64: ampgrad has no complex dtype"},
    {"F4", 4, Widening::kNotRead, {}, "packed 4-bit floats: ampgrad does not unpack them"},
    {"F6_E2M3", 6, Widening::kNotRead, {}, "packed 6-bit floats: ampgrad does not unpack them"},
    {"F6_E3M2", 6, Widening::kNotRead, {}, "packed 6-bit floats: ampgrad does not unpack them"},
};

const ForeignDType* find_foreign_dtype(std::string_view name) {
  for (const ForeignDType& d : kForeignDTypes) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

// The value of each of the 256 bytes as an 8-bit float of format `f` (exact in float32).
std::array<float, 256> float8_values(const Float8Format& f) {
  std::array<float, 256> values{};
  const bool has_sign = f.exponent_bits < 8;
  const int mantissa_bits = 8 - f.exponent_bits - (has_sign ? 1 : 0);
  const int top_exponent = (1 << f.exponent_bits) - 1;
  for (int b = 0; b < 256; ++b) {
    const bool negative = has_sign && (b & 0x80) != 0;
    const int exponent = (b >> mantissa_bits) & top_exponent;
    const int mantissa = b & ((1 << mantissa_bits) - 1);
    float magnitude = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), 1 - f.bias - mantissa_bits)
                                    : std::ldexp(static_cast<float>((1 << mantissa_bits) + mantissa),
                                                 exponent - f.bias - mantissa_bits);
    if (f.exponent_bits == 8) magnitude = std::ldexp(1.0f, exponent - f.bias);  // E8M0: no zero, no subnormals
    const bool top = exponent == top_exponent;
    const bool all_mantissa = mantissa == (1 << mantissa_bits) - 1;
    if (f.nan == Float8NaN::kIeee && top) magnitude = mantissa == 0 ? INFINITY : NAN;
    if (f.nan == Float8NaN::kAllOnes && top && all_mantissa) magnitude = NAN;
    if (f.nan == Float8NaN::kNegativeZero && b == 0x80) magnitude = NAN;
    values[static_cast<size_t>(b)] = negative && !std::isnan(magnitude) ? -magnitude : magnitude;
  }
  return values;
}

// The little-endian integer of `Bytes` bytes at `p`, sign-extended when `Signed`.
template <size_t Bytes, bool Signed>
int64_t load_integer(const char* p) {
  uint64_t v = 0;
  for (size_t i = 0; i < Bytes; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  if constexpr (Signed && Bytes < 8) {
    const uint64_t sign = uint64_t{1} << (8 * Bytes - 1);
    v = (v ^ sign) - sign;  // sign-extends
  }
  return static_cast<int64_t>(v);
}

template <size_t Bytes, bool Signed>
void widen_integers(const char* src, int64_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = load_integer<Bytes, Signed>(src + i * static_cast<int64_t>(Bytes));
}

}  // namespace

int foreign_dtype_bits(std::string_view name) {
  const ForeignDType* d = find_foreign_dtype(name);
  return d == nullptr ? 0 : d->bits;
}

std::optional<Tensor> read_foreign_dtype(std::string_view name, const char* src, const Shape& shape, int64_t n,
                                         std::string& why) {
  const ForeignDType* found = find_foreign_dtype(name);
  AG_CHECK(found != nullptr, "internal: ", name, " is not a foreign safetensors dtype");
  const ForeignDType& d = *found;
  switch (d.widening) {
    case Widening::kFloat8: {
      const std::array<float, 256> values = float8_values(d.float8);
      Tensor t = Tensor::empty(shape, DType::kFloat32);
      float* dst = t.data<float>();
      for (int64_t i = 0; i < n; ++i) dst[i] = values[static_cast<unsigned char>(src[i])];
      return t;
    }
    case Widening::kBool: {  // any nonzero byte reads as true (1), as numpy reads it
      Tensor t = Tensor::empty(shape, DType::kInt64);
      int64_t* dst = t.data<int64_t>();
      for (int64_t i = 0; i < n; ++i) dst[i] = src[i] != 0 ? 1 : 0;
      return t;
    }
    case Widening::kSigned:
    case Widening::kUnsigned: {
      if (d.bits == 64) {  // U64
        for (int64_t i = 0; i < n; ++i) {
          if (load_integer<8, false>(src + 8 * i) < 0) {
            why = "U64 value " + std::to_string(static_cast<uint64_t>(load_integer<8, false>(src + 8 * i))) +
                  " (element " + std::to_string(i) + ") exceeds int64's maximum";
            return std::nullopt;
          }
        }
      }
      Tensor t = Tensor::empty(shape, DType::kInt64);
      int64_t* dst = t.data<int64_t>();
      const bool is_signed = d.widening == Widening::kSigned;
      switch (d.bits) {
        case 8: is_signed ? widen_integers<1, true>(src, dst, n) : widen_integers<1, false>(src, dst, n); break;
        case 16: is_signed ? widen_integers<2, true>(src, dst, n) : widen_integers<2, false>(src, dst, n); break;
        case 32: is_signed ? widen_integers<4, true>(src, dst, n) : widen_integers<4, false>(src, dst, n); break;
        default: widen_integers<8, false>(src, dst, n); break;
      }
      return t;
    }
    case Widening::kNotRead: break;
  }
  why = std::string(d.name) + " (" + d.why_not + ")";
  return std::nullopt;
}

}  // namespace ampgrad::checkpoint::detail
