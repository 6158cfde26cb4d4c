// SummaryWriter: file naming and folders as PyTorch does them, values read back through the C++
// reader, the write queue, add_scalars' subfolders, histograms from spans and tensors, errors.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/test_util.h"
#include "utils/event.h"
#include "utils/event_reader.h"
#include "utils/histogram.h"
#include "utils/summary_writer.h"

namespace ampgrad::utils {
namespace {

namespace fs = std::filesystem;

class SummaryWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) / ("summary_" + std::to_string(::getpid())) / info->name();
    fs::remove_all(dir_);
  }
  std::string host() const {
    char name[256] = {};
    ::gethostname(name, sizeof(name) - 1);
    return name;
  }
  fs::path dir_;
};

TEST_F(SummaryWriterTest, NamesTheFileLikePyTorch) {
  SummaryWriter writer((dir_ / "run").string(), {.filename_suffix = ".amp"});
  const std::string name = fs::path(writer.file_path()).filename().string();
  const std::regex pattern("events\\.out\\.tfevents\\.\\d{10}\\." + host() + "\\." + std::to_string(::getpid()) +
                           "\\.\\d+\\.amp");
  EXPECT_TRUE(std::regex_match(name, pattern)) << name;
  EXPECT_EQ(fs::path(writer.file_path()).parent_path(), dir_ / "run");
  EXPECT_EQ(writer.get_logdir(), (dir_ / "run").string());
}

TEST_F(SummaryWriterTest, DefaultFolderIsRunsDateHost) {
  const std::string dir = default_log_dir("_lr0.1");
  const std::regex pattern("runs/(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)\\d{2}_\\d{2}-\\d{2}-\\d{2}_" + host() +
                           "_lr0\\.1");
  EXPECT_TRUE(std::regex_match(dir, pattern)) << dir;
}

TEST_F(SummaryWriterTest, CreatesParentsAndWritesTheVersionFirst) {
  const fs::path nested = dir_ / "a" / "b" / "c";
  SummaryWriter writer(nested.string());
  EXPECT_TRUE(fs::is_directory(nested));
  const std::vector<Event> events = read_events(writer.file_path());  // written at once, before any add
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_NEAR(events[0].wall_time, unix_time_now(), 60);
}

TEST_F(SummaryWriterTest, ScalarsRoundTrip) {
  std::string path;
  {
    SummaryWriter writer(dir_.string());
    path = writer.file_path();
    for (int step = 0; step < 25; ++step) writer.add_scalar("train/loss", 1.0 / (step + 1), step);
    writer.add_scalar("scale", 65536, 24, /*wall_time=*/1700000000.5);
  }  // the destructor flushes and closes
  const std::vector<Event> events = read_events(path);
  ASSERT_EQ(events.size(), 27u);
  for (int step = 0; step < 25; ++step) {
    const Event& e = events[step + 1];
    EXPECT_EQ(e.step, step);
    ASSERT_EQ(e.values.size(), 1u);
    EXPECT_EQ(e.values[0].tag, "train/loss");
    EXPECT_EQ(e.values[0].simple_value, static_cast<float>(1.0 / (step + 1)));
    EXPECT_FALSE(e.values[0].histo.has_value());
  }
  EXPECT_EQ(events.back().wall_time, 1700000000.5);
  EXPECT_EQ(events.back().values[0].simple_value, 65536.0f);
  EXPECT_GE(events[1].wall_time, events[0].wall_time);
}

TEST_F(SummaryWriterTest, QueuesUntilMaxQueueOrFlush) {
  SummaryWriter writer(dir_.string(), {.max_queue = 3});
  writer.add_scalar("x", 1, 1);
  writer.add_scalar("x", 2, 2);
  EXPECT_EQ(read_events(writer.file_path()).size(), 1u);  // two events wait in memory
  writer.add_scalar("x", 3, 3);
  EXPECT_EQ(read_events(writer.file_path()).size(), 4u);  // the third filled the queue
  writer.add_scalar("x", 4, 4);
  writer.flush();
  EXPECT_EQ(read_events(writer.file_path()).size(), 5u);
}

