// safetensors I/O: round trips, the exact byte layout, atomic replacement when a save fails
// part-way, file modes and symbolic links on save, and clear errors for every kind of bad file.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "framework/allocator.h"
#include "framework/autograd.h"
#include "framework/device.h"
#include "framework/dtype.h"
#include "framework/error.h"
#include "framework/parallel.h"
#include "framework/random.h"
#include "framework/tensor.h"
#include "test_util.h"

namespace ag = ampgrad;
namespace ck = ampgrad::checkpoint;
namespace fs = std::filesystem;

namespace {

class SafetensorsTest : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return scratch_.path(name); }

  static std::string read_bytes(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  static void write_bytes(const std::string& p, const std::string& bytes) {
    std::ofstream(p, std::ios::binary) << bytes;
  }
  // A file made of an 8-byte length, `header` and `data`.
  static std::string file_with_header(const std::string& header, const std::string& data) {
    std::string out(8, '\0');
    uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    return out + header + data;
  }

  // Loading `bytes` throws an Error whose message contains `expected` and the file's name.
  void expect_load_error(const std::string& bytes, const std::string& expected) {
    const std::string p = path("bad.safetensors");
    write_bytes(p, bytes);
    try {
      ck::load_safetensors(p);
      ADD_FAILURE() << "no error for a file expected to fail with: " << expected;
    } catch (const ag::Error& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("bad.safetensors"), std::string::npos) << e.what();
    }
  }

  ag::test::ScratchDir scratch_{"safetensors"};
};

ck::NamedTensors sample() {
  ag::manual_seed(3);
  ck::NamedTensors c;
  c.tensors.emplace_back("a.weight", ag::randn({3, 4}));
  c.tensors.emplace_back("b.half", ag::randn({5}, ag::DType::kFloat16));
  c.tensors.emplace_back("b.bfloat16", ag::randn({2, 3}, ag::DType::kBFloat16));
  c.tensors.emplace_back("c.double", ag::randn({2, 1, 2}, ag::DType::kFloat64));
  c.tensors.emplace_back("scalar", ag::full({}, 7.5));
  c.metadata["format"] = "pt";
  c.metadata["note"] = "hello";
  return c;
}

TEST_F(SafetensorsTest, RoundTripKeepsNamesDtypesShapesValuesAndMetadata) {
  const ck::NamedTensors saved = sample();
  ck::save_safetensors(path("m.safetensors"), saved);
  const ck::NamedTensors loaded = ck::load_safetensors(path("m.safetensors"));
  ASSERT_EQ(loaded.tensors.size(), saved.tensors.size());
  EXPECT_EQ(loaded.metadata, saved.metadata);
  for (const auto& [name, t] : saved.tensors) {
    auto it = std::find_if(loaded.tensors.begin(), loaded.tensors.end(), [&](const auto& e) { return e.first == name; });
    ASSERT_NE(it, loaded.tensors.end()) << name;
    EXPECT_EQ(it->second.dtype(), t.dtype());
    EXPECT_EQ(it->second.shape(), t.shape());
    EXPECT_EQ(it->second.to_double_vector(), t.to_double_vector()) << name;
  }
}

// Whatever rank a tensor may have, a file ampgrad writes reads back (PyTorch loads such files too).
TEST_F(SafetensorsTest, TensorsOfEveryRankRoundTrip) {
  ck::NamedTensors saved;
  saved.tensors.emplace_back("nine", ag::randn(ag::Shape(9, 2)));
  ag::Shape most(ag::kMaxDims, 1);
  most[3] = 2;
  saved.tensors.emplace_back("most", ag::randn(most, ag::DType::kBFloat16));
  ck::save_safetensors(path("ranks.safetensors"), saved);
  const ck::NamedTensors loaded = ck::load_safetensors(path("ranks.safetensors"));
  ASSERT_EQ(loaded.tensors.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const ag::Tensor& want = saved.tensors[i].second;
    auto it = std::find_if(loaded.tensors.begin(), loaded.tensors.end(),
                           [&](const auto& e) { return e.first == saved.tensors[i].first; });
    ASSERT_NE(it, loaded.tensors.end());
    EXPECT_EQ(it->second.shape(), want.shape());
    EXPECT_EQ(it->second.to_double_vector(), want.to_double_vector());
  }
}

