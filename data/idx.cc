// read_idx (see idx.h): zlib's gz* functions read gzip and plain files alike.
#include "data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <cstdio>

#include "framework/error.h"

namespace ampgrad::data {

namespace {

// The largest array read_idx accepts (1 TiB): a header declaring more is corrupt, and the byte
// count then fits any size type.
constexpr uint64_t kMaxValues = uint64_t{1} << 40;
constexpr size_t kChunkBytes = size_t{1} << 24;  // values are read (and the buffer grown) this much at a time

// A gzFile that closes itself; read() throws on a gzip error instead of returning it.
class GzFile {
 public:
  explicit GzFile(const std::string& path) : path_(path) {
    std::error_code ec;
    AG_CHECK(std::filesystem::exists(path, ec), "read_idx: no file ", path);
    AG_CHECK(!std::filesystem::is_directory(path, ec), "read_idx: ", path, " is a folder, not an IDX file");
    errno = 0;
    file_ = gzopen(path.c_str(), "rb");
    AG_CHECK(file_ != nullptr, "read_idx: cannot open ", path, ": ",
             errno != 0 ? std::strerror(errno) : "zlib could not allocate its state");
    gzbuffer(file_, 1 << 17);
  }
  ~GzFile() { gzclose(file_); }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;

  // Reads up to n bytes into out and returns how many it read: fewer than n only at the end of
  // the data. A corrupt stream, or a gzip stream that stops before its end, is an Error.
  size_t read(void* out, size_t n) {
    size_t done = 0;
    while (done < n) {
      const unsigned want = static_cast<unsigned>(std::min<size_t>(n - done, 1u << 30));
      const int got = gzread(file_, static_cast<char*>(out) + done, want);
      if (got <= 0) {
        int code = Z_OK;
        std::string message = gzerror(file_, &code);
        if (message.rfind(path_ + ": ", 0) == 0) message.erase(0, path_.size() + 2);  // zlib prefixes the path
        // zlib reports a stream cut short as Z_BUF_ERROR ("unexpected end of file") at the end.
        AG_CHECK(got == 0 && code == Z_OK, "read_idx: ", path_, ": ",
                 code == Z_BUF_ERROR ? "the gzip stream ends early (the file is truncated)"
                                     : "the gzip data is corrupt",
                 " after ", offset_ + done, " bytes were read (zlib: ", message,
                 code == Z_ERRNO ? std::string(", ") + std::strerror(errno) : std::string(), ")");
        break;
      }
      done += static_cast<size_t>(got);
    }
    offset_ += done;
    return done;
  }

 private:
  std::string path_;
  gzFile file_ = nullptr;
  uint64_t offset_ = 0;  // decompressed bytes read so far, for messages
};

uint32_t big_endian_u32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

const char* idx_type_name(uint8_t type) {
  switch (type) {
    case 0x08: return "unsigned byte";
    case 0x09: return "signed byte";
    case 0x0B: return "int16";
    case 0x0C: return "int32";
    case 0x0D: return "float32";
    case 0x0E: return "float64";
    default: return "not an IDX type";
  }
}

}  // namespace

IdxArray read_idx(const std::string& path, int64_t max_items) {
  GzFile file(path);
  uint8_t magic[4];
  const size_t magic_bytes = file.read(magic, 4);
  AG_CHECK(magic_bytes == 4, "read_idx: ", path, " holds ", magic_bytes,
           " bytes, too few for an IDX header (4 magic bytes and the dimensions)");
  char magic_hex[16];
  std::snprintf(magic_hex, sizeof(magic_hex), "%02x %02x %02x %02x", magic[0], magic[1], magic[2], magic[3]);
  AG_CHECK(magic[0] == 0 && magic[1] == 0, "read_idx: ", path, " is not an IDX file: its magic number is ",
           magic_hex, ", an IDX file starts with 00 00, its element type and its rank");
  AG_CHECK(magic[2] == 0x08, "read_idx: ", path, " holds elements of type 0x", std::hex, int{magic[2]}, std::dec,
           " (", idx_type_name(magic[2]), "); ampgrad reads unsigned-byte IDX files (type 0x08) only");
  const int rank = magic[3];
  AG_CHECK(rank >= 1 && rank <= 8, "read_idx: ", path, " declares rank ", rank, " (magic ", magic_hex,
           "); ampgrad reads IDX arrays of rank 1 to 8");

  uint8_t dims[32];
  const size_t dim_bytes = file.read(dims, 4 * static_cast<size_t>(rank));
  AG_CHECK(dim_bytes == 4 * static_cast<size_t>(rank), "read_idx: ", path, " ends inside its header: rank ", rank,
           " needs ", 4 * rank, " bytes of dimensions, the file has ", dim_bytes);
  IdxArray out;
  uint64_t inner = 1;  // values per item: the product of the dimensions after the first
  for (int d = 0; d < rank; ++d) {
    const uint32_t size = big_endian_u32(dims + 4 * d);
    out.shape.push_back(size);
    const uint64_t factor = d == 0 ? 1 : size;
    AG_CHECK(factor == 0 || inner <= kMaxValues / factor, "read_idx: ", path, " declares shape ",
             shape_to_string(out.shape), "..., more than 2^40 values");
    inner *= factor;
  }
  const Shape declared_shape = out.shape;
  const uint64_t declared = declared_shape[0];
  AG_CHECK(inner == 0 || declared <= kMaxValues / inner, "read_idx: ", path, " declares shape ",
           shape_to_string(declared_shape), ", more than 2^40 values");
  out.declared_items = static_cast<int64_t>(declared);

  const uint64_t items = max_items < 0 ? declared : std::min<uint64_t>(declared, static_cast<uint64_t>(max_items));
  const uint64_t want = items * inner;
  out.shape[0] = static_cast<int64_t>(items);
  // Grow the buffer as data arrives, so a header that lies about its size cannot make us allocate.
  while (out.values.size() < want) {
    const size_t old = out.values.size();
    const size_t n = static_cast<size_t>(std::min<uint64_t>(want - old, kChunkBytes));
    out.values.resize(old + n);
    const size_t got = file.read(out.values.data() + old, n);
    AG_CHECK(got == n, "read_idx: ", path, " is truncated: its header declares shape ",
             shape_to_string(declared_shape), " (", declared * inner, " bytes of values) but they end after ",
             old + got, " bytes");
  }
  if (items == declared) {
    uint8_t extra;
    AG_CHECK(file.read(&extra, 1) == 0, "read_idx: ", path, " has data after the ", want,
             " bytes its header declares (shape ", shape_to_string(out.shape),
             "); hint: is the header's first dimension (the item count) wrong?");
  }
  return out;
}

}  // namespace ampgrad::data
