// safetensors writer (atomic) and validating reader.
#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "checkpoint/safetensors_dtypes.h"
#include "framework/copy.h"
#include "framework/error.h"

namespace ampgrad::checkpoint {

namespace {

using nlohmann::json;

std::string folder_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// Writes all of `bytes` or throws (write() may write less than asked, e.g. near a full disk).
void write_all(int fd, const char* bytes, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t written = ::write(fd, bytes, n);
    if (written < 0 && errno == EINTR) continue;
    AG_CHECK(written > 0, "save_safetensors: writing ", path, " failed: ",
             written < 0 ? std::strerror(errno) : "no progress", " (the previous file, if any, is intact)");
    bytes += written;
    n -= static_cast<size_t>(written);
  }
}

// Where the bytes saved to `path` belong: a symbolic link (or a chain of them, even one whose
// target does not exist yet) is followed, so that a save updates the file the link points at and
// leaves the link a link.
std::string resolve_links(const std::string& path) {
  std::string current = path;
  for (int hops = 0; hops < 40; ++hops) {  // the kernel's own limit
    struct stat info;
    if (::lstat(current.c_str(), &info) != 0 || !S_ISLNK(info.st_mode)) return current;
    std::string target(static_cast<size_t>(info.st_size > 0 ? info.st_size : 255) + 1, '\0');
    const ssize_t n = ::readlink(current.c_str(), target.data(), target.size());
    AG_CHECK(n >= 0 && static_cast<size_t>(n) < target.size(), "save_safetensors: cannot read the symbolic link ",
             current, " (on the way to ", path, "): ", n < 0 ? std::strerror(errno) : "it changed while read");
    target.resize(static_cast<size_t>(n));
    current = target.front() == '/' ? target : folder_of(current) + "/" + target;
  }
  AG_FAIL("save_safetensors: ", path, ": too many levels of symbolic links");
}

// Creates a new, empty temporary file beside `path` and returns its descriptor. Its mode is
// 0666 less the umask (open() applies it), as any newly written file gets; mkstemp's 0600 would
// leave a fresh checkpoint unreadable by the group.
int create_temporary(const std::string& path, std::string& tmp) {
  static std::atomic<uint64_t> counter{0};
  for (int attempt = 0; attempt < 100; ++attempt) {
    const uint64_t salt = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1)) + "." +
          std::to_string(salt % 1000000);
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  errno = EEXIST;
  return -1;
}

std::string little_endian_u64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

}  // namespace

