// ProgressLine: the exact line, the ETA and value formats, rate limiting into a log (non-terminal),
// and in-place rewriting with '\r' on a terminal; a fake clock makes every number predictable.
#include <sstream>
#include <string>
#include <vector>

#include "tests/test_util.h"
#include "utils/progress.h"

namespace ampgrad::utils {
namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(Progress, FormatsDurations) {
  EXPECT_EQ(format_duration(0), "0s");
  EXPECT_EQ(format_duration(45.4), "45s");
  EXPECT_EQ(format_duration(59.6), "1m00s");
  EXPECT_EQ(format_duration(72), "1m12s");
  EXPECT_EQ(format_duration(3599), "59m59s");
  EXPECT_EQ(format_duration(3600), "1h00m");
  EXPECT_EQ(format_duration(7380), "2h03m");
  EXPECT_EQ(format_duration(7199), "2h00m");  // 1h59m59s rounds to the minute
  EXPECT_EQ(format_duration(86400 + 4 * 3600), "1d04h");
  EXPECT_EQ(format_duration(-1), "?");
  EXPECT_EQ(format_duration(INFINITY), "?");
  EXPECT_EQ(format_duration(NAN), "?");
}

TEST(Progress, FormatsValues) {
  EXPECT_EQ(format_value(65536), "65536");
  EXPECT_EQ(format_value(1048576), "1048576");
  EXPECT_EQ(format_value(1.2345), "1.2345");
  EXPECT_EQ(format_value(1.23456), "1.2346");
  EXPECT_EQ(format_value(0.000123456), "0.00012346");
  EXPECT_EQ(format_value(-3), "-3");
  EXPECT_EQ(format_value(1e20), "1e+20");
  EXPECT_EQ(format_value(NAN), "nan");
  EXPECT_EQ(format_value(INFINITY), "inf");
}

TEST(Progress, FormatsTheLine) {
  double now = 100;
  std::ostringstream out;
  ProgressLine progress(1000, out, {.mode = ProgressMode::kLines, .clock = [&] { return now; }});
  EXPECT_EQ(progress.format(0, {}, 100), "step 0/1000");  // no time has passed: no rate, no ETA
  // 120 steps in 10 s: 12 steps/s, 880 to go: 73.3 s.
  EXPECT_EQ(progress.format(120, {{"loss", 1.2345}, {"scale", 65536}}, 110),
            "step 120/1000  loss 1.2345  scale 65536  12 steps/s  ETA 1m13s");
  EXPECT_EQ(progress.format(1000, {}, 108), "step 1000/1000  125 steps/s  ETA 0s");
  EXPECT_EQ(progress.format(3, {}, 140), "step 3/1000  0.075 steps/s  ETA 3h42m");
  ProgressLine unknown(0, out, {.mode = ProgressMode::kLines, .clock = [&] { return now; }});
  EXPECT_EQ(unknown.format(50, {{"loss", 0.5}}, 110), "step 50  loss 0.5  5 steps/s");
  ProgressLine resumed(1000, out, {.mode = ProgressMode::kLines, .start_step = 500, .clock = [&] { return now; }});
  EXPECT_EQ(resumed.format(600, {}, 110), "step 600/1000  10 steps/s  ETA 40s");
  EXPECT_EQ(out.str(), "");  // format() prints nothing
}

TEST(Progress, PlainLinesAreRateLimitedBySeconds) {
  double now = 0;
  std::ostringstream out;
  ProgressLine progress(100, out, {.mode = ProgressMode::kLines, .every_seconds = 10, .clock = [&] { return now; }});
  EXPECT_FALSE(progress.is_terminal());
  for (int step = 1; step <= 100; ++step) {
    now += 0.5;  // 2 steps/s: a line every 20 steps
    progress.update(step, {{"loss", 1.0 / step}});
  }
  const std::vector<std::string> lines = lines_of(out.str());
  ASSERT_EQ(lines.size(), 6u) << out.str();  // the first step, every 10 s, and the last step
  EXPECT_EQ(lines[0], "step 1/100  loss 1  2 steps/s  ETA 50s");
  EXPECT_EQ(lines[1], "step 21/100  loss 0.047619  2 steps/s  ETA 40s");
  EXPECT_EQ(lines[5], "step 100/100  loss 0.01  2 steps/s  ETA 0s");
  EXPECT_EQ(out.str().find('\r'), std::string::npos);
}

TEST(Progress, PlainLinesAreRateLimitedBySteps) {
  double now = 0;
  std::ostringstream out;
  ProgressLine progress(250, out, {.mode = ProgressMode::kLines, .every_steps = 100, .every_seconds = 0,
                                   .clock = [&] { return now; }});
  for (int step = 1; step <= 250; ++step) {
    now += 0.01;
    progress.update(step);
  }
  const std::vector<std::string> lines = lines_of(out.str());
  ASSERT_EQ(lines.size(), 4u) << out.str();
  EXPECT_EQ(lines[0].substr(0, 11), "step 1/250 ");
  EXPECT_EQ(lines[1].substr(0, 13), "step 101/250 ");
  EXPECT_EQ(lines[2].substr(0, 13), "step 201/250 ");
  EXPECT_EQ(lines[3].substr(0, 13), "step 250/250 ");
}

// keep() shows a step whatever the rate limit and keeps its line, on a terminal too.
TEST(Progress, KeptStepsAlwaysShowAndStay) {
  double now = 0;
  std::ostringstream lines_out, terminal_out;
  ProgressLine lines(250, lines_out, {.mode = ProgressMode::kLines, .every_steps = 100, .every_seconds = 0,
                                      .clock = [&] { return now; }});
  ProgressLine terminal(250, terminal_out, {.mode = ProgressMode::kTerminal, .redraw_seconds = 100,
                                            .clock = [&] { return now; }});
  for (int step = 1; step <= 250; ++step) {
    now += 0.01;
    for (ProgressLine* p : {&lines, &terminal}) {
      if (step % 50 == 0) p->keep(step, {{"val", 2.5}});
      else p->update(step);
    }
  }
  const std::vector<std::string> got = lines_of(lines_out.str());
  // Step 1 (the first), then the kept ones; a kept line restarts the rate limit, so 101 is not due.
  ASSERT_EQ(got.size(), 6u) << lines_out.str();
  EXPECT_EQ(got[0].substr(0, 12), "step 1/250  ");
  for (size_t i = 1; i < got.size(); ++i) {
    EXPECT_EQ(got[i].substr(0, got[i].find("  val 2.5  ") + 11), "step " + std::to_string(50 * i) + "/250  val 2.5  ");
  }
  const std::vector<std::string> drawn = lines_of(terminal_out.str());
  ASSERT_EQ(drawn.size(), 5u) << terminal_out.str();  // step 1 is redrawn over by step 50
  EXPECT_NE(drawn[0].find("\rstep 50/250  val 2.5"), std::string::npos);
  EXPECT_NE(drawn[4].find("\rstep 250/250  val 2.5"), std::string::npos);
}

TEST(Progress, TerminalRewritesOneLine) {
  double now = 0;
  std::ostringstream out;
  {
    ProgressLine progress(3, out, {.mode = ProgressMode::kTerminal, .redraw_seconds = 0, .clock = [&] { return now; }});
    EXPECT_TRUE(progress.is_terminal());
    now = 1;
    progress.update(1, {{"loss", 123.25}});
    EXPECT_EQ(out.str(), "\rstep 1/3  loss 123.25  1 steps/s  ETA 2s");
    now = 2;
    progress.update(2, {{"loss", 1}});  // shorter: blanks the rest of the previous line
    EXPECT_EQ(out.str().substr(out.str().rfind('\r')), "\rstep 2/3  loss 1  1 steps/s  ETA 1s     ");  // 5 = len("123.25") - len("1")
    now = 3;
    progress.update(3, {{"loss", 1}});  // the last step ends the line
    EXPECT_EQ(out.str().back(), '\n');
  }
  EXPECT_EQ(lines_of(out.str()).size(), 1u);  // the destructor added no second newline
}

TEST(Progress, TerminalLineEndsOnFinishOrDestruction) {
  std::ostringstream out;
  {
    double now = 0;
    ProgressLine progress(100, out, {.mode = ProgressMode::kTerminal, .clock = [&] { return now; }});
    progress.update(5);
    EXPECT_EQ(out.str().find('\n'), std::string::npos);
  }
  EXPECT_EQ(out.str().back(), '\n');
}

TEST(Progress, AutoModeOnAStringStreamPrintsLines) {
  std::ostringstream out;
  ProgressLine progress(10, out);
  EXPECT_FALSE(progress.is_terminal());
}

TEST(Progress, RejectsBadOptions) {
  std::ostringstream out;
  EXPECT_TRUE(test::throws_error([&] { ProgressLine p(10, out, {.every_steps = 0}); }, {"ProgressLine", "every_steps"}));
  EXPECT_TRUE(test::throws_error([&] { ProgressLine p(10, out, {.every_seconds = -1}); }, {"every_seconds"}));
}

}  // namespace
}  // namespace ampgrad::utils
