// CRC-32C (Castagnoli), as TFRecord files need: SSE4.2 `crc32` instructions when the CPU has them,
// a portable slicing-by-8 table otherwise. Both paths are exposed so tests can check each one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace ampgrad::utils {

/// CRC-32C of n bytes, continuing from `crc` (the CRC of the bytes before them; 0 to start), so
/// crc32c(b, crc32c(a)) == crc32c(a + b). Uses the hardware path when crc32c_uses_hardware().
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
/// The same over the bytes of a string.
inline uint32_t crc32c(std::string_view bytes, uint32_t crc = 0) { return crc32c(bytes.data(), bytes.size(), crc); }

/// The portable path (slicing-by-8 tables), on any CPU.
uint32_t crc32c_table(const void* data, size_t n, uint32_t crc = 0);

/// The SSE4.2 path. Throws ampgrad::Error when the CPU lacks SSE4.2 (see crc32c_hardware_supported()).
uint32_t crc32c_hardware(const void* data, size_t n, uint32_t crc = 0);

/// Whether the running CPU has SSE4.2 (its `crc32` instruction).
bool crc32c_hardware_supported();

/// Whether crc32c() takes the hardware path: the CPU supports it and AMPGRAD_CPU_ISA is not "baseline".
bool crc32c_uses_hardware();

/// TFRecord's masked CRC: rotate right by 15 bits and add a constant, so a CRC stored inside the data
/// it covers does not make the CRC of the whole trivially predictable.
constexpr uint32_t crc32c_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }
/// The CRC crc32c_mask was given back.
constexpr uint32_t crc32c_unmask(uint32_t masked) {
  const uint32_t rot = masked - 0xa282ead8u;
  return (rot >> 17) | (rot << 15);
}

}  // namespace ampgrad::utils
