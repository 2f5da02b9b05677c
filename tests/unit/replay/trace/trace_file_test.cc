#include "bench/replay/trace/trace_file.h"

#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace kvtier::replay {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::IsError;
using ::testing::ElementsAre;
using ::testing::Pair;

std::string Write(const kvtier::testing::TempDir& dir, const std::string& name,
                  const std::string& content) {
  const std::string path = dir.File(name);
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

// (line number, line) of every line visited.
absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> Lines(const std::string& path,
                                                                   uint64_t max_line_bytes) {
  std::vector<std::pair<int64_t, std::string>> lines;
  const absl::Status status = ForEachTraceLine(
      path,
      [&](int64_t number, absl::string_view line) {
        lines.emplace_back(number, std::string(line));
        return absl::OkStatus();
      },
      max_line_bytes);
  if (!status.ok()) return status;
  return lines;
}

TEST(ForEachTraceLineTest, VisitsEveryLineWithItsNumber) {
  kvtier::testing::TempDir dir;
  // A '\r' is the caller's to drop; the last line has no '\n'.
  EXPECT_THAT(*Lines(Write(dir, "a", "one\r\n\nthree\nfour"), 100),
              ElementsAre(Pair(1, "one\r"), Pair(2, ""), Pair(3, "three"), Pair(4, "four")));
  EXPECT_THAT(*Lines(Write(dir, "b", "one\n"), 100), ElementsAre(Pair(1, "one")));
  EXPECT_THAT(*Lines(Write(dir, "c", ""), 100), ElementsAre());
}

TEST(ForEachTraceLineTest, ALineLongerThanTheLimitIsAnError) {
  kvtier::testing::TempDir dir;
  // Exactly the limit passes (the '\n' does not count), one byte more does not, with or without
  // a '\n' after it.
  EXPECT_THAT(*Lines(Write(dir, "ok", "12345678\n1234\n"), 8),
              ElementsAre(Pair(1, "12345678"), Pair(2, "1234")));
  const std::string long_line = Write(dir, "long", "1234\n123456789\nx\n");
  EXPECT_THAT(Lines(long_line, 8),
              IsError(StatusCode::kInvalidArgument,
                      absl::StrCat(long_line, ":2: line exceeds the limit of 8 bytes")));
  const std::string last = Write(dir, "last", "1234\n123456789");
  EXPECT_THAT(Lines(last, 8), IsError(StatusCode::kInvalidArgument, absl::StrCat(last, ":2: ")));
  EXPECT_THAT(Lines(last, uint64_t{64} << 20), ::kvtier::testing::IsOk());
}

TEST(ForEachTraceLineTest, LinesSpanningReadChunksArriveWhole) {
  kvtier::testing::TempDir dir;
  // The reader reads 1 MiB at a time: these lines cross chunk boundaries.
  const std::string a(3 << 20, 'a');
  const std::string b((1 << 20) - 1, 'b');
  const std::string path = Write(dir, "big", absl::StrCat("x\n", a, "\n", b, "\ny"));
  EXPECT_THAT(*Lines(path, 4 << 20),
              ElementsAre(Pair(1, "x"), Pair(2, a), Pair(3, b), Pair(4, "y")));
  EXPECT_THAT(Lines(path, 2 << 20),
              IsError(StatusCode::kInvalidArgument,
                      absl::StrCat(path, ":2: line exceeds the limit of 2 MiB (2097152 bytes)")));
}

TEST(ForEachTraceLineTest, StopsAtTheFirstErrorOfTheVisitor) {
  kvtier::testing::TempDir dir;
  const std::string path = Write(dir, "a", "1\n2\n3\n");
  int visited = 0;
  const absl::Status status = ForEachTraceLine(path, [&](int64_t number, absl::string_view) {
    ++visited;
    return number == 2 ? absl::DataLossError("stop") : absl::OkStatus();
  });
  EXPECT_THAT(status, IsError(StatusCode::kDataLoss, "stop"));
  EXPECT_EQ(visited, 2);
}

TEST(ForEachTraceLineTest, MissingFileAndDirectory) {
  kvtier::testing::TempDir dir;
  EXPECT_THAT(Lines(dir.File("absent"), 100), IsError(StatusCode::kNotFound, dir.File("absent")));
  EXPECT_THAT(Lines(dir.path(), 100), IsError(StatusCode::kInvalidArgument, "not a regular file"));
}

TEST(ReadTraceFileTest, ReadsUpToTheLimit) {
  kvtier::testing::TempDir dir;
  const std::string path = Write(dir, "a", "0123456789");
  const absl::StatusOr<std::string> whole = ReadTraceFile(path, 10);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(*whole, "0123456789");
  EXPECT_THAT(ReadTraceFile(path, 9),
              IsError(StatusCode::kInvalidArgument,
                      absl::StrCat(path, ": 10 bytes, over the limit of 9 bytes")));
  EXPECT_THAT(ReadTraceFile(dir.File("absent")), IsError(StatusCode::kNotFound, "no such file"));
  EXPECT_THAT(ReadTraceFile(dir.path()), IsError(StatusCode::kInvalidArgument, "not a regular"));
}

TEST(TraceNameOfTest, ParentAndFile) {
  EXPECT_EQ(TraceNameOf("/a/traces/mooncake/t.jsonl"), "mooncake/t.jsonl");
  EXPECT_EQ(TraceNameOf("/a/traces/claude/"), "traces/claude");
  EXPECT_EQ(TraceNameOf("t.jsonl"), "t.jsonl");
}

}  // namespace
}  // namespace kvtier::replay
