// Reads TensorBoard event files back into Event structs (for tests and tools), checking every CRC.
#pragma once

#include <string>
#include <vector>

#include "utils/event.h"

namespace ampgrad::utils {

/// Every event of one file, in order (the first is normally the file_version event). A missing file,
/// a truncated or corrupted record (CRC mismatch) or a malformed Event throws ampgrad::Error naming
/// the file and the record's byte offset.
std::vector<Event> read_events(const std::string& path);

/// The event files (names containing "tfevents") under `folder` and its subfolders, sorted by path.
std::vector<std::string> find_event_files(const std::string& folder);

}  // namespace ampgrad::utils
