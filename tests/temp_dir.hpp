#pragma once
// TempDir: a unique path under the system temp folder for one test, removed with everything in it
// when the test ends (permissions restored first, so a test may chmod it to provoke refusals).
// `create` = false leaves the path absent, for tests of code that must create it itself.
// read_file: a file's bytes as a string ("" when it cannot be read).
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>

namespace mlajit::testing {

class TempDir {
 public:
  explicit TempDir(const std::string& tag = "test", bool create = true) {
    static std::atomic<int> counter{0};
    path = std::filesystem::temp_directory_path() /
           ("mlajit_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
    if (create) std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::permissions(path, std::filesystem::perms::owner_all, ec);
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string str() const { return path.string(); }
  std::filesystem::path path;
};

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace mlajit::testing
