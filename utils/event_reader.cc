// Event file reader (see event_reader.h).
#include "utils/event_reader.h"

#include <algorithm>
#include <filesystem>

#include "framework/error.h"
#include "utils/tfrecord.h"

namespace ampgrad::utils {

std::vector<Event> read_events(const std::string& path) {
  std::vector<Event> events;
  for (const TfRecord& record : read_tfrecord_file(path)) {
    const std::string where = path + ": record at offset " + std::to_string(record.offset);
    events.push_back(decode_event(record.data, where));
  }
  return events;
}

std::vector<std::string> find_event_files(const std::string& folder) {
  std::error_code ec;
  std::filesystem::recursive_directory_iterator it(folder, ec);
  AG_CHECK(!ec, "find_event_files: cannot list ", folder, ": ", ec.message());
  std::vector<std::string> files;
  for (const auto& entry : it)
    if (entry.is_regular_file() && entry.path().filename().string().find("tfevents") != std::string::npos)
      files.push_back(entry.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace ampgrad::utils
