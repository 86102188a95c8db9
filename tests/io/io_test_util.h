#pragma once
// Helpers shared by the io tests: a fresh temporary directory per test, fixture paths.

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace towerflow::io::testing {

inline std::filesystem::path fixture(const std::string& name) {
  const char* env = std::getenv("TOWERFLOW_TEST_DATA");
  std::filesystem::path root = env ? env : TW_FIXTURES_DIR;
  return root / "io" / name;
}

// A directory under the system temp dir, removed with everything in it when the object dies.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    static std::atomic<int> counter{0};
    path = std::filesystem::temp_directory_path() /
           ("towerflow-io-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::filesystem::path operator/(const std::string& name) const { return path / name; }
};

}  // namespace towerflow::io::testing
