// IO-1: the NVMe tier's file system has less free space than one batch: the short write is not
// counted as stored; a later lookup of those blocks is a miss, not truncated data.
//
// Real space exhaustion: a child process unshares its mount namespace and mounts a tmpfs of
// 2.5 slots, puts a sparse tier file of 8 slots on it (so nothing is preallocated), and writes a
// batch of 8 blocks. The child checks everything and reports through its exit code.
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/random_bytes.h"
#include "kvtier/nvme_tier.h"
#include "tests/testing/temp_dir.h"

namespace kvtier {
namespace {

using ::kvtier::testing::RandomBytes;

constexpr int kSkip = 77;

KvGeometry Geometry() {
  return *KvGeometry::Create({.num_layers = 4, .num_kv_heads = 2, .head_dim = 64,
                              .tokens_per_block = 16});  // 32 KiB blocks
}

std::vector<std::byte> Block(uint32_t seed) {
  return RandomBytes(Geometry().bytes_per_block(), seed);
}

#define CHILD_CHECK(cond, code)                                     \
  do {                                                              \
    if (!(cond)) {                                                  \
      std::fprintf(stderr, "child check failed: %s\n", #cond);      \
      _exit(code);                                                  \
    }                                                               \
  } while (false)

int RunInChild(const std::string& dir, NvmeEngine engine) {
  if (unshare(CLONE_NEWNS) != 0) return kSkip;
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return kSkip;
  const int64_t slot = NvmeTier::SlotBytes(Geometry());
  const std::string size = "size=" + std::to_string(slot * 5 / 2);
  if (mount("tmpfs", dir.c_str(), "tmpfs", 0, size.c_str()) != 0) return kSkip;
  const std::string path = dir + "/tier.bin";
  const int fd = open(path.c_str(), O_CREAT | O_RDWR, 0644);
  CHILD_CHECK(fd >= 0 && ftruncate(fd, 8 * slot) == 0, 10);  // sparse: fits the size check only
  close(fd);

  std::vector<std::vector<std::byte>> data;
  for (uint32_t i = 0; i < 8; ++i) data.push_back(Block(i));
  std::vector<bool> stored(8, false);
  {
    auto tier = NvmeTier::Create(Geometry(), {.path = path, .capacity_bytes = 8 * slot,
                                              .queue_depth = 8, .engine = engine});
    if (!tier.ok()) {
      std::fprintf(stderr, "%s\n", tier.status().ToString().c_str());
      return absl::IsUnavailable(tier.status()) ? kSkip : 11;
    }
    std::vector<BlockWrite> writes;
    for (uint32_t i = 0; i < 8; ++i) writes.push_back({SlotId(i), BlockKey{9, i}, data[i]});
    std::vector<Completion> done = (*tier)->WriteBlocks(writes);
    int failed = 0;
    for (uint32_t i = 0; i < 8; ++i) {
      const absl::Status s = done[i].Wait();
      stored[i] = s.ok();
      if (!s.ok()) {
        ++failed;
        CHILD_CHECK(absl::IsResourceExhausted(s), 12);  // ENOSPC, named as such
      }
    }
    CHILD_CHECK(failed >= 6, 13);  // room for at most 2 of 8 slots
    for (uint32_t i = 0; i < 8; ++i) {
      std::vector<std::byte> back(data[i].size());
      const absl::Status s = (*tier)->ReadBlock(SlotId(i), BlockKey{9, i}, absl::MakeSpan(back)).Wait();
      if (stored[i]) {
        CHILD_CHECK(s.ok() && back == data[i], 14);
      } else {
        CHILD_CHECK(absl::IsNotFound(s), 15);  // a miss, not truncated data
      }
    }
  }
  // After a restart too: a block whose write failed never reads back as a block.
  auto reopened = NvmeTier::Create(Geometry(), {.path = path, .capacity_bytes = 8 * slot,
                                                .engine = engine});
  CHILD_CHECK(reopened.ok(), 16);
  for (uint32_t i = 0; i < 8; ++i) {
    std::vector<std::byte> back(data[i].size());
    const absl::Status s =
        (*reopened)->ReadBlock(SlotId(i), BlockKey{9, i}, absl::MakeSpan(back)).Wait();
    if (stored[i]) {
      CHILD_CHECK(s.ok() && back == data[i], 17);
    } else {
      CHILD_CHECK(!s.ok(), 18);
    }
  }
  return 0;
}

class Regress_IO_1 : public ::testing::TestWithParam<NvmeEngine> {};

TEST_P(Regress_IO_1, ShortWriteOnFullFileSystemIsAMiss) {
  testing::TempDir dir;
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) _exit(RunInChild(dir.path(), GetParam()));
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died";
  if (WEXITSTATUS(status) == kSkip) {
    GTEST_SKIP() << "cannot mount a private tmpfs here (needs root and mount namespaces), or "
                    "io_uring is unavailable";
  }
  EXPECT_EQ(WEXITSTATUS(status), 0) << "see the child's message above";
}

INSTANTIATE_TEST_SUITE_P(Engines, Regress_IO_1,
                         ::testing::Values(NvmeEngine::kIoUring, NvmeEngine::kThreadPool),
                         [](const auto& p) {
                           return p.param == NvmeEngine::kIoUring ? "IoUring" : "ThreadPool";
                         });

}  // namespace
}  // namespace kvtier
