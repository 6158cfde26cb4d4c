// TFRecord framing and a validating reader (see tfrecord.h).
#include "utils/tfrecord.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "framework/error.h"
#include "utils/crc32c.h"

namespace ampgrad::utils {

namespace {

void append_le(std::string& out, uint64_t v, int nbytes) {
  for (int i = 0; i < nbytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t load_le(std::string_view bytes) {
  uint64_t v = 0;
  for (size_t i = 0; i < bytes.size(); ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[i])) << (8 * i);
  return v;
}

}  // namespace

std::string tfrecord_frame(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  append_le(out, data.size(), 8);
  append_le(out, crc32c_mask(crc32c(out.data(), 8)), 4);
  out.append(data);
  append_le(out, crc32c_mask(crc32c(data)), 4);
  return out;
}

std::vector<TfRecord> read_tfrecord_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  AG_CHECK(in.good(), "read_tfrecord_file: cannot open ", path, ": ", std::strerror(errno));
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  AG_CHECK(!in.bad(), "read_tfrecord_file: reading ", path, " failed");
  const std::string_view all = file;

  std::vector<TfRecord> records;
  for (size_t pos = 0; pos < all.size();) {
    const size_t remaining = all.size() - pos;
    AG_CHECK(remaining >= 12, path, ": record at offset ", pos, " is truncated: its 12-byte header has only ",
             remaining, " bytes");
    const std::string_view length_bytes = all.substr(pos, 8);
    const auto length_crc = static_cast<uint32_t>(load_le(all.substr(pos + 8, 4)));
    AG_CHECK(crc32c_unmask(length_crc) == crc32c(length_bytes), path, ": record at offset ", pos,
             " has a corrupted length (its CRC does not match)");
    const uint64_t length = load_le(length_bytes);
    // Compared against what remains, so a huge corrupted-but-CRC-valid length cannot overflow or allocate.
    AG_CHECK(length <= remaining - 12 && remaining - 12 - length >= 4, path, ": record at offset ", pos,
             " is truncated: it holds ", length, " bytes of data + 4 of CRC but only ", remaining - 12,
             " bytes follow its header");
    const std::string_view data = all.substr(pos + 12, length);
    const auto data_crc = static_cast<uint32_t>(load_le(all.substr(pos + 12 + length, 4)));
    AG_CHECK(crc32c_unmask(data_crc) == crc32c(data), path, ": record at offset ", pos,
             " has corrupted data (its CRC does not match)");
    records.push_back({pos, std::string(data)});
    pos += 12 + length + 4;
  }
  return records;
}

}  // namespace ampgrad::utils
