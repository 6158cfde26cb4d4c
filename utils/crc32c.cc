// CRC-32C: the SSE4.2 path and the slicing-by-8 table path (see crc32c.h).
#include "utils/crc32c.h"

#include <array>
#include <bit>
#include <cstring>

#include "framework/error.h"
#include "framework/cpu_features.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
#define AMPGRAD_CRC32C_X86 1
#endif

namespace ampgrad::utils {

namespace {

constexpr uint32_t kPolynomial = 0x82f63b78u;  // Castagnoli, bit-reflected

// kTables[0] is the byte-at-a-time table; kTables[k][b] is the CRC of byte b followed by k zero
// bytes, which lets the loop below fold 8 input bytes with 8 independent look-ups.
using Tables = std::array<std::array<uint32_t, 256>, 8>;
constexpr Tables make_tables() {
  Tables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int bit = 0; bit < 8; ++bit) c = (c >> 1) ^ ((c & 1u) ? kPolynomial : 0u);
    t[0][b] = c;
  }
  for (size_t k = 1; k < 8; ++k)
    for (size_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xffu];
  return t;
}
constexpr Tables kTables = make_tables();

uint64_t load_le64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);  // unaligned-safe; x86 is little-endian, which the folding below assumes
  return v;
}

#ifdef AMPGRAD_CRC32C_X86
// The attribute lets this one function use SSE4.2 whatever the build flags; crc32c() only calls it
// after checking the CPU.
__attribute__((target("sse4.2"))) uint32_t hardware_update(uint32_t state, const unsigned char* p, size_t n) {
  uint64_t s = state;
  for (; n >= 8; n -= 8, p += 8) s = _mm_crc32_u64(s, load_le64(p));
  uint32_t s32 = static_cast<uint32_t>(s);
  for (; n > 0; --n, ++p) s32 = _mm_crc32_u8(s32, *p);
  return s32;
}
#endif

}  // namespace

uint32_t crc32c_table(const void* data, size_t n, uint32_t crc) {
  static_assert(std::endian::native == std::endian::little, "the slicing-by-8 folding assumes little-endian loads");
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t s = ~crc;  // the register starts at all ones and the result is inverted (CRC-32C's convention)
  for (; n >= 8; n -= 8, p += 8) {
    const uint64_t w = load_le64(p) ^ s;
    s = kTables[7][w & 0xff] ^ kTables[6][(w >> 8) & 0xff] ^ kTables[5][(w >> 16) & 0xff] ^
        kTables[4][(w >> 24) & 0xff] ^ kTables[3][(w >> 32) & 0xff] ^ kTables[2][(w >> 40) & 0xff] ^
        kTables[1][(w >> 48) & 0xff] ^ kTables[0][w >> 56];
  }
  for (; n > 0; --n, ++p) s = (s >> 8) ^ kTables[0][(s ^ *p) & 0xff];
  return ~s;
}

bool crc32c_hardware_supported() {
#ifdef AMPGRAD_CRC32C_X86
  return __builtin_cpu_supports("sse4.2");
#else
  return false;
#endif
}

uint32_t crc32c_hardware(const void* data, size_t n, uint32_t crc) {
  AG_CHECK(crc32c_hardware_supported(), "crc32c_hardware: this CPU has no SSE4.2 crc32 instruction; ",
           "hint: use crc32c() or crc32c_table()");
#ifdef AMPGRAD_CRC32C_X86
  return ~hardware_update(~crc, static_cast<const unsigned char*>(data), n);
#else
  return crc32c_table(data, n, crc);  // unreachable: the check above fails off x86
#endif
}

bool crc32c_uses_hardware() {
  static const bool use = crc32c_hardware_supported() && effective_cpu_isa() != CpuIsa::kBaseline;
  return use;
}

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  return crc32c_uses_hardware() ? crc32c_hardware(data, n, crc) : crc32c_table(data, n, crc);
}

}  // namespace ampgrad::utils
