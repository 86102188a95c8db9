#pragma once
// Helpers for the data tests: a temporary folder and small file writers.

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

namespace towerflow::data::testing {

// A fresh folder under the system's temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "tw_data_test_XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

inline void write_file(const std::filesystem::path& path, const std::vector<std::uint8_t>& bytes) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// Checks that `call` throws exception type E whose message contains every one of `parts`.
template <typename E, typename F>
void require_throws_mentioning(F&& call, const std::vector<std::string>& parts) {
  try {
    call();
  } catch (const E& e) {
    const std::string message = e.what();
    INFO("message: " << message);
    for (const auto& p : parts) {
      INFO("expected to mention: " << p);
      CHECK(message.find(p) != std::string::npos);
    }
    return;
  }
  FAIL("no exception of the expected type was thrown");
}

}  // namespace towerflow::data::testing
