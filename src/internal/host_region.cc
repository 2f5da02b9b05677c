// HostRegion (host_region.h): one exact-size mmap of host memory, huge pages when offered.
#include "internal/host_region.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kvtier::internal {

absl::StatusOr<int64_t> AvailableMemoryBytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string name, unit;
  int64_t kib = 0;
  while (meminfo >> name >> kib >> unit) {
    if (name == "MemAvailable:") return kib * 1024;
  }
  return absl::UnavailableError("MemAvailable not found in /proc/meminfo");
}

absl::StatusOr<HostRegion> HostRegion::Create(size_t bytes, const std::string& what,
                                              bool try_huge_pages, bool check_available,
                                              bool prefault) {
  const int populate = prefault ? MAP_POPULATE : 0;
  if (bytes < 1) return absl::InvalidArgumentError(absl::StrCat(what, ": a region of 0 bytes"));
  if (check_available) {
    absl::StatusOr<int64_t> available = AvailableMemoryBytes();
    if (available.ok() && static_cast<int64_t>(bytes) > *available) {
      return absl::ResourceExhaustedError(absl::StrCat(
          what, ": ", bytes, " bytes requested but only ", *available,
          " bytes of memory are available (MemAvailable); lower the tier's capacity"));
    }
  }
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  // Explicit huge pages only when the size is a whole number of them, so nothing is rounded up
  // beyond a normal page; they exist only if the administrator reserved some.
  if (try_huge_pages && bytes % kHugePageBytes == 0) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | populate, -1, 0);
    if (p != MAP_FAILED) return HostRegion(static_cast<std::byte*>(p), bytes, bytes, true);
  }
  const size_t mapped = (bytes + page - 1) / page * page;
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | populate,
                 -1, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    const std::string message =
        absl::StrCat(what, ": mmap of ", mapped, " bytes failed: ", std::strerror(err));
    return err == ENOMEM ? absl::ResourceExhaustedError(message) : absl::InternalError(message);
  }
  // Transparent huge pages where enabled; a no-op (and an ignorable error) elsewhere.
  const bool thp = try_huge_pages && madvise(p, mapped, MADV_HUGEPAGE) == 0;
  return HostRegion(static_cast<std::byte*>(p), bytes, mapped, thp);
}

HostRegion::HostRegion(HostRegion&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      mapped_(std::exchange(other.mapped_, 0)),
      huge_pages_(other.huge_pages_) {}

HostRegion& HostRegion::operator=(HostRegion&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
    huge_pages_ = other.huge_pages_;
  }
  return *this;
}

HostRegion::~HostRegion() { Reset(); }

void HostRegion::Reset() {
  if (data_ != nullptr) munmap(data_, mapped_);
  data_ = nullptr;
}

}  // namespace kvtier::internal