TEST_F(SummaryWriterTest, FlushSecsZeroWritesEveryEvent) {
  SummaryWriter writer(dir_.string(), {.flush_secs = 0});
  writer.add_scalar("x", 1, 1);
  EXPECT_EQ(read_events(writer.file_path()).size(), 2u);
}

// A scalar logged once reaches the file within flush_secs, with no further call: the background
// flush (PyTorch's writer thread). The bound is generous for a loaded machine; the flush is not.
TEST_F(SummaryWriterTest, FlushSecsWritesPendingEventsWithoutAnotherCall) {
  SummaryWriter writer(dir_.string(), {.max_queue = 1000, .flush_secs = 0.05});
  writer.add_scalar("x", 1, 1);
  // Counts the events on disk; a record the thread is still writing reads as not there yet.
  const auto on_disk = [&] {
    try {
      return read_events(writer.file_path()).size();
    } catch (const Error&) {
      return size_t{0};
    }
  };
  const auto start = std::chrono::steady_clock::now();
  while (on_disk() < 2u && std::chrono::steady_clock::now() - start < std::chrono::seconds(60)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const std::vector<Event> events = read_events(writer.file_path());
  ASSERT_EQ(events.size(), 2u);
  ASSERT_EQ(events[1].values.size(), 1u);
  EXPECT_EQ(events[1].values[0].simple_value.value_or(-1.0f), 1.0f);
  writer.add_scalar("x", 2, 2);
  writer.close();  // stops the thread at once and writes the rest
  EXPECT_EQ(read_events(writer.file_path()).size(), 3u);
}

// Without the period passing, the queue holds (a long flush_secs never fires during the test).
TEST_F(SummaryWriterTest, LongFlushSecsKeepsEventsQueuedAndDestructionWritesThem) {
  std::string path;
  auto writer = std::make_unique<SummaryWriter>(dir_.string(), SummaryWriterOptions{.max_queue = 1000, .flush_secs = 3600});
  path = writer->file_path();
  writer->add_scalar("x", 1, 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(read_events(path).size(), 1u);
  const auto start = std::chrono::steady_clock::now();
  writer.reset();  // the destructor ends the hour-long wait at once
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
  EXPECT_EQ(read_events(path).size(), 2u);
}

TEST_F(SummaryWriterTest, TwoWritersInOneFolderGetTwoFiles) {
  SummaryWriter a(dir_.string()), b(dir_.string());
  EXPECT_NE(a.file_path(), b.file_path());
  a.add_scalar("a", 1, 0);
  b.add_scalar("b", 2, 0);
  a.close();
  b.close();
  EXPECT_EQ(find_event_files(dir_.string()).size(), 2u);
  EXPECT_EQ(read_events(a.file_path())[1].values[0].tag, "a");
}

TEST_F(SummaryWriterTest, AddScalarsWritesOneSubfolderPerKey) {
  {
    SummaryWriter writer(dir_.string());
    writer.add_scalars("loss/mode", {{"fp16", 0.5}, {"fp32", 0.25}}, 7);
    writer.add_scalars("loss/mode", {{"fp16", 0.4}, {"fp32", 0.2}}, 8);
  }
  const std::vector<std::string> fp16 = find_event_files((dir_ / "loss_mode_fp16").string());
  const std::vector<std::string> fp32 = find_event_files((dir_ / "loss_mode_fp32").string());
  ASSERT_EQ(fp16.size(), 1u);
  ASSERT_EQ(fp32.size(), 1u);
  const std::vector<Event> events = read_events(fp32[0]);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_EQ(events[1].values[0].tag, "loss/mode");  // the main tag, so TensorBoard draws them on one chart
  EXPECT_EQ(events[1].values[0].simple_value, 0.25f);
  EXPECT_EQ(events[2].step, 8);
  EXPECT_EQ(read_events(fp16[0])[2].values[0].simple_value, 0.4f);
}

TEST_F(SummaryWriterTest, HistogramsRoundTripFromSpansAndTensors) {
  const std::vector<float> values = {-1.5f, 0.0f, 2e-6f, 3.0f, 3.0f};
  const Tensor half = Tensor::from_vector(values, {5}).to(DType::kFloat16);
  std::string path;
  {
    SummaryWriter writer(dir_.string());
    path = writer.file_path();
    writer.add_histogram("w", values, 3);
    writer.add_histogram("w16", half, 4, HistogramBins::fixed(4));
  }
  const std::vector<Event> events = read_events(path);
  ASSERT_EQ(events.size(), 3u);
  const Histogram expected = make_histogram(values);
  ASSERT_TRUE(events[1].values[0].histo.has_value());
  const Histogram& h = *events[1].values[0].histo;
  EXPECT_EQ(h.bucket_limit, expected.bucket_limit);
  EXPECT_EQ(h.bucket, expected.bucket);
  EXPECT_EQ(h.num, 5);
  EXPECT_EQ(h.max, 3.0);
  EXPECT_EQ(events[1].step, 3);
  const Histogram& h16 = *events[2].values[0].histo;
  EXPECT_EQ(h16.bucket, make_histogram(half.to_vector(), HistogramBins::fixed(4)).bucket);
  EXPECT_EQ(h16.min, -1.5);
  EXPECT_EQ(events[2].values[0].tag, "w16");
  EXPECT_TRUE(test::throws_error([&] { SummaryWriter((dir_ / "u").string()).add_histogram("u", Tensor(), 0); },
                                 {"add_histogram", "undefined"}));
}

// Events from several threads while the background flush runs, then two threads closing at
// once: every event is written once, and nothing races (the test also runs under ThreadSanitizer).
TEST_F(SummaryWriterTest, EventFileWriterTakesCallsFromManyThreads) {
  fs::create_directories(dir_);
  const std::string path = (dir_ / "events.many").string();
  EventFileWriter writer(path, /*max_queue=*/7, /*flush_secs=*/0.001);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&writer, t] {
      for (int i = 0; i < 50; ++i) {
        writer.add_event({.wall_time = 1.0, .step = t * 100 + i, .file_version = {}, .values = {}});
        if (i % 10 == 0) writer.flush();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::thread first([&] { writer.close(); }), second([&] { writer.close(); });
  first.join();
  second.join();
  EXPECT_EQ(read_events(path).size(), 201u);  // the version event and 4 x 50
}

TEST_F(SummaryWriterTest, CloseIsFinal) {
  SummaryWriter writer(dir_.string());
  writer.add_scalar("x", 1, 0);
  writer.close();
  writer.close();  // a second close does nothing
  writer.flush();
  EXPECT_EQ(read_events(writer.file_path()).size(), 2u);
  EXPECT_TRUE(test::throws_error([&] { writer.add_scalar("x", 2, 1); }, {"after close"}));
  EXPECT_TRUE(test::throws_error([&] { writer.add_scalars("x", {{"a", 1}}, 1); }, {"after close"}));
}

TEST_F(SummaryWriterTest, UnusableFolderIsAnErrorNamingIt) {
  fs::create_directories(dir_);
  const fs::path file = dir_ / "plain_file";
  std::ofstream(file) << "x";
  const std::string bad = (file / "run").string();  // a folder inside a regular file cannot exist
  EXPECT_TRUE(test::throws_error([&] { SummaryWriter writer(bad); }, {"log folder", bad}));
  EXPECT_TRUE(test::throws_error([&] { EventFileWriter writer(bad + "/events"); }, {"cannot create the event file", bad}));
}

TEST_F(SummaryWriterTest, FullDiskIsAnErrorNamingTheFile) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full on this system to stand for a full disk";
  // The version event is written at construction, so a full disk shows at once.
  auto open_descriptors = [] { return std::distance(fs::directory_iterator("/proc/self/fd"), fs::directory_iterator()); };
  const auto before = open_descriptors();
  EXPECT_TRUE(test::throws_error([] { EventFileWriter writer("/dev/full"); }, {"writing /dev/full failed", "space"}));
  EXPECT_EQ(open_descriptors(), before);  // the failed constructor closed its file
}

TEST_F(SummaryWriterTest, RejectsBadOptions) {
  EXPECT_TRUE(test::throws_error([&] { SummaryWriter writer(dir_.string(), {.max_queue = 0}); }, {"max_queue"}));
  EXPECT_TRUE(test::throws_error([&] { SummaryWriter writer(dir_.string(), {.flush_secs = -1}); }, {"flush_secs"}));
}

}  // namespace
}  // namespace ampgrad::utils
