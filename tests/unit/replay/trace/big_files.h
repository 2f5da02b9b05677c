// Oversized trace files for the loaders' limit tests, made cheaply: a long line is streamed from
// one repeated chunk (no copy of it in memory), a huge file is sparse (a hole costs no disk and
// reads back as zero bytes).
#ifndef KVTIER_TESTS_UNIT_REPLAY_TRACE_BIG_FILES_H_
#define KVTIER_TESTS_UNIT_REPLAY_TRACE_BIG_FILES_H_

#include <sys/resource.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace kvtier::testing {

// Writes `prefix`, then `filler` repeated until at least `filler_bytes` bytes of it, then
// `suffix`. False if writing failed.
inline bool WriteRepeated(const std::string& path, const std::string& prefix,
                          const std::string& filler, uint64_t filler_bytes,
                          const std::string& suffix) {
  std::ofstream out(path, std::ios::binary);
  out << prefix;
  std::string chunk;
  while (chunk.size() < (uint64_t{1} << 20)) chunk += filler;
  for (uint64_t written = 0; written < filler_bytes && out; written += chunk.size()) {
    out.write(chunk.data(), static_cast<std::streamsize>(chunk.size()));
  }
  out << suffix;
  return static_cast<bool>(out);
}

// Writes `prefix` and extends the file to `size_bytes` with a hole (zero bytes, no newline).
inline bool WriteSparse(const std::string& path, const std::string& prefix, uint64_t size_bytes) {
  {
    std::ofstream out(path, std::ios::binary);
    out << prefix;
    if (!out) return false;
  }
  std::error_code ec;
  std::filesystem::resize_file(path, size_bytes, ec);
  return !ec;
}

// The process's peak resident set so far (it never goes down), bytes.
inline uint64_t PeakRssBytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<uint64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_UNIT_REPLAY_TRACE_BIG_FILES_H_
