// AvailableMemoryBytes (src/internal/host_region.h): MemAvailable lowered to the room under the
// process's cgroup memory limits, read from a fake /proc and /sys/fs/cgroup tree.
//
// Found in review: only MemAvailable was read, so in a container whose cgroup allows less than
// the host has free, a DRAM tier of the host's size passed the check and the OOM killer ended the
// process at its first writes instead of Create returning kResourceExhausted.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "internal/host_region.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace kvtier::internal {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;
constexpr int64_t kMiB = int64_t{1} << 20;

class AvailableMemoryTest : public ::testing::Test {
 protected:
  AvailableMemoryTest() {
    sources_.meminfo = dir_.File("meminfo");
    sources_.self_cgroup = dir_.File("self_cgroup");
    sources_.cgroup_root = dir_.File("cgroup");
    // 8 GiB free on the host.
    Write("meminfo", "MemTotal:       16777216 kB\nMemAvailable:    8388608 kB\n");
  }

  // Writes `text` to `relative` under the temporary directory, making its folders.
  void Write(const std::string& relative, const std::string& text) {
    const std::filesystem::path path = dir_.File(relative);
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path) << text;
  }

  testing::TempDir dir_;
  MemorySources sources_;
};

TEST_F(AvailableMemoryTest, WithoutCgroupLimitsItIsMemAvailable) {
  Write("self_cgroup", "0::/\n");  // v2, the root cgroup's files not mounted here
  KVTIER_ASSERT_OK_AND_ASSIGN(const int64_t available, AvailableMemoryBytes(sources_));
  EXPECT_EQ(available, 8 * kGiB);
}

TEST_F(AvailableMemoryTest, CgroupV2LimitLessItsWorkingSet) {
  Write("self_cgroup", "0::/pod/worker\n");
  // 2 GiB allowed, 1.5 GiB used of which 512 MiB inactive file pages: 1 GiB of room.
  Write("cgroup/pod/worker/memory.max", std::to_string(2 * kGiB) + "\n");
  Write("cgroup/pod/worker/memory.current", std::to_string(3 * kGiB / 2) + "\n");
  Write("cgroup/pod/worker/memory.stat",
        "anon 1073741824\nfile 536870912\nactive_file 0\ninactive_file 536870912\n");
  Write("cgroup/pod/memory.max", "max\n");  // no limit on the parent
  Write("cgroup/pod/memory.current", "123\n");
  KVTIER_ASSERT_OK_AND_ASSIGN(const int64_t available, AvailableMemoryBytes(sources_));
  EXPECT_EQ(available, kGiB);
}

TEST_F(AvailableMemoryTest, AnAncestorsLimitCountsToo) {
  Write("self_cgroup", "0::/pod/worker/\n");
  Write("cgroup/pod/worker/memory.max", std::to_string(4 * kGiB) + "\n");
  Write("cgroup/pod/worker/memory.current", "0\n");
  // The parent allows 3 GiB and its children use 2.75 GiB: 256 MiB left for this one.
  Write("cgroup/pod/memory.max", std::to_string(3 * kGiB) + "\n");
  Write("cgroup/pod/memory.current", std::to_string(11 * kGiB / 4) + "\n");
  KVTIER_ASSERT_OK_AND_ASSIGN(const int64_t available, AvailableMemoryBytes(sources_));
  EXPECT_EQ(available, 256 * kMiB);
}

TEST_F(AvailableMemoryTest, CgroupV1MemoryController) {
  Write("self_cgroup", "5:cpu,cpuacct:/job\n4:memory:/job\n0::/\n");
  Write("cgroup/memory/job/memory.limit_in_bytes", std::to_string(kGiB) + "\n");
  Write("cgroup/memory/job/memory.usage_in_bytes", std::to_string(900 * kMiB) + "\n");
  Write("cgroup/memory/job/memory.stat",
        "cache 0\ninactive_file 1\ntotal_inactive_file " + std::to_string(100 * kMiB) + "\n");
  // The v1 root's "unlimited" (a page-rounded 2^63) changes nothing.
  Write("cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  Write("cgroup/memory/memory.usage_in_bytes", std::to_string(5 * kGiB) + "\n");
  KVTIER_ASSERT_OK_AND_ASSIGN(const int64_t available, AvailableMemoryBytes(sources_));
  EXPECT_EQ(available, 224 * kMiB);  // 1024 - (900 - 100) MiB
}

TEST_F(AvailableMemoryTest, AHostWithLessFreeThanTheLimitKeepsMemAvailable) {
  Write("self_cgroup", "0::/big\n");
  Write("cgroup/big/memory.max", std::to_string(64 * kGiB) + "\n");
  Write("cgroup/big/memory.current", std::to_string(kGiB) + "\n");
  KVTIER_ASSERT_OK_AND_ASSIGN(const int64_t available, AvailableMemoryBytes(sources_));
  EXPECT_EQ(available, 8 * kGiB);
}

TEST_F(AvailableMemoryTest, UsageOverTheLimitLeavesNoRoom) {
  Write("self_cgroup", "0::/full\n");
  Write("cgroup/full/memory.max", std::to_string(kGiB) + "\n");
  Write("cgroup/full/memory.current", std::to_string(kGiB + kMiB) + "\n");
  KVTIER_ASSERT_OK_AND_ASSIGN(const int64_t available, AvailableMemoryBytes(sources_));
  EXPECT_EQ(available, 0);
}

TEST_F(AvailableMemoryTest, UnreadableOrMalformedFilesSetNoLimit) {
  Write("self_cgroup", "garbage\n0::relative/path\n7:memory\n0::/odd\n");
  Write("cgroup/odd/memory.max", "not a number\n");
  Write("cgroup/odd/memory.current", "1\n");
  KVTIER_ASSERT_OK_AND_ASSIGN(const int64_t available, AvailableMemoryBytes(sources_));
  EXPECT_EQ(available, 8 * kGiB);
  sources_.self_cgroup = dir_.File("no_such_file");
  KVTIER_ASSERT_OK_AND_ASSIGN(const int64_t without, AvailableMemoryBytes(sources_));
  EXPECT_EQ(without, 8 * kGiB);
}

TEST_F(AvailableMemoryTest, NoMemAvailableIsUnavailable) {
  Write("meminfo", "MemTotal:       16777216 kB\n");
  EXPECT_THAT(AvailableMemoryBytes(sources_),
              testing::IsError(absl::StatusCode::kUnavailable, "MemAvailable"));
}

// On this machine: whatever the cgroups say, never more than MemAvailable alone.
TEST_F(AvailableMemoryTest, TheSystemsFilesGiveAtMostMemAvailable) {
  KVTIER_ASSERT_OK_AND_ASSIGN(const int64_t system, AvailableMemoryBytes());
  MemorySources meminfo_only;
  meminfo_only.self_cgroup = dir_.File("no_such_file");
  KVTIER_ASSERT_OK_AND_ASSIGN(const int64_t host, AvailableMemoryBytes(meminfo_only));
  EXPECT_GE(system, 0);
  // MemAvailable moves between the two reads: allow 256 MiB of drift.
  EXPECT_LE(system, host + 256 * kMiB);
}

}  // namespace
}  // namespace kvtier::internal