TEST_F(SafetensorsTest, ByteLayoutFollowsTheFormat) {
  ck::NamedTensors c;
  c.tensors.emplace_back("x", ag::Tensor::from_vector(std::vector<float>{1.0f, -2.0f}, {2}));
  ck::save_safetensors(path("x.safetensors"), c);
  const std::string bytes = read_bytes(path("x.safetensors"));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  EXPECT_EQ((8 + n) % 8, 0u);  // data starts 8-byte aligned
  const std::string header = bytes.substr(8, n);
  EXPECT_NE(header.find(R"("x":{"data_offsets":[0,8],"dtype":"F32","shape":[2]})"), std::string::npos) << header;
  ASSERT_EQ(bytes.size(), 8 + n + 8);
  float values[2];
  std::memcpy(values, bytes.data() + 8 + n, 8);
  EXPECT_EQ(values[0], 1.0f);
  EXPECT_EQ(values[1], -2.0f);
}

// BF16 is stored as safetensors' "BF16": each value the upper two bytes of its float32,
// little-endian, which safetensors.torch reads as torch.bfloat16.
TEST_F(SafetensorsTest, Bfloat16IsStoredAsBF16) {
  ck::NamedTensors c;
  const std::vector<float> values{1.0f, -2.0f, 0x1p-130f};
  c.tensors.emplace_back("w", ag::Tensor::from_vector(values, {3}, ag::DType::kBFloat16));
  ck::save_safetensors(path("w.safetensors"), c);
  const std::string bytes = read_bytes(path("w.safetensors"));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  const std::string header = bytes.substr(8, n);
  EXPECT_NE(header.find(R"("w":{"data_offsets":[0,6],"dtype":"BF16","shape":[3]})"), std::string::npos) << header;
  ASSERT_EQ(bytes.size(), 8 + n + 6);
  // 1.0f is 0x3f800000, -2.0f 0xc0000000; 2^-130 is a BF16 subnormal, 0x0008 (8 * 2^-133).
  EXPECT_EQ(bytes.substr(8 + n), std::string("\x80\x3f\x00\xc0\x08\x00", 6));
  const ck::NamedTensors loaded = ck::load_safetensors(path("w.safetensors"));
  ASSERT_EQ(loaded.tensors.size(), 1u);
  EXPECT_EQ(loaded.tensors[0].second.dtype(), ag::DType::kBFloat16);
  EXPECT_EQ(loaded.tensors[0].second.to_vector(), values);
}

