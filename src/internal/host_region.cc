// HostRegion (host_region.h): one exact-size mmap of host memory, huge pages when offered.
#include "internal/host_region.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvtier::internal {

namespace {

// The first whitespace-separated number in `path`; nullopt if the file cannot be read or holds
// none (v2's "max" among them: no limit).
std::optional<int64_t> ReadNumber(const std::string& path) {
  std::ifstream in(path);
  std::string word;
  int64_t value = 0;
  if (!(in >> word) || !absl::SimpleAtoi(word, &value)) return std::nullopt;
  return value;
}

// The value of `field` in a "name value" file (memory.stat); 0 if absent.
int64_t ReadStatField(const std::string& path, std::string_view field) {
  std::ifstream in(path);
  std::string name;
  int64_t value = 0;
  while (in >> name >> value) {
    if (name == field) return value;
  }
  return 0;
}

// The room left under the limit of the cgroup in `dir` (v2 or v1 file names); nullopt when it
// sets none that can be read.
std::optional<int64_t> RoomUnderLimit(const std::string& dir, bool v2) {
  const std::optional<int64_t> limit =
      ReadNumber(dir + (v2 ? "/memory.max" : "/memory.limit_in_bytes"));
  if (!limit.has_value()) return std::nullopt;
  const std::optional<int64_t> usage =
      ReadNumber(dir + (v2 ? "/memory.current" : "/memory.usage_in_bytes"));
  if (!usage.has_value()) return std::nullopt;
  const int64_t inactive_file =
      ReadStatField(dir + "/memory.stat", v2 ? "inactive_file" : "total_inactive_file");
  const int64_t working_set = std::max<int64_t>(0, *usage - std::max<int64_t>(0, inactive_file));
  return std::max<int64_t>(0, *limit - working_set);
}

// The least room under the limits of `path` (a cgroup path, "/..."), under `base`, and of each
// of its ancestors up to `base` itself.
std::optional<int64_t> LeastRoom(const std::string& base, std::string path, bool v2) {
  std::optional<int64_t> least;
  while (true) {
    while (path.size() > 1 && path.back() == '/') path.pop_back();
    const std::string dir = path == "/" || path.empty() ? base : base + path;
    if (const std::optional<int64_t> room = RoomUnderLimit(dir, v2); room.has_value()) {
      least = least.has_value() ? std::min(*least, *room) : *room;
    }
    if (path == "/" || path.empty()) return least;
    const size_t slash = path.rfind('/');
    path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
  }
}

}  // namespace

absl::StatusOr<int64_t> AvailableMemoryBytes(const MemorySources& sources) {
  std::optional<int64_t> available;
  {
    std::ifstream meminfo(sources.meminfo);
    std::string name, unit;
    int64_t kib = 0;
    while (meminfo >> name >> kib >> unit) {
      if (name == "MemAvailable:") {
        available = kib * 1024;
        break;
      }
    }
  }
  if (!available.has_value()) {
    return absl::UnavailableError(absl::StrCat("MemAvailable not found in ", sources.meminfo));
  }
  // /proc/self/cgroup lines are "id:controllers:path": "0::path" for v2, "N:memory:path" (the
  // memory controller among others, comma-separated) for v1.
  std::ifstream cgroups(sources.self_cgroup);
  std::string line;
  while (std::getline(cgroups, line)) {
    const std::vector<std::string> parts = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (parts.size() != 3 || parts[2].empty() || parts[2][0] != '/') continue;
    std::optional<int64_t> room;
    if (parts[0] == "0" && parts[1].empty()) {
      room = LeastRoom(sources.cgroup_root, parts[2], /*v2=*/true);
    } else {
      const std::vector<std::string> controllers = absl::StrSplit(parts[1], ',');
      if (std::find(controllers.begin(), controllers.end(), "memory") == controllers.end()) {
        continue;
      }
      room = LeastRoom(sources.cgroup_root + "/memory", parts[2], /*v2=*/false);
    }
    if (room.has_value()) available = std::min(*available, *room);
  }
  return *available;
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
          " bytes of memory are available (MemAvailable and the cgroup's limits); lower the tier's "
          "capacity"));
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
