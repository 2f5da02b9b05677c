#include "kvtier/directory_transport.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtier/in_process_transport.h"
#include "tests/testing/random_bytes.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace kvtier {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::IsError;

const absl::Time kNoDeadline = absl::InfiniteFuture();

TEST(DirectoryTransportTest, PutGetExistsDelete) {
  testing::TempDir dir;
  auto t = DirectoryTransport::Create({.root = dir.File("store"), .fsync = FsyncPolicy::kFile});
  ASSERT_TRUE(t.ok()) << t.status();
  const std::vector<std::byte> v = testing::RandomBytes(5000, 1);
  const std::vector<TransportPut> puts = {{"kvtier:abc:def", v}};
  KVTIER_ASSERT_OK((*t)->Put(puts, kNoDeadline)[0].Wait());
  std::vector<std::byte> back;
  const std::vector<TransportGet> gets = {{"kvtier:abc:def", &back}};
  KVTIER_ASSERT_OK((*t)->Get(gets, kNoDeadline)[0].Wait());
  EXPECT_TRUE(back == v);
  const std::vector<std::string> keys = {"kvtier:abc:def"};
  KVTIER_EXPECT_OK((*t)->Exists(keys, kNoDeadline)[0].Wait());
  KVTIER_EXPECT_OK((*t)->Delete(keys, kNoDeadline)[0].Wait());
  EXPECT_THAT((*t)->Exists(keys, kNoDeadline)[0].Wait(), IsError(StatusCode::kNotFound, "abc"));
  EXPECT_THAT((*t)->Get(gets, kNoDeadline)[0].Wait(), IsError(StatusCode::kNotFound, ""));
  EXPECT_THAT((*t)->Delete(keys, kNoDeadline)[0].Wait(), IsError(StatusCode::kNotFound, ""));
}

TEST(DirectoryTransportTest, KeysCannotEscapeTheRootAndDeadlinesHold) {
  testing::TempDir dir;
  auto t = DirectoryTransport::Create({.root = dir.path()});
  ASSERT_TRUE(t.ok());
  const std::vector<std::byte> v(10);
  for (const char* bad : {"../etc/passwd", "a/b", "", ".tmp.x", ".."}) {
    const std::vector<TransportPut> puts = {{bad, v}};
    EXPECT_THAT((*t)->Put(puts, kNoDeadline)[0].Wait(), IsError(StatusCode::kInvalidArgument, ""))
        << bad;
  }
  const std::vector<TransportPut> puts = {{"k", v}};
  EXPECT_THAT((*t)->Put(puts, absl::Now() - absl::Seconds(1))[0].Wait(),
              IsError(StatusCode::kDeadlineExceeded, "deadline"));
  const std::vector<TransportGet> null_out = {{"k", nullptr}};
  EXPECT_THAT((*t)->Get(null_out, kNoDeadline)[0].Wait(),
              IsError(StatusCode::kInvalidArgument, "an output or a receiver"));
  EXPECT_THAT(DirectoryTransport::Create({.root = ""}),
              IsError(StatusCode::kInvalidArgument, "root is empty"));
}

// From an earlier note's list: every call did its file I/O on the calling thread, which for a
// remote tier is the transfer engine's one dispatcher (or, for a delete, the cache under its
// lock), so a hung mount stalled every tier's transfers, past every deadline. Items now run on
// the transport's workers: a call returns at once, and its items complete by the deadline.
TEST(DirectoryTransportTest, ACallReturnsBeforeItsFileIoIsDone) {
  testing::TempDir dir;
  auto t = DirectoryTransport::Create({.root = dir.File("store"), .io_threads = 1});
  ASSERT_TRUE(t.ok()) << t.status();
  // 16 MiB: the write takes milliseconds, the return from Put (after the copy) microseconds.
  const std::vector<std::byte> v = testing::RandomBytes(16 << 20, 2);
  const std::vector<Completion> put = (*t)->Put({{.key = "big", .value = v}}, kNoDeadline);
  const absl::Time returned = absl::Now();
  if (put[0].done()) {  // only if this thread lost the processor for the write's whole time
    EXPECT_GT(absl::Now() - returned, absl::Milliseconds(5))
        << "Put wrote the value on the calling thread";
  }
  KVTIER_ASSERT_OK(put[0].Wait());
  std::vector<std::byte> back;
  KVTIER_ASSERT_OK((*t)->Get({{.key = "big", .value = &back}}, kNoDeadline)[0].Wait());
  EXPECT_TRUE(back == v);
}

