// Where the project's shared/ folder (models, traces, cases) is: $KVTIER_SHARED_DIR, else the
// folder beside the checkout. Tests that need it skip with this message when it is absent.
#ifndef KVTIER_TESTS_TESTING_SHARED_DIR_H_
#define KVTIER_TESTS_TESTING_SHARED_DIR_H_

#include <cstdlib>
#include <filesystem>
#include <string>

namespace kvtier::testing {

inline std::filesystem::path SharedDir() {
  if (const char* env = std::getenv("KVTIER_SHARED_DIR"); env != nullptr && *env != '\0') {
    return env;
  }
  return KVTIER_SHARED_DIR_DEFAULT;
}

// Path of `relative` inside shared/, or empty if the file is not there.
inline std::filesystem::path SharedFile(const std::string& relative) {
  std::filesystem::path p = SharedDir() / relative;
  std::error_code ec;
  return std::filesystem::exists(p, ec) ? p : std::filesystem::path();
}

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TESTING_SHARED_DIR_H_
