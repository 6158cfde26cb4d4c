// TFRecord framing, the container of TensorBoard event files. Each record is
//   uint64 length (little-endian) | uint32 masked crc32c(length bytes) | data | uint32 masked crc32c(data)
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ampgrad::utils {

/// The framed bytes of one record holding `data`.
std::string tfrecord_frame(std::string_view data);

/// One record read back: where its header starts in the file, and its payload.
struct TfRecord {
  uint64_t offset = 0;  ///< the byte offset of its header in the file
  std::string data;     ///< its payload
};

/// Reads every record of a TFRecord file, verifying both CRCs of each. A missing file, a truncated
/// record or a CRC mismatch throws ampgrad::Error naming the file and the record's byte offset.
std::vector<TfRecord> read_tfrecord_file(const std::string& path);

}  // namespace ampgrad::utils
