// Trace files (trace_file.h): reading a trace from a file or a folder of them.
#include "bench/replay/trace/trace_file.h"

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace kvtier::replay {

absl::StatusOr<std::string> ReadTraceFile(const std::string& path) {
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(status)) {
    return absl::NotFoundError(absl::StrCat(path, ": no such file"));
  }
  if (!std::filesystem::is_regular_file(status)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int error = errno;
    return absl::ErrnoToStatus(error, absl::StrCat(path, ": cannot open"));
  }
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (in.bad()) {
    const int error = errno;
    return absl::ErrnoToStatus(error, absl::StrCat(path, ": read failed"));
  }
  return std::move(bytes).str();
}

std::string TraceNameOf(const std::string& path) {
  std::filesystem::path p(path);
  while (!p.empty() && p.filename().empty() && p != p.root_path()) p = p.parent_path();
  const std::filesystem::path parent = p.parent_path().filename();
  if (parent.empty() || parent == "." || parent == "..") return p.filename().string();
  return (parent / p.filename()).string();
}

}  // namespace kvtier::replay