TEST_F(SafetensorsTest, FailedSaveLeavesThePreviousFileIntact) {
  const std::string p = path("ckpt.safetensors");
  ck::save_safetensors(p, sample());
  const std::string before = read_bytes(p);

  // A full disk mid-write: a child process whose file size limit is below the checkpoint's size.
  const pid_t child = ::fork();
  if (child == 0) {
    std::signal(SIGXFSZ, SIG_IGN);  // write() then fails with EFBIG instead of killing us
    rlimit limit{4096, 4096};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    ck::NamedTensors big;
    big.tensors.emplace_back("w", ag::zeros({4096}));  // 16 KiB > 4 KiB
    try {
      ck::save_safetensors(p, big);
    } catch (const ag::Error&) {
      ::_exit(0);  // the expected failure
    }
    ::_exit(1);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the short write was not reported as an Error";
  EXPECT_EQ(read_bytes(p), before);
  EXPECT_NO_THROW(ck::load_safetensors(p));

  // A crash mid-write: a child killed while it saves a large checkpoint over and over.
  const pid_t writer = ::fork();
  if (writer == 0) {
    ck::NamedTensors big;
    big.tensors.emplace_back("w", ag::zeros({1 << 22}));  // 16 MiB
    for (;;) ck::save_safetensors(p, big);
  }
  ::usleep(150 * 1000);
  ::kill(writer, SIGKILL);
  ::waitpid(writer, &status, 0);
  // Either the old file or a complete new one: never a torn file.
  const ck::NamedTensors after = ck::load_safetensors(p);
  EXPECT_FALSE(after.tensors.empty());
  for (const auto& entry : fs::directory_iterator(scratch_.dir())) {
    if (entry.path().string().find(".tmp.") != std::string::npos) fs::remove(entry.path());  // what a crash leaves
  }
}

// The permission bits of `p` (following links).
mode_t mode_of(const std::string& p) { return static_cast<mode_t>(fs::status(p).permissions() & fs::perms::mask); }

TEST_F(SafetensorsTest, NewFilesGetTheUmaskModeAndReplacedFilesKeepTheirs) {
  const mode_t saved_umask = ::umask(022);
  for (const mode_t mask : {mode_t{022}, mode_t{077}, mode_t{002}}) {
    ::umask(mask);
    const std::string p = path("new_" + std::to_string(mask) + ".safetensors");
    ck::save_safetensors(p, sample());
    EXPECT_EQ(mode_of(p), 0666 & ~mask) << "umask " << std::oct << mask;
  }
  ::umask(022);
  const std::string p = path("existing.safetensors");
  for (const mode_t mode : {mode_t{0640}, mode_t{0604}, mode_t{0600}, mode_t{0664}}) {
    ck::save_safetensors(p, sample());
    ASSERT_EQ(::chmod(p.c_str(), mode), 0);
    ck::save_safetensors(p, sample());  // replaces it
    EXPECT_EQ(mode_of(p), mode) << std::oct << mode;
  }
  ::umask(saved_umask);
}

TEST_F(SafetensorsTest, SavingThroughASymlinkWritesItsTarget) {
  fs::create_directories(scratch_.dir() / "links");
  fs::create_directories(scratch_.dir() / "data");
  const std::string target = path("data/run.safetensors"), link = path("links/run.safetensors");
  fs::create_symlink("../data/run.safetensors", link);  // relative, and dangling until the first save
  for (int round = 0; round < 2; ++round) {
    ck::NamedTensors c;
    c.tensors.emplace_back("round", ag::full({1}, round));
    ck::save_safetensors(link, c);
    EXPECT_TRUE(fs::is_symlink(link));
    EXPECT_EQ(fs::read_symlink(link), "../data/run.safetensors");
    EXPECT_EQ(ck::load_safetensors(target).tensors.at(0).second.item(), static_cast<float>(round));
  }
  // A chain of links, with the target's mode kept.
  ASSERT_EQ(::chmod(target.c_str(), 0640), 0);
  fs::create_symlink(link, path("second_link"));
  ck::save_safetensors(path("second_link"), sample());
  EXPECT_TRUE(fs::is_symlink(path("second_link")));
  EXPECT_EQ(ck::load_safetensors(target).tensors.size(), sample().tensors.size());
  EXPECT_EQ(mode_of(target), 0640);
  // Nothing temporary is left anywhere.
  for (const auto& entry : fs::recursive_directory_iterator(scratch_.dir())) {
    EXPECT_EQ(entry.path().string().find(".tmp."), std::string::npos) << entry.path();
  }
}

TEST_F(SafetensorsTest, BadFilesGiveClearErrors) {
  const std::string tensor = R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string data(8, '\0');
  ASSERT_NO_THROW(ck::parse_safetensors(file_with_header(tensor, data), "ok"));

  expect_load_error("", "truncated");
  expect_load_error(std::string("\x10\0\0\0", 4), "truncated");
  expect_load_error(file_with_header(tensor, data).substr(0, 20), "truncated");
  expect_load_error(file_with_header(tensor, data.substr(0, 4)), "outside");
  expect_load_error(std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}", "exceeds the limit");
  expect_load_error(file_with_header("{not json", ""), "not valid JSON");
  expect_load_error(file_with_header("[1,2]", ""), "not a JSON object");
  expect_load_error(file_with_header(R"({"t":{"dtype":"X7","shape":[2],"data_offsets":[0,4]}})", std::string(4, '\0')),
                    "unsupported dtype");  // not a dtype of the format
  expect_load_error(file_with_header(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data), "needs 12");
  expect_load_error(file_with_header(R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data),
                    "negative");
  expect_load_error(
      file_with_header(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", data),
      "more bytes than the file holds");
  expect_load_error(
      file_with_header(R"({"t":{"dtype":"F32","shape":[0,9223372036854775808],"data_offsets":[0,0]}})", ""),
      "2^63 or more");
  std::string ones_26 = "[1";  // one dimension more than a tensor may have
  for (int i = 1; i < ag::kMaxDims + 1; ++i) ones_26 += ",1";
  ones_26 += "]";
  expect_load_error(file_with_header(R"({"t":{"dtype":"F32","shape":)" + ones_26 + R"(,"data_offsets":[0,4]}})",
                                     std::string(4, '\0')),
                    "more than the 25 dimensions");
  expect_load_error(file_with_header(R"({"t":{"dtype":"F32","shape":[2]}})", data), "data_offsets");
  expect_load_error(file_with_header(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", data), "no tensor uses");
  expect_load_error(file_with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                     R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                     data),
                    "overlaps");
  expect_load_error(file_with_header(R"({"__metadata__":{"k":1}})", ""), "not a string");
  try {
    ck::load_safetensors(path("missing.safetensors"));
    ADD_FAILURE() << "no error for a missing file";
  } catch (const ag::Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing.safetensors"), std::string::npos) << e.what();
  }
}

}  // namespace
