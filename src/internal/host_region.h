// One exact-size region of host memory from mmap: the backing store of the DRAM tier and of the
// emulated HBM tier. It maps exactly the bytes asked for (the kernel rounds to its page size,
// nothing more: case AC-2), uses huge pages where the system offers them, and checks the size
// against the memory available (MemAvailable and the cgroup's limits) first so an impossible
// budget fails with a clear error instead of the OOM killer later.
#ifndef KVTIER_INTERNAL_HOST_REGION_H_
#define KVTIER_INTERNAL_HOST_REGION_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace kvtier::internal {

// Where AvailableMemoryBytes reads (the system's files by default; tests point them at a tree
// of their own).
struct MemorySources {
  std::string meminfo = "/proc/meminfo";
  std::string self_cgroup = "/proc/self/cgroup";
  std::string cgroup_root = "/sys/fs/cgroup";
};

// The memory this process can still take, in bytes: MemAvailable from `meminfo`, lowered to the
// room under every memory limit of the process's cgroup and its ancestors, so that a container
// gets kResourceExhausted at creation rather than the OOM killer later. The room under a limit
// is the limit minus the cgroup's working set: its usage less its inactive file pages, which
// the kernel reclaims first (as the kubelet counts it). cgroup v2: memory.max, memory.current
// and memory.stat's inactive_file under `cgroup_root`; v1: memory.limit_in_bytes,
// memory.usage_in_bytes and memory.stat's total_inactive_file under `cgroup_root`/memory. A
// cgroup whose files are absent or unreadable (not mounted in this namespace) sets no limit.
// Errors: kUnavailable if MemAvailable cannot be read. Thread-safe (reads files only).
absl::StatusOr<int64_t> AvailableMemoryBytes(const MemorySources& sources = {});

class HostRegion {
 public:
  static constexpr size_t kHugePageBytes = size_t{2} << 20;

  // Maps `bytes` (>= 1) of anonymous memory for `what` (used in messages).
  // Errors: kInvalidArgument for bytes < 1; kResourceExhausted if bytes exceeds
  // AvailableMemoryBytes() (when check_available is set) or mmap fails with ENOMEM; kInternal for
  // other mmap errors. With `prefault`, every page is faulted in now (MAP_POPULATE), as cudaMalloc
  // or cudaHostRegister would back them, so the first copies do not pay for page faults.
  static absl::StatusOr<HostRegion> Create(size_t bytes, const std::string& what,
                                           bool try_huge_pages = true, bool check_available = true,
                                           bool prefault = false);

  HostRegion(HostRegion&& other) noexcept;
  HostRegion& operator=(HostRegion&& other) noexcept;
  HostRegion(const HostRegion&) = delete;
  HostRegion& operator=(const HostRegion&) = delete;
  ~HostRegion();

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }               // bytes asked for
  size_t mapped_bytes() const { return mapped_; }     // bytes mapped (size rounded to a page)
  bool huge_pages() const { return huge_pages_; }     // MAP_HUGETLB or transparent huge pages

 private:
  HostRegion(std::byte* data, size_t size, size_t mapped, bool huge)
      : data_(data), size_(size), mapped_(mapped), huge_pages_(huge) {}
  void Reset();

  std::byte* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_ = 0;
  bool huge_pages_ = false;
};

}  // namespace kvtier::internal

#endif  // KVTIER_INTERNAL_HOST_REGION_H_
