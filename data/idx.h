// IDX files, the format of MNIST and its relatives (Fashion-MNIST, KMNIST, EMNIST): a magic number
// (0, 0, element type, rank), big-endian u32 dimensions, then the values in row-major order.
// Read plain or gzip-compressed (zlib tells them apart), with every inconsistency an Error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "framework/tensor.h"

namespace ampgrad::data {

/// An IDX array of unsigned bytes (element type 0x08, the only one the MNIST family uses).
struct IdxArray {
  Shape shape;                  ///< what was read: shape[0] is at most read_idx's max_items
  int64_t declared_items = 0;   ///< the header's first dimension (all the file holds)
  std::vector<uint8_t> values;  ///< row-major, shape_numel(shape) of them
};

/// Reads the IDX file at `path`, gzip-compressed or not. max_items >= 0 reads only the first
/// max_items entries along the first dimension (the rest of the file is not decompressed); < 0
/// reads them all and then checks that nothing follows. Throws an Error naming the file for a
/// missing or unreadable file, a corrupt or truncated gzip stream, a wrong magic number, an element
/// type other than unsigned byte, a rank outside [1, 8], or fewer (or more) values than the header
/// declares. Never allocates much more than the bytes actually present.
IdxArray read_idx(const std::string& path, int64_t max_items = -1);

}  // namespace ampgrad::data
