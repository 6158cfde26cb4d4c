// data::read_idx and data::load_mnist on files written here (plain and gzip, through zlib): the
// values, partial reads, and a clear Error for every broken file (missing, truncated, corrupt,
// wrong magic or type, counts that disagree, labels out of range).
#include <zlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/idx.h"
#include "data/mnist.h"
#include "tests/test_util.h"

namespace ampgrad {
namespace {

using Bytes = std::vector<uint8_t>;
namespace fs = std::filesystem;

// A fresh folder under the test's temporary directory.
std::string temp_dir(const std::string& name) {
  const char* root = std::getenv("TEST_TMPDIR");
  const fs::path dir = fs::path(root != nullptr ? root : "/tmp") / ("idx_test_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

// An IDX file's bytes: magic (0, 0, type, rank), big-endian dimensions, then the values.
Bytes idx_bytes(const Shape& shape, const Bytes& values, uint8_t type = 0x08) {
  Bytes out = {0, 0, type, static_cast<uint8_t>(shape.size())};
  for (const int64_t d : shape) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(d >> shift));
  }
  out.insert(out.end(), values.begin(), values.end());
  return out;
}

Bytes gzip(const Bytes& raw) {
  uLongf size = compressBound(raw.size()) + 32;
  Bytes out(size);
  z_stream s{};
  // windowBits 15 + 16: a gzip wrapper (header, CRC-32 and length trailer), as the .gz files have.
  EXPECT_EQ(deflateInit2(&s, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  s.next_in = const_cast<Bytef*>(raw.data());
  s.avail_in = static_cast<uInt>(raw.size());
  s.next_out = out.data();
  s.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&s, Z_FINISH), Z_STREAM_END);
  out.resize(s.total_out);
  deflateEnd(&s);
  return out;
}

void write_file(const std::string& path, const Bytes& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

Bytes ramp(size_t n, int mul = 7) {
  Bytes v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * mul);
  return v;
}

// An MNIST-layout folder with n images of 2 x 3 pixels and n labels (train split), gzipped.
std::string mnist_dir(const std::string& name, int64_t images, int64_t labels, uint8_t max_label = 9) {
  const std::string dir = temp_dir(name);
  write_file(dir + "/train-images-idx3-ubyte.gz", gzip(idx_bytes({images, 2, 3}, ramp(images * 6))));
  Bytes l(labels);
  for (int64_t i = 0; i < labels; ++i) l[i] = static_cast<uint8_t>(i % (max_label + 1));
  write_file(dir + "/train-labels-idx1-ubyte.gz", gzip(idx_bytes({labels}, l)));
  return dir;
}

TEST(ReadIdx, PlainAndGzipGiveTheSameValues) {
  const std::string dir = temp_dir("values");
  const Bytes values = ramp(4 * 5 * 3);
  write_file(dir + "/a.idx", idx_bytes({4, 5, 3}, values));
  write_file(dir + "/a.idx.gz", gzip(idx_bytes({4, 5, 3}, values)));
  for (const std::string& path : {dir + "/a.idx", dir + "/a.idx.gz"}) {
    const data::IdxArray a = data::read_idx(path);
    EXPECT_EQ(a.shape, (Shape{4, 5, 3})) << path;
    EXPECT_EQ(a.declared_items, 4);
    EXPECT_EQ(a.values, values) << path;
  }
}

TEST(ReadIdx, MaxItemsReadsThePrefix) {
  const std::string dir = temp_dir("prefix");
  const Bytes values = ramp(10 * 4);
  write_file(dir + "/a.gz", gzip(idx_bytes({10, 4}, values)));
  const data::IdxArray a = data::read_idx(dir + "/a.gz", 3);
  EXPECT_EQ(a.shape, (Shape{3, 4}));
  EXPECT_EQ(a.declared_items, 10);
  EXPECT_EQ(a.values, Bytes(values.begin(), values.begin() + 12));
  EXPECT_EQ(data::read_idx(dir + "/a.gz", 0).values.size(), 0u);
  EXPECT_EQ(data::read_idx(dir + "/a.gz", 50).shape, (Shape{10, 4}));  // more than there are: all
}

TEST(ReadIdx, MissingFile) {
  const std::string dir = temp_dir("missing");
  EXPECT_ERROR([&] { data::read_idx(dir + "/nope.gz"); }, "read_idx", "no file", "nope.gz");
  EXPECT_ERROR([&] { data::read_idx(dir); }, "is a folder");
}

TEST(ReadIdx, TruncatedGzip) {
  const std::string dir = temp_dir("truncated");
  const Bytes gz = gzip(idx_bytes({50, 20}, ramp(1000, 13)));
  write_file(dir + "/half.gz", Bytes(gz.begin(), gz.begin() + static_cast<long>(gz.size() / 2)));
  EXPECT_ERROR([&] { data::read_idx(dir + "/half.gz"); }, "half.gz", "truncated");
  // Only the 8-byte trailer (CRC-32 and length) missing: every value is there, the stream is not.
  write_file(dir + "/no_trailer.gz", Bytes(gz.begin(), gz.end() - 8));
  EXPECT_ERROR([&] { data::read_idx(dir + "/no_trailer.gz"); }, "no_trailer.gz", "ends early", "truncated");
  // Cut inside the IDX header.
  write_file(dir + "/header.gz", gzip(Bytes{0, 0, 8, 3, 0, 0}));
  EXPECT_ERROR([&] { data::read_idx(dir + "/header.gz"); }, "header.gz", "ends inside its header");
  write_file(dir + "/empty", Bytes{});
  EXPECT_ERROR([&] { data::read_idx(dir + "/empty"); }, "holds 0 bytes");
}

TEST(ReadIdx, CorruptGzip) {
  const std::string dir = temp_dir("corrupt");
  Bytes gz = gzip(idx_bytes({50, 20}, ramp(1000, 13)));
  Bytes bad_crc = gz;
  bad_crc[bad_crc.size() - 8] ^= 0xff;  // the CRC-32 of the trailer
  write_file(dir + "/crc.gz", bad_crc);
  EXPECT_ERROR([&] { data::read_idx(dir + "/crc.gz"); }, "crc.gz", "corrupt", "incorrect data check");
  Bytes bad_data = gz;
  for (size_t i = 12; i < 40; ++i) bad_data[i] ^= 0x5a;  // inside the deflate stream
  write_file(dir + "/data.gz", bad_data);
  EXPECT_ERROR([&] { data::read_idx(dir + "/data.gz"); }, "data.gz", "corrupt");
}

TEST(ReadIdx, WrongMagicTypeOrRank) {
  const std::string dir = temp_dir("magic");
  write_file(dir + "/text.gz", gzip(Bytes{'h', 'e', 'l', 'l', 'o'}));
  EXPECT_ERROR([&] { data::read_idx(dir + "/text.gz"); }, "text.gz", "not an IDX file", "68 65 6c 6c");
  write_file(dir + "/float.gz", gzip(idx_bytes({2}, Bytes(8), 0x0D)));
  EXPECT_ERROR([&] { data::read_idx(dir + "/float.gz"); }, "float.gz", "type 0xd", "float32", "unsigned-byte");
  write_file(dir + "/rank0.gz", gzip(idx_bytes({}, Bytes{})));
  EXPECT_ERROR([&] { data::read_idx(dir + "/rank0.gz"); }, "rank 0");
  // A header that declares far more than the file holds: an error, not a huge allocation.
  write_file(dir + "/huge.gz", gzip(idx_bytes({0xffffffff, 0xffffffff}, Bytes(16))));
  EXPECT_ERROR([&] { data::read_idx(dir + "/huge.gz"); }, "more than 2^40 values");
  write_file(dir + "/liar.gz", gzip(idx_bytes({1 << 20, 1 << 10}, Bytes(16))));
  EXPECT_ERROR([&] { data::read_idx(dir + "/liar.gz"); }, "truncated", "[1048576, 1024]", "end after 16 bytes");
}

TEST(ReadIdx, CountsThatDisagreeWithTheData) {
  const std::string dir = temp_dir("counts");
  write_file(dir + "/short.gz", gzip(idx_bytes({5, 4}, ramp(4 * 4))));  // 5 items declared, 4 present
  EXPECT_ERROR([&] { data::read_idx(dir + "/short.gz"); }, "short.gz", "truncated", "[5, 4]", "end after 16 bytes");
  EXPECT_EQ(data::read_idx(dir + "/short.gz", 4).shape, (Shape{4, 4}));  // the prefix that exists reads fine
  write_file(dir + "/long.gz", gzip(idx_bytes({3, 4}, ramp(4 * 4))));  // 3 declared, 4 present
  EXPECT_ERROR([&] { data::read_idx(dir + "/long.gz"); }, "long.gz", "data after the 12 bytes");
}

TEST(LoadMnist, ImagesScaledAndLabels) {
  const std::string dir = mnist_dir("ok", 5, 5);
  const data::MnistData d = data::load_mnist(dir, data::MnistSplit::kTrain);
  EXPECT_EQ(d.images.shape(), (Shape{5, 2, 3}));
  EXPECT_EQ(d.images.dtype(), DType::kFloat32);
  const std::vector<float> pixels = d.images.to_vector();
  const Bytes raw = ramp(30);
  for (size_t i = 0; i < raw.size(); ++i) EXPECT_EQ(pixels[i], static_cast<float>(raw[i]) / 255.0f);
  EXPECT_EQ(d.labels.dtype(), DType::kInt64);
  EXPECT_EQ(d.labels.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(data::load_mnist(dir, data::MnistSplit::kTrain, {.max_samples = 2}).labels.numel(), 2);
}

TEST(LoadMnist, PrefersGzipAndReadsPlainFiles) {
  const std::string dir = temp_dir("plain");
  write_file(dir + "/t10k-images-idx3-ubyte", idx_bytes({2, 1, 1}, Bytes{10, 20}));
  write_file(dir + "/t10k-labels-idx1-ubyte", idx_bytes({2}, Bytes{3, 4}));
  EXPECT_EQ(data::mnist_path(dir, data::MnistSplit::kTest, data::MnistFile::kImages), dir + "/t10k-images-idx3-ubyte");
  EXPECT_EQ(data::load_mnist(dir, data::MnistSplit::kTest).labels.to_vector<int64_t>(), (std::vector<int64_t>{3, 4}));
  write_file(dir + "/t10k-labels-idx1-ubyte.gz", gzip(idx_bytes({2}, Bytes{5, 6})));
  EXPECT_EQ(data::mnist_path(dir, data::MnistSplit::kTest, data::MnistFile::kLabels),
            dir + "/t10k-labels-idx1-ubyte.gz");
  EXPECT_EQ(data::load_mnist(dir, data::MnistSplit::kTest).labels.to_vector<int64_t>(), (std::vector<int64_t>{5, 6}));
}

TEST(LoadMnist, Errors) {
  EXPECT_ERROR([] { data::load_mnist(temp_dir("empty"), data::MnistSplit::kTrain); }, "no file",
               "train-images-idx3-ubyte.gz");
  EXPECT_ERROR([] { data::load_mnist(mnist_dir("counts", 5, 4), data::MnistSplit::kTrain); }, "holds 5 images",
               "holds 4 labels");
  // The counts are compared on the headers, also when only a prefix is read.
  EXPECT_ERROR([] { data::load_mnist(mnist_dir("counts2", 5, 4), data::MnistSplit::kTrain, {.max_samples = 2}); },
               "holds 5 images", "holds 4 labels");
  EXPECT_ERROR([] { data::load_mnist(mnist_dir("label", 12, 12, 11), data::MnistSplit::kTrain); }, "label 10 is 10",
               "outside [0, 10)");
  const std::string dir = mnist_dir("rank", 3, 3);
  write_file(dir + "/train-images-idx3-ubyte.gz", gzip(idx_bytes({3, 6}, ramp(18))));
  EXPECT_ERROR([&] { data::load_mnist(dir, data::MnistSplit::kTrain); }, "[3, 6]", "[count, rows, columns]");
}

}  // namespace
}  // namespace ampgrad
