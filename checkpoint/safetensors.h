// Named tensors <-> a safetensors file (the format PyTorch and Hugging Face read): a little-endian
// u64 header length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {...}},
// then the raw little-endian bytes. Saving is atomic; loading validates everything it reads.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "framework/tensor.h"

namespace ampgrad::checkpoint {

/// A safetensors file's contents: the tensors in file order and the header's metadata.
struct NamedTensors {
  std::vector<std::pair<std::string, Tensor>> tensors = {};  ///< saved in this order
  std::map<std::string, std::string> metadata = {};     ///< the header's "__metadata__"
  /// Filled by load: a tensor stored in a dtype of the format that ampgrad has no dtype for, read
  /// into a wider one that holds each of its values exactly (the FNUZ and E8M0 8-bit floats into float32; BOOL,
  /// U8, I8, I16, U16, I32, U32 and U64 into int64): name -> the file's dtype ("I32"). Save ignores
  /// it (it writes each tensor's own dtype).
  std::map<std::string, std::string> widened_from = {};
  /// Filled by load: entries that were validated but not read, since no ampgrad dtype holds their
  /// values exactly (C64, the packed F4/F6 floats, U64 values above int64's maximum): name -> why.
  /// They are not in `tensors`.
  std::map<std::string, std::string> unread = {};
};

/// Writes `contents` to `path` atomically: a temporary file in the same folder, flushed and
/// fsync'ed, then renamed over `path` (and the folder fsync'ed). On any failure (a full disk, a
/// short write, a crash) the previous file at `path` is left intact; errors throw Error. A new
/// file gets mode 0666 less the umask, a replaced one keeps its mode, and a symbolic link is
/// written through: its target is replaced (the temporary file goes beside the target).
void save_safetensors(const std::string& path, const NamedTensors& contents);

/// Reads a safetensors file onto the CPU. Every dtype of the format is accepted: F32, F16, BF16,
/// F64, I64, F8_E4M3 and F8_E5M2 are read as they are, the others widened exactly or listed as unread (see
/// NamedTensors), so one tensor never makes a whole file unreadable. Throws an Error naming the
/// file and the problem for a missing, truncated or corrupted file, an oversized header, a dtype
/// the format does not define or inconsistent offsets; it never reads out of bounds and never
/// allocates more than a few times the file's own size (a widened tensor takes 2-8x its bytes).
NamedTensors load_safetensors(const std::string& path);

/// The same parser over bytes in memory (`source` names them in errors). For tests and fuzzing.
NamedTensors parse_safetensors(const std::string& bytes, const std::string& source);

/// Largest JSON header accepted (the reference implementation's limit).
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

}  // namespace ampgrad::checkpoint