// A Put whose deadline passes while its value is being written is answered kDeadlineExceeded
// then, and its caller may reuse the buffer at once: the value was copied, so what lands is the
// value of the call, never the caller's later bytes. (Writing 16 MiB takes this machine about
// 0.3 s; a much faster disk ends the write first, and the Put is OK.)
TEST(DirectoryTransportTest, APutAnsweredAtItsDeadlineNeverWritesTheCallersLaterBytes) {
  testing::TempDir dir;
  auto t = DirectoryTransport::Create({.root = dir.File("store"), .io_threads = 1});
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<std::byte> v = testing::RandomBytes(16 << 20, 3);
  const std::vector<std::byte> original = v;
  const absl::Time deadline = absl::Now() + absl::Milliseconds(30);
  const absl::Status s = (*t)->Put({{.key = "late", .value = v}}, deadline)[0].Wait();
  const absl::Time answered = absl::Now();
  if (!s.ok()) {
    EXPECT_THAT(s, IsError(StatusCode::kDeadlineExceeded, "deadline"));
    EXPECT_LT(answered - deadline, absl::Milliseconds(200)) << "answered long after its deadline";
  }
  std::fill(v.begin(), v.end(), std::byte{0xAA});
  // One value thread: this Get runs after the Put's write has ended (or was never started,
  // when the deadline answered the Put before a worker took it).
  std::vector<std::byte> back;
  const absl::Status got = (*t)->Get({{.key = "late", .value = &back}}, kNoDeadline)[0].Wait();
  if (got.ok()) {
    EXPECT_TRUE(back == original) << "the caller's later bytes were written";
  } else {
    EXPECT_THAT(got, IsError(StatusCode::kNotFound, ""));
    EXPECT_FALSE(s.ok()) << "an OK Put left no value";
  }
}

// Two processes write the same key at once, over and over; every read sees one of the two values
// whole, never a mix or a truncated one.
TEST(DirectoryTransportTest, TwoProcessesWritingOneKeyNeverTearAValue) {
  testing::TempDir dir;
  const std::string root = dir.File("shared");
  const std::vector<std::byte> a = testing::RandomBytes(256 * 1024, 11);
  const std::vector<std::byte> b = testing::RandomBytes(200 * 1024, 22);  // other size, too
  std::vector<pid_t> writers;
  for (const std::vector<std::byte>* value : {&a, &b}) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      auto t = DirectoryTransport::Create({.root = root});
      if (!t.ok()) _exit(3);
      const std::vector<TransportPut> puts = {{"kvtier:race", *value}};
      for (int i = 0; i < 300; ++i) {
        if (!(*t)->Put(puts, absl::InfiniteFuture())[0].Wait().ok()) _exit(4);
      }
      _exit(0);
    }
    writers.push_back(pid);
  }
  auto reader = DirectoryTransport::Create({.root = root});
  ASSERT_TRUE(reader.ok());
  int seen_a = 0, seen_b = 0;
  std::vector<std::byte> got;
  const std::vector<TransportGet> gets = {{"kvtier:race", &got}};
  // 600 reads of a value; on a loaded machine the writers may start late, so reads before the
  // first rename do not count (a flake in CI when all 600 came before it).
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  for (int i = 0; i < 600 && absl::Now() < give_up;) {
    const absl::Status s = (*reader)->Get(gets, kNoDeadline)[0].Wait();
    if (absl::IsNotFound(s)) continue;  // before the first rename
    ++i;
    ASSERT_TRUE(s.ok()) << s;
    if (got == a) {
      ++seen_a;
    } else if (got == b) {
      ++seen_b;
    } else {
      FAIL() << "read " << i << " saw a torn value of " << got.size() << " bytes";
    }
  }
  for (pid_t pid : writers) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "writer failed";
  }
  EXPECT_EQ(seen_a + seen_b, 600);
  // Afterwards the key holds one whole value, and no temporary file is left behind.
  KVTIER_ASSERT_OK((*reader)->Get(gets, kNoDeadline)[0].Wait());
  EXPECT_TRUE(got == a || got == b);
  int files = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(root)) ++files;
  EXPECT_EQ(files, 1);
}

