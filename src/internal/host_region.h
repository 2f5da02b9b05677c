// One exact-size region of host memory from mmap: the backing store of the DRAM tier and of the
// emulated HBM tier. It maps exactly the bytes asked for (the kernel rounds to its page size,
// nothing more: case AC-2), uses huge pages where the system offers them, and checks the size
// against MemAvailable first so an impossible budget fails with a clear error instead of the OOM
// killer later.
#ifndef KVTIER_INTERNAL_HOST_REGION_H_
#define KVTIER_INTERNAL_HOST_REGION_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace kvtier::internal {

// MemAvailable from /proc/meminfo, in bytes. Errors: kUnavailable if it cannot be read.
absl::StatusOr<int64_t> AvailableMemoryBytes();

class HostRegion {
 public:
  static constexpr size_t kHugePageBytes = size_t{2} << 20;

  // Maps `bytes` (>= 1) of anonymous memory for `what` (used in messages).
  // Errors: kInvalidArgument for bytes < 1; kResourceExhausted if bytes exceeds MemAvailable
  // (when check_available is set) or mmap fails with ENOMEM; kInternal for other mmap errors.
  // With `prefault`, every page is faulted in now (MAP_POPULATE), as cudaMalloc or
  // cudaHostRegister would back them, so the first copies do not pay for page faults.
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
