// Trace files (trace_file.h): reading a trace whole or line by line, within limits.
#include "bench/replay/trace/trace_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace kvtier::replay {
namespace {

constexpr size_t kChunkBytes = size_t{1} << 20;

// "64 MiB (67108864 bytes)", or "1000 bytes" for a size that is not whole MiB.
std::string LimitText(uint64_t bytes) {
  if (bytes >= (uint64_t{1} << 20) && bytes % (uint64_t{1} << 20) == 0) {
    return absl::StrCat(bytes >> 20, " MiB (", bytes, " bytes)");
  }
  return absl::StrCat(bytes, " bytes");
}

// An open file descriptor, closed when it goes.
class File {
 public:
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File() {
    if (fd_ >= 0) ::close(fd_);
  }

  // The regular file at `path`, opened for reading; errors as ReadTraceFile's.
  static absl::StatusOr<File> Open(const std::string& path) {
    std::error_code ec;
    const std::filesystem::file_status status = std::filesystem::status(path, ec);
    if (!std::filesystem::exists(status)) {
      return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    }
    if (!std::filesystem::is_regular_file(status)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
    }
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const int error = errno;
      return absl::ErrnoToStatus(error, absl::StrCat(path, ": cannot open"));
    }
    return File(fd);
  }

  File(File&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }

  // Up to `size` bytes into `data`: how many (0 at the end of the file), or the errno's status.
  absl::StatusOr<size_t> Read(char* data, size_t size, const std::string& path) const {
    for (;;) {
      const ssize_t n = ::read(fd_, data, size);
      if (n >= 0) return static_cast<size_t>(n);
      const int error = errno;
      if (error == EINTR) continue;
      return absl::ErrnoToStatus(error, absl::StrCat(path, ": read failed"));
    }
  }

  // The file's size in bytes now, or the errno's status.
  absl::StatusOr<uint64_t> Size(const std::string& path) const {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      const int error = errno;
      return absl::ErrnoToStatus(error, absl::StrCat(path, ": cannot stat"));
    }
    return static_cast<uint64_t>(st.st_size);
  }

 private:
  explicit File(int fd) : fd_(fd) {}

  int fd_ = -1;
};

absl::Status TooLarge(const std::string& path, uint64_t size, bool at_least, uint64_t max_bytes) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", at_least ? "more than " : "", size,
                                                 " bytes, over the limit of ", LimitText(max_bytes),
                                                 " for a trace file read whole"));
}

}  // namespace

absl::StatusOr<std::string> ReadTraceFile(const std::string& path, uint64_t max_bytes) {
  absl::StatusOr<File> file = File::Open(path);
  if (!file.ok()) return file.status();
  absl::StatusOr<uint64_t> size = file->Size(path);
  if (!size.ok()) return size.status();
  // Refused before reading, so a huge file costs neither the time nor the memory.
  if (*size > max_bytes) return TooLarge(path, *size, /*at_least=*/false, max_bytes);
  std::string bytes;
  bytes.reserve(static_cast<size_t>(*size));
  std::vector<char> chunk(kChunkBytes);
  for (;;) {
    absl::StatusOr<size_t> n = file->Read(chunk.data(), chunk.size(), path);
    if (!n.ok()) return n.status();
    if (*n == 0) break;
    // The file may have grown since its size was checked.
    if (bytes.size() + *n > max_bytes) {
      return TooLarge(path, bytes.size() + *n, /*at_least=*/true, max_bytes);
    }
    bytes.append(chunk.data(), *n);
  }
  return bytes;
}

absl::Status ForEachTraceLine(
    const std::string& path,
    absl::FunctionRef<absl::Status(int64_t line_number, absl::string_view line)> visit,
    uint64_t max_line_bytes) {
  absl::StatusOr<File> file = File::Open(path);
  if (!file.ok()) return file.status();
  std::vector<char> chunk(kChunkBytes);
  std::string pending;  // the start of a line that continues in the next chunk
  int64_t line_number = 0;
  for (;;) {
    absl::StatusOr<size_t> n = file->Read(chunk.data(), chunk.size(), path);
    if (!n.ok()) return n.status();
    if (*n == 0) break;
    absl::string_view data(chunk.data(), *n);
    while (!data.empty()) {
      const size_t newline = data.find('\n');
      const absl::string_view piece = data.substr(0, newline);
      // Checked before appending: a long line costs at most the limit, never the line.
      if (pending.size() + piece.size() > max_line_bytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ":", line_number + 1, ": line exceeds the limit of ", LimitText(max_line_bytes)));
      }
      if (newline == absl::string_view::npos) {
        pending.append(piece.data(), piece.size());
        break;
      }
      ++line_number;
      absl::Status status;
      if (pending.empty()) {
        status = visit(line_number, piece);  // the common case: no copy
      } else {
        pending.append(piece.data(), piece.size());
        status = visit(line_number, pending);
        pending.clear();
      }
      if (!status.ok()) return status;
      data.remove_prefix(newline + 1);
    }
  }
  if (!pending.empty()) return visit(line_number + 1, pending);
  return absl::OkStatus();
}

std::string TraceNameOf(const std::string& path) {
  std::filesystem::path p(path);
  while (!p.empty() && p.filename().empty() && p != p.root_path()) p = p.parent_path();
  const std::filesystem::path parent = p.parent_path().filename();
  if (parent.empty() || parent == "." || parent == "..") return p.filename().string();
  return (parent / p.filename()).string();
}

}  // namespace kvtier::replay