// Found in review: a file planted under a key's name could crash (huge size), hang (FIFO) or
// reach a device (symlink) in the reader. Only a regular file within the limit is a value.
TEST(DirectoryTransportTest, PlantedFilesAreRefusedNotFollowed) {
  testing::TempDir dir;
  auto t = DirectoryTransport::Create({.root = dir.path()});
  ASSERT_TRUE(t.ok());
  ASSERT_EQ(mkfifo((dir.path() + "/fifo").c_str(), 0600), 0);
  ASSERT_EQ(symlink("/dev/zero", (dir.path() + "/link").c_str()), 0);
  {
    const std::vector<std::byte> big(4096);
    const std::vector<TransportPut> puts = {{"big", big}};
    KVTIER_ASSERT_OK((*t)->Put(puts, kNoDeadline)[0].Wait());
  }
  std::vector<std::byte> out;
  const std::vector<TransportGet> fifo = {{"fifo", &out}};
  EXPECT_THAT((*t)->Get(fifo, kNoDeadline)[0].Wait(),
              IsError(StatusCode::kDataLoss, "not a regular file"));
  // A link is a damaged value (kDataLoss: a miss the remote tier counts and rewrites), not a
  // store that is down (it read as kUnavailable, which opened the tier's circuit breaker).
  const std::vector<TransportGet> link = {{"link", &out}};
  EXPECT_THAT((*t)->Get(link, kNoDeadline)[0].Wait(),
              IsError(StatusCode::kDataLoss, "symbolic link"));
  const std::vector<TransportGet> limited = {{"big", &out, 1024}};
  EXPECT_THAT((*t)->Get(limited, kNoDeadline)[0].Wait(),
              IsError(StatusCode::kDataLoss, "at most 1024 bytes"));
  EXPECT_TRUE(out.empty()) << "an oversized value was read";
}

// Something other than a value at a key is not one: Exists does not find it, and a Put, if_absent
// or not, replaces the link itself (a write through it, or a skip as "stored already", left the
// key poisoned for good).
TEST(DirectoryTransportTest, APutReplacesALinkAtItsKeyWithoutFollowingIt) {
  testing::TempDir dir;
  auto t = DirectoryTransport::Create({.root = dir.File("store")});
  ASSERT_TRUE(t.ok());
  {
    std::ofstream target(dir.File("target"));
    target << "not KV";
  }
  ASSERT_EQ(symlink(dir.File("target").c_str(), (dir.File("store") + "/live").c_str()), 0);
  ASSERT_EQ(symlink("/nonexistent/kv", (dir.File("store") + "/dangling").c_str()), 0);
  const std::vector<std::string> keys = {"live", "dangling"};
  for (const Completion& c : (*t)->Exists(keys, kNoDeadline)) {
    EXPECT_THAT(c.Wait(), IsError(StatusCode::kNotFound, ""));
  }
  const std::vector<std::byte> value(16, std::byte{7});
  const std::vector<TransportPut> puts = {{.key = "live", .value = value, .if_absent = true},
                                          {.key = "dangling", .value = value}};
  KVTIER_ASSERT_OK(Completion::All((*t)->Put(puts, kNoDeadline)).Wait());
  for (const std::string& key : keys) {
    std::vector<std::byte> got;
    const std::vector<TransportGet> get = {{key, &got}};
    KVTIER_EXPECT_OK((*t)->Get(get, kNoDeadline)[0].Wait()) << key;
    EXPECT_TRUE(got == value) << key;
  }
  for (const Completion& c : (*t)->Exists(keys, kNoDeadline)) KVTIER_EXPECT_OK(c.Wait());
  // A directory at a key cannot be replaced: the write fails (it read as stored, if_absent).
  ASSERT_EQ(mkdir((dir.File("store") + "/dir").c_str(), 0700), 0);
  const std::vector<TransportPut> onto_dir = {{.key = "dir", .value = value, .if_absent = true}};
  EXPECT_THAT((*t)->Put(onto_dir, kNoDeadline)[0].Wait(),
              IsError(StatusCode::kDataLoss, "cannot be replaced"));
  std::ifstream target(dir.File("target"));
  std::string text;
  std::getline(target, text);
  EXPECT_EQ(text, "not KV");  // what the link pointed at is untouched
}

