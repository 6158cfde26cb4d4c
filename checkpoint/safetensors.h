// Named tensors <-> a safetensors file (the format PyTorch and Hugging Face read): a little-endian
// u64 header length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {...}},
// then the raw little-endian bytes. Saving is atomic; loading validates everything it reads.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "framework/tensor.h"

namespace ampgrad::checkpoint {

struct NamedTensors {
  std::vector<std::pair<std::string, Tensor>> tensors = {};  // saved in this order
  std::map<std::string, std::string> metadata = {};     // the header's "__metadata__"
};

/// Writes `contents` to `path` atomically: a temporary file in the same folder, flushed and
/// fsync'ed, then renamed over `path` (and the folder fsync'ed). On any failure (a full disk, a
/// short write, a crash) the previous file at `path` is left intact; errors throw Error. A new
/// file gets mode 0666 less the umask, a replaced one keeps its mode, and a symbolic link is
/// written through: its target is replaced (the temporary file goes beside the target).
void save_safetensors(const std::string& path, const NamedTensors& contents);

/// Reads a safetensors file onto the CPU (F32, F16, BF16, F64 and I64 tensors). Throws an Error naming the
/// file and the problem for a missing, truncated or corrupted file, an oversized header, an
/// unsupported dtype or inconsistent offsets; it never reads out of bounds and never allocates
/// more than the file's own size.
NamedTensors load_safetensors(const std::string& path);

/// The same parser over bytes in memory (`source` names them in errors). For tests and fuzzing.
NamedTensors parse_safetensors(const std::string& bytes, const std::string& source);

/// Largest JSON header accepted (the reference implementation's limit).
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

}  // namespace ampgrad::checkpoint