void save_safetensors(const std::string& path, const NamedTensors& contents) {
  static_assert(std::endian::native == std::endian::little, "safetensors stores little-endian bytes");
  json header = json::object();
  uint64_t offset = 0;
  std::vector<Tensor> host;  // CPU copies, in order
  for (const auto& [name, tensor] : contents.tensors) {
    AG_CHECK(tensor.defined(), "save_safetensors(", path, "): tensor '", name, "' is undefined");
    AG_CHECK(name != "__metadata__" && !header.contains(name), "save_safetensors(", path, "): tensor name '", name,
             "' is reserved or used twice");
    Tensor cpu = tensor.detach().to(Device::kCPU);
    const uint64_t nbytes = static_cast<uint64_t>(cpu.numel()) * element_size(cpu.dtype());
    header[name] = {{"dtype", std::string(dtype_info(cpu.dtype()).safetensors_name)},
                    {"shape", cpu.shape()},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    host.push_back(cpu);
  }
  if (!contents.metadata.empty()) header["__metadata__"] = contents.metadata;
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');  // pad so the data starts 8-byte aligned

  // Write beside the real file (a link's target), so the final rename stays in one filesystem.
  const std::string target = resolve_links(path);
  struct stat existing;
  const bool replacing = ::stat(target.c_str(), &existing) == 0;
  std::string tmp;
  const int fd = create_temporary(target, tmp);
  AG_CHECK(fd >= 0, "save_safetensors: cannot create a temporary file next to ", target, ": ", std::strerror(errno),
           "; hint: check that the folder exists and is writable");
  try {
    // A file that is replaced keeps its permissions.
    AG_CHECK(!replacing || ::fchmod(fd, existing.st_mode & 07777) == 0, "save_safetensors: cannot give ", tmp,
             " the mode of ", target, ": ", std::strerror(errno));
    const std::string length = little_endian_u64(header_text.size());
    write_all(fd, length.data(), length.size(), path);
    write_all(fd, header_text.data(), header_text.size(), path);
    for (const Tensor& t : host) {
      write_all(fd, static_cast<const char*>(t.data_ptr()), static_cast<size_t>(t.numel()) * element_size(t.dtype()),
                path);
    }
    AG_CHECK(::fsync(fd) == 0, "save_safetensors: fsync of ", path, " failed: ", std::strerror(errno));
    AG_CHECK(::close(fd) == 0, "save_safetensors: closing ", path, " failed: ", std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    AG_FAIL("save_safetensors: renaming the finished file onto ", target, " failed: ", std::strerror(err));
  }
  // Make the rename itself durable.
  const int dir = ::open(folder_of(target).c_str(), O_RDONLY | O_DIRECTORY);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

NamedTensors parse_safetensors(const std::string& bytes, const std::string& source) {
  const auto fail = [&](const std::string& problem) { AG_FAIL("load_safetensors(", source, "): ", problem); };
  if (bytes.size() < 8) fail("file is truncated: " + std::to_string(bytes.size()) + " bytes, less than the 8-byte header length");
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | static_cast<unsigned char>(bytes[i]);
  if (header_size > kMaxHeaderBytes) fail("header length " + std::to_string(header_size) + " exceeds the limit of " + std::to_string(kMaxHeaderBytes) + " bytes");
  if (header_size > bytes.size() - 8) fail("file is truncated: header says " + std::to_string(header_size) + " bytes but only " + std::to_string(bytes.size() - 8) + " follow");

  json header;
  try {
    header = json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(header_size));
  } catch (const json::exception& e) {
    fail(std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) fail("header is not a JSON object");

  const uint64_t data_size = bytes.size() - 8 - header_size;
  const char* data = bytes.data() + 8 + header_size;
  NamedTensors out;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail("__metadata__ is not an object");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) fail("__metadata__ value of '" + key + "' is not a string");
        out.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + name + "': ";
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets")) {
      fail(where + "needs dtype, shape and data_offsets");
    }
    // A dtype of ampgrad's own is read as it is; the format's others are widened or listed unread.
    const json& dtype_json = entry["dtype"];
    const std::string dtype_text = dtype_json.is_string() ? dtype_json.get<std::string>() : dtype_json.dump();
    const std::optional<DType> native = dtype_json.is_string() ? dtype_from_safetensors_name(dtype_text) : std::nullopt;
    const int foreign_bits = native || !dtype_json.is_string() ? 0 : detail::foreign_dtype_bits(dtype_text);
    if (!native && foreign_bits == 0) {
      fail(where + "unsupported dtype " + dtype_json.dump() + ", which is not a dtype of the safetensors format");
    }
    const uint64_t bits = native ? element_size(*native) * 8 : static_cast<uint64_t>(foreign_bits);
    const json& shape_json = entry["shape"];
    if (!shape_json.is_array()) fail(where + "shape must be an array of dimensions");
    if (shape_json.size() > static_cast<size_t>(kMaxDims)) {
      fail(where + "shape has " + std::to_string(shape_json.size()) + " dimensions, more than the " +
           std::to_string(kMaxDims) + " dimensions an ampgrad tensor may have");
    }
    Shape shape;
    uint64_t numel = 1;
    // A bound that keeps numel * bits from overflowing (every element takes at least 4 bits); the
    // exact byte count is checked against the offsets below, with a clearer message.
    const uint64_t max_numel = data_size * 2;
    for (const json& d : shape_json) {
      if (!d.is_number_unsigned()) fail(where + "shape has a non-integer or negative dimension " + d.dump());
      const uint64_t dim = d.get<uint64_t>();
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        fail(where + "shape " + shape_json.dump() + " has a dimension of 2^63 or more, beyond a tensor's int64 sizes");
      }
      if (dim != 0 && numel > max_numel / dim) fail(where + "shape " + shape_json.dump() + " needs more bytes than the file holds");
      numel *= dim;
      shape.push_back(static_cast<int64_t>(dim));
    }
    if (numel * bits % 8 != 0) fail(where + "shape " + shape_json.dump() + " of " + dtype_text + " is not a whole number of bytes");
    const uint64_t nbytes = numel * bits / 8;
    const json& offsets = entry["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned()) {
      fail(where + "data_offsets must be two unsigned integers");
    }
    const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
    if (begin > end || end > data_size) fail(where + "data_offsets " + offsets.dump() + " fall outside the " + std::to_string(data_size) + "-byte data section");
    if (end - begin != nbytes) fail(where + "data_offsets " + offsets.dump() + " hold " + std::to_string(end - begin) + " bytes but shape " + shape_json.dump() + " of " + dtype_text + " needs " + std::to_string(nbytes));
    ranges.emplace_back(begin, end);
    if (native) {
      Tensor t = Tensor::empty(shape, *native);
      std::memcpy(t.data_ptr(), data + begin, nbytes);
      out.tensors.emplace_back(name, t);
      continue;
    }
    std::string why;
    std::optional<Tensor> widened =
        detail::read_foreign_dtype(dtype_text, data + begin, shape, static_cast<int64_t>(numel), why);
    if (!widened) {
      out.unread[name] = why;
      continue;
    }
    out.tensors.emplace_back(name, *widened);
    out.widened_from[name] = dtype_text;
  }
  // The data section must be covered exactly once (no overlaps, no gaps), as the format requires.
  std::sort(ranges.begin(), ranges.end());
  uint64_t covered = 0;
  for (const auto& [begin, end] : ranges) {
    if (begin != covered) fail("tensor data overlaps or leaves a gap at byte " + std::to_string(std::min(begin, covered)));
    covered = end;
  }
  if (covered != data_size) fail("the data section has " + std::to_string(data_size - covered) + " bytes no tensor uses");
  return out;
}

NamedTensors load_safetensors(const std::string& path) {
  // A folder opens as a stream whose "size" can be 2^63: refuse anything but a regular file.
  struct stat info;
  if (::stat(path.c_str(), &info) == 0) {
    AG_CHECK(S_ISREG(info.st_mode), "load_safetensors(", path, "): not a regular file (a folder?)");
  }
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  AG_CHECK(in.is_open(), "load_safetensors(", path, "): cannot open the file: ", std::strerror(errno));
  const std::streamsize size = in.tellg();
  AG_CHECK(size >= 0, "load_safetensors(", path, "): cannot read the file size");
  std::string bytes(static_cast<size_t>(size), '\0');
  in.seekg(0);
  AG_CHECK(in.read(bytes.data(), size), "load_safetensors(", path, "): reading ", size, " bytes failed");
  return parse_safetensors(bytes, path);
}

}  // namespace ampgrad::checkpoint
