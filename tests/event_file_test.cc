// The event file format below SummaryWriter: protobuf wire encoding against hand-computed bytes,
// TFRecord framing, and the reader's round trip and corruption detection (every flipped byte,
// every truncation).
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/test_util.h"
#include "utils/crc32c.h"
#include "utils/event.h"
#include "utils/event_reader.h"
#include "utils/proto_wire.h"
#include "utils/tfrecord.h"

namespace ampgrad::utils {
namespace {

namespace fs = std::filesystem;

std::string bytes(std::initializer_list<int> values) {
  std::string out;
  for (int v : values) out.push_back(static_cast<char>(v));
  return out;
}

std::string temp_file(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("event_file_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return (dir / name).string();
}

void write_file(const std::string& path, const std::string& data) {
  std::ofstream(path, std::ios::binary) << data;
}

TEST(EventEncoding, FileVersionEventHasTheProtobufBytes) {
  // Event{wall_time = 1.5, step = 3, file_version = "brain.Event:2"}:
  // key 0x09 (field 1, fixed64) + 1.5 little-endian; 0x10 (field 2, varint) 3; 0x1a (field 3, bytes) 13 + text.
  const std::string expected = bytes({0x09, 0, 0, 0, 0, 0, 0, 0xf8, 0x3f, 0x10, 0x03, 0x1a, 0x0d}) + "brain.Event:2";
  EXPECT_EQ(encode_event({.wall_time = 1.5, .step = 3, .file_version = "brain.Event:2", .values = {}}), expected);
}

TEST(EventEncoding, ScalarEventHasTheProtobufBytes) {
  // Value{tag "loss" (0x0a 4 ...), simple_value 0.5f (0x15 + 0x3f000000 LE)} inside Summary.value (0x0a 11)
  // inside Event.summary (0x2a 13).
  const std::string value = bytes({0x0a, 0x04}) + "loss" + bytes({0x15, 0, 0, 0, 0x3f});
  const std::string summary = bytes({0x0a, 0x0b}) + value;
  const std::string expected = bytes({0x09, 0, 0, 0, 0, 0, 0, 0, 0x40, 0x10, 0x07, 0x2a, 0x0d}) + summary;
  EXPECT_EQ(encode_event({.wall_time = 2.0, .step = 7, .file_version = {},
                          .values = {{.tag = "loss", .simple_value = 0.5f, .histo = {}}}}),
            expected);
}

TEST(EventEncoding, HistogramUsesPackedDoubles) {
  Histogram h{.min = 1, .max = 2, .num = 3, .sum = 4, .sum_squares = 5, .bucket_limit = {1.0, 2.0}, .bucket = {0, 3}};
  const std::string encoded = encode_event({.wall_time = 0, .step = 0, .file_version = {},
                                            .values = {{.tag = "h", .simple_value = {}, .histo = h}}});
  // bucket_limit: key 0x32 (field 6, length-delimited), 16 bytes, 1.0 then 2.0.
  const std::string limits = bytes({0x32, 0x10, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f, 0, 0, 0, 0, 0, 0, 0, 0x40});
  EXPECT_NE(encoded.find(limits), std::string::npos);
  const Event back = decode_event(encoded, "test");
  ASSERT_EQ(back.values.size(), 1u);
  ASSERT_TRUE(back.values[0].histo.has_value());
  EXPECT_FALSE(back.values[0].simple_value.has_value());
  EXPECT_EQ(back.values[0].histo->bucket_limit, h.bucket_limit);
  EXPECT_EQ(back.values[0].histo->bucket, h.bucket);
  EXPECT_EQ(back.values[0].histo->sum_squares, 5.0);
}

TEST(EventEncoding, RoundTripsNegativeAndLargeSteps) {
  for (int64_t step : {int64_t{0}, int64_t{-1}, int64_t{1} << 40, INT64_MAX, INT64_MIN}) {
    const Event back = decode_event(encode_event({.wall_time = 3.25, .step = step, .file_version = {}, .values = {}}), "t");
    EXPECT_EQ(back.step, step);
    EXPECT_EQ(back.wall_time, 3.25);
  }
}

TEST(EventEncoding, DecodeSkipsUnknownFieldsAndRejectsMalformedBytes) {
  ProtoWriter w;
  w.add_int64(2, 42);
  w.add_bytes(10, "source metadata");  // SourceMetadata, which the reader does not use
  w.add_varint(99, 5);
  w.add_float(98, 1.0f);
  EXPECT_EQ(decode_event(w.bytes(), "t").step, 42);

  const std::string good = encode_event({.wall_time = 1, .step = 1, .file_version = "brain.Event:2", .values = {}});
  EXPECT_TRUE(test::throws_error([&] { decode_event(good.substr(0, good.size() - 3), "file.x: record at offset 24"); },
                                 {"file.x: record at offset 24", "remain"}));
  EXPECT_TRUE(test::throws_error([] { decode_event(bytes({0x10, 0x80}), "w"); }, {"w", "varint"}));
  EXPECT_TRUE(test::throws_error([] { decode_event(bytes({0x0b, 0x00}), "w"); }, {"w", "wire type 3"}));
  EXPECT_TRUE(test::throws_error([] { decode_event(bytes({0x11, 0, 0, 0, 0, 0, 0, 0, 0}), "w"); }, {"w", "field 2 has wire type 1"}));
}

TEST(TfRecord, FramesLengthCrcDataCrc) {
  const std::string data = "hello";
  const std::string framed = tfrecord_frame(data);
  ASSERT_EQ(framed.size(), 8 + 4 + data.size() + 4);
  EXPECT_EQ(framed.substr(0, 8), bytes({5, 0, 0, 0, 0, 0, 0, 0}));
  auto u32_at = [&](size_t pos) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(framed[pos + i])) << (8 * i);
    return v;
  };
  EXPECT_EQ(u32_at(8), crc32c_mask(crc32c(framed.data(), 8)));
  EXPECT_EQ(framed.substr(12, 5), data);
  EXPECT_EQ(u32_at(17), crc32c_mask(crc32c_table(data.data(), data.size())));
}

// Three events written by hand: the version, a scalar, a histogram.
std::string sample_file(std::vector<Event>& events) {
  events = {{.wall_time = 100.5, .step = 0, .file_version = "brain.Event:2", .values = {}},
            {.wall_time = 101.25, .step = 10, .file_version = {}, .values = {{.tag = "train/loss", .simple_value = 0.125f, .histo = {}}}},
            {.wall_time = 102, .step = 20, .file_version = {},
             .values = {{.tag = "grad", .simple_value = {},
                         .histo = Histogram{.min = -1, .max = 2, .num = 4, .sum = 1, .sum_squares = 6,
                                            .bucket_limit = {-1, 0, 2}, .bucket = {0, 1, 3}}}}}};
  std::string file;
  for (const Event& e : events) file += tfrecord_frame(encode_event(e));
  return file;
}

TEST(EventReader, RoundTripsAFile) {
  std::vector<Event> events;
  const std::string path = temp_file("roundtrip.tfevents");
  write_file(path, sample_file(events));
  const std::vector<Event> back = read_events(path);
  ASSERT_EQ(back.size(), 3u);
  EXPECT_EQ(back[0].file_version, "brain.Event:2");
  EXPECT_EQ(back[0].wall_time, 100.5);
  EXPECT_EQ(back[1].step, 10);
  ASSERT_EQ(back[1].values.size(), 1u);
  EXPECT_EQ(back[1].values[0].tag, "train/loss");
  EXPECT_EQ(back[1].values[0].simple_value, 0.125f);
  ASSERT_TRUE(back[2].values[0].histo.has_value());
  EXPECT_EQ(back[2].values[0].histo->bucket, (std::vector<double>{0, 1, 3}));
  EXPECT_EQ(back[2].values[0].histo->min, -1);
}

TEST(EventReader, DetectsEveryFlippedByte) {
  std::vector<Event> events;
  const std::string good = sample_file(events);
  const std::string path = temp_file("flipped.tfevents");
  for (size_t pos = 0; pos < good.size(); ++pos) {
    std::string bad = good;
    bad[pos] = static_cast<char>(bad[pos] ^ 0x10);
    write_file(path, bad);
    ASSERT_TRUE(test::throws_error([&] { read_events(path); }, {path, "record at offset"})) << "byte " << pos;
  }
}

TEST(EventReader, NamesTheRecordOffsetOfCorruptData) {
  std::vector<Event> events;
  std::string bad = sample_file(events);
  const size_t second = tfrecord_frame(encode_event(events[0])).size();
  bad[second + 14] = static_cast<char>(bad[second + 14] ^ 1);  // inside the second record's data
  const std::string path = temp_file("corrupt.tfevents");
  write_file(path, bad);
  EXPECT_TRUE(test::throws_error([&] { read_events(path); },
                                 {path, "record at offset " + std::to_string(second), "corrupted data"}));
  bad = sample_file(events);
  bad[second + 1] = static_cast<char>(bad[second + 1] ^ 1);  // the second record's length
  write_file(path, bad);
  EXPECT_TRUE(test::throws_error([&] { read_events(path); }, {"offset " + std::to_string(second), "corrupted length"}));
}

TEST(EventReader, DetectsEveryTruncation) {
  std::vector<Event> events;
  const std::string good = sample_file(events);
  const std::string path = temp_file("truncated.tfevents");
  for (size_t keep = 1; keep < good.size(); ++keep) {
    write_file(path, good.substr(0, keep));
    size_t boundary = 0;  // a cut exactly between records leaves a shorter but valid file
    bool at_boundary = false;
    for (const Event& e : events) {
      boundary += tfrecord_frame(encode_event(e)).size();
      at_boundary |= boundary == keep;
    }
    if (at_boundary) {
      ASSERT_NO_THROW(read_events(path)) << keep;
    } else {
      ASSERT_TRUE(test::throws_error([&] { read_events(path); }, {path, "truncated"})) << "kept " << keep << " bytes";
    }
  }
  EXPECT_TRUE(test::throws_error([&] { read_events(path + ".missing"); }, {path + ".missing", "cannot open"}));
}

TEST(EventReader, ReadsAnEmptyFileAsNoEvents) {
  const std::string path = temp_file("empty.tfevents");
  write_file(path, "");
  EXPECT_TRUE(read_events(path).empty());
}

TEST(EventReader, FindsEventFilesRecursively) {
  const fs::path dir = fs::path(temp_file("find")).concat("_dir");
  fs::create_directories(dir / "sub");
  write_file((dir / "events.out.tfevents.1.h.1.0").string(), "");
  write_file((dir / "sub" / "events.out.tfevents.2.h.1.1").string(), "");
  write_file((dir / "notes.txt").string(), "");
  const std::vector<std::string> files = find_event_files(dir.string());
  ASSERT_EQ(files.size(), 2u);
  EXPECT_NE(files[1].find("sub"), std::string::npos);
  EXPECT_TRUE(test::throws_error([&] { find_event_files((dir / "nope").string()); }, {"nope"}));
}

}  // namespace
}  // namespace ampgrad::utils
