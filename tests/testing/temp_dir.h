// A temporary directory under /tmp (ext4 on the development machines: O_DIRECT alignment is
// enforced there, unlike tmpfs), removed with everything in it when the object goes.
#ifndef KVTIER_TESTS_TESTING_TEMP_DIR_H_
#define KVTIER_TESTS_TESTING_TEMP_DIR_H_

#include <stdlib.h>

#include <filesystem>
#include <string>

namespace kvtier::testing {

class TempDir {
 public:
  TempDir() {
    char pattern[] = "/tmp/kvtier_test_XXXXXX";
    const char* made = mkdtemp(pattern);
    path_ = made != nullptr ? made : "";
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TESTING_TEMP_DIR_H_