TEST(DirectoryTransportTest, KeysThatDifferOnlyInColonAndUnderscoreStayApart) {
  testing::TempDir dir;
  auto t = DirectoryTransport::Create({.root = dir.File("store")});
  ASSERT_TRUE(t.ok());
  const std::vector<std::byte> a(8, std::byte{1}), b(8, std::byte{2});
  const std::vector<TransportPut> puts = {{"kvtier:x", a}, {"kvtier_x", b}};
  KVTIER_ASSERT_OK(Completion::All((*t)->Put(puts, kNoDeadline)).Wait());
  std::vector<std::byte> got_a, got_b;
  const std::vector<TransportGet> gets = {{"kvtier:x", &got_a}, {"kvtier_x", &got_b}};
  KVTIER_ASSERT_OK(Completion::All((*t)->Get(gets, kNoDeadline)).Wait());
  EXPECT_TRUE(got_a == a);
  EXPECT_TRUE(got_b == b);
  // Private: KV reveals prompts.
  struct stat st {};
  ASSERT_EQ(stat((dir.File("store") + "/kvtier:x").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(stat(dir.File("store").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
}

// From an earlier note's list: a value larger than the bytes allowed to wait for a worker (then
// a fixed 1 GiB, which the frame of a block of kv_geometry's largest size passes) was refused at
// every call, with "the mount is not answering". Taken when nothing waits, it waits behind nothing.
TEST(DirectoryTransportTest, AValuePastTheQueueBoundIsTakenWhenNothingWaits) {
  testing::TempDir dir;
  EXPECT_THAT(DirectoryTransport::Create({.root = dir.File("bad"), .max_queued_bytes = 0}).status(),
              IsError(StatusCode::kInvalidArgument, "max_queued_bytes"));
  auto t = DirectoryTransport::Create(
      {.root = dir.File("store"), .io_threads = 1, .max_queued_bytes = 4096});
  ASSERT_TRUE(t.ok()) << t.status();
  const std::vector<std::byte> v = testing::RandomBytes(64 << 10, 4);
  KVTIER_ASSERT_OK((*t)->Put({{.key = "big", .value = v}}, kNoDeadline)[0].Wait());
  std::vector<std::byte> back;
  KVTIER_ASSERT_OK((*t)->Get({{.key = "big", .value = &back}}, kNoDeadline)[0].Wait());
  EXPECT_TRUE(back == v);
}

// max_bytes: the directory is swept, least recently used first, once the values pass the
// bound; a swept value is a miss (kNotFound); a value read recently survives a sweep.
TEST(DirectoryTransportTest, SizeBoundSweepsLeastRecentlyUsedValues) {
  testing::TempDir dir;
  EXPECT_THAT(DirectoryTransport::Create({.root = dir.File("bad"), .max_bytes = -1}).status(),
              IsError(StatusCode::kInvalidArgument, "max_bytes"));
  EXPECT_THAT(
      DirectoryTransport::Create({.root = dir.File("bad"), .sweep_to_fraction = 0}).status(),
      IsError(StatusCode::kInvalidArgument, "sweep_to_fraction"));
  EXPECT_THAT(DirectoryTransport::Create({.root = dir.File("bad"), .io_threads = 0}).status(),
              IsError(StatusCode::kInvalidArgument, "io_threads"));
  EXPECT_THAT(DirectoryTransport::Create({.root = dir.File("bad"), .io_threads = 65}).status(),
              IsError(StatusCode::kInvalidArgument, "io_threads"));
  constexpr int64_t kValue = 10000;
  auto t = DirectoryTransport::Create(
      {.root = dir.File("store"), .max_bytes = 10 * kValue, .sweep_to_fraction = 0.5});
  ASSERT_TRUE(t.ok()) << t.status();
  const std::vector<std::byte> v = testing::RandomBytes(kValue, 1);
  auto key = [](int i) { return absl::StrCat("kvtier:v:", i); };
  auto put = [&](int i) {
    KVTIER_ASSERT_OK((*t)->Put({{.key = key(i), .value = v}}, kNoDeadline)[0].Wait());
  };
  auto exists = [&](int i) { return (*t)->Exists({{key(i)}}, kNoDeadline)[0].Wait().ok(); };
  auto set_age = [&](int i, int seconds_ago) {  // file times have coarse granularity: set them
    const auto when =
        std::filesystem::file_time_type::clock::now() - std::chrono::seconds(seconds_ago);
    std::filesystem::last_write_time(dir.File("store") + "/" + key(i), when);
  };
  for (int i = 0; i < 10; ++i) {
    ASSERT_NO_FATAL_FAILURE(put(i));
    set_age(i, 100 - i);  // 0 is the oldest
  }
  EXPECT_EQ((*t)->swept_values(), 0);
  // Value 0 is read: it becomes the most recently used.
  std::vector<std::byte> back;
  KVTIER_ASSERT_OK((*t)->Get({{.key = key(0), .value = &back}}, kNoDeadline)[0].Wait());
  ASSERT_NO_FATAL_FAILURE(put(10));  // 11 values > 10: sweep down to 5
  // The sweep runs on the worker after the Put's answer.
  const auto await_swept = [](DirectoryTransport& d, int64_t n) {
    for (int i = 0; i < 500 && d.swept_values() < n; ++i) absl::SleepFor(absl::Milliseconds(10));
  };
  await_swept(**t, 6);
  EXPECT_EQ((*t)->swept_values(), 6);
  EXPECT_EQ((*t)->swept_bytes(), 6 * kValue);
  EXPECT_TRUE(exists(0)) << "the value just read was swept";
  for (int i = 1; i <= 6; ++i) EXPECT_FALSE(exists(i)) << i;
  for (int i = 7; i <= 10; ++i) EXPECT_TRUE(exists(i)) << i;
  EXPECT_THAT((*t)->Get({{.key = key(1), .value = &back}}, kNoDeadline)[0].Wait(),
              IsError(StatusCode::kNotFound, ""));

  // A second transport over the same directory counts what is there already.
  auto u = DirectoryTransport::Create({.root = dir.File("store"), .max_bytes = 6 * kValue});
  ASSERT_TRUE(u.ok()) << u.status();
  KVTIER_ASSERT_OK((*u)->Put({{.key = key(20), .value = v}}, kNoDeadline)[0].Wait());  // 6 values
  EXPECT_EQ((*u)->swept_values(), 0);
  KVTIER_ASSERT_OK((*u)->Put({{.key = key(21), .value = v}}, kNoDeadline)[0].Wait());  // 7 > 6
  await_swept(**u, 1);
  EXPECT_GT((*u)->swept_values(), 0);
}

TEST(InProcessTransportTest, FailureHookAndMissingKeys) {
  InProcessTransport t;
  const std::vector<std::byte> v(4);
  const std::vector<TransportPut> puts = {{"k", v}};
  KVTIER_ASSERT_OK(t.Put(puts, kNoDeadline)[0].Wait());
  EXPECT_EQ(t.size(), 1);
  t.SetFailure(absl::UnavailableError("server gone"));
  EXPECT_THAT(t.Put(puts, kNoDeadline)[0].Wait(), IsError(StatusCode::kUnavailable, "server gone"));
  t.SetFailure(absl::OkStatus());
  const std::vector<std::string> missing = {"nope"};
  EXPECT_THAT(t.Exists(missing, kNoDeadline)[0].Wait(), IsError(StatusCode::kNotFound, "nope"));
  EXPECT_THAT(t.Delete(missing, kNoDeadline)[0].Wait(), IsError(StatusCode::kNotFound, "nope"));
  EXPECT_EQ(t.MutableValueForTest("nope"), nullptr);
}

// A writer that crashed between create and rename leaves a temporary file forever; the next
// transport on the root removes those older than stale_temporary_age and nothing else.
TEST(DirectoryTransportTest, CreateSweepsStaleTemporariesOnly) {
  testing::TempDir dir;
  const std::string root = dir.path();
  auto write_file = [&](const std::string& name, absl::Duration age) {
    const std::string path = root + "/" + name;
    std::FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("x", f);
    std::fclose(f);
    const timespec t = absl::ToTimespec(absl::Now() - age);
    const timespec times[2] = {t, t};
    ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  };
  write_file(".tmp.0123456789abcdef.7.kvtier:old", absl::Hours(2));
  write_file(".tmp.0123456789abcdef.8.kvtier:young", absl::Minutes(1));
  write_file("kvtier:value", absl::Hours(5));  // a value, however old, is not a temporary
  auto t = DirectoryTransport::Create({.root = root, .stale_temporary_age = absl::Hours(1)});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_FALSE(std::filesystem::exists(root + "/.tmp.0123456789abcdef.7.kvtier:old"));
  EXPECT_TRUE(std::filesystem::exists(root + "/.tmp.0123456789abcdef.8.kvtier:young"));
  EXPECT_TRUE(std::filesystem::exists(root + "/kvtier:value"));
  // Zero keeps everything.
  write_file(".tmp.0123456789abcdef.9.kvtier:old2", absl::Hours(2));
  ASSERT_TRUE(DirectoryTransport::Create({.root = root, .stale_temporary_age = absl::ZeroDuration()}).ok());
  EXPECT_TRUE(std::filesystem::exists(root + "/.tmp.0123456789abcdef.9.kvtier:old2"));
}

}  // namespace
}  // namespace kvtier
