#pragma once
// Shared by the libFuzzer targets in fuzz/: the input as text, a scratch folder for parsers that
// read files, and the rule every target checks.
//
// The rule: a parser of outside input either accepts it or throws the error a user is meant to
// see (InvalidArgument, NotFound, DataError: a message naming the thing and the fix). Any other
// exception (InternalError from a broken TW_CHECK, std::out_of_range, std::bad_alloc, ...)
// escapes the target, which libFuzzer reports as a crash, as it does every sanitizer report.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <unistd.h>

#include "core/error.h"

namespace towerflow::fuzz {

inline std::string_view text_of(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Runs f; a user-facing error is an accepted outcome, anything else propagates.
template <typename F>
void expect_user_errors_only(F&& f) {
  try {
    f();
  } catch (const InvalidArgument&) {
  } catch (const NotFound&) {
  } catch (const DataError&) {
  }
}

// One folder per fuzzing process, under TMPDIR, emptied at exit.
inline const std::filesystem::path& scratch_dir() {
  struct Dir {
    std::filesystem::path path;
    Dir() {
      path = std::filesystem::temp_directory_path() / ("towerflow-fuzz-" + std::to_string(::getpid()));
      std::filesystem::create_directories(path);
    }
    ~Dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static Dir dir;
  return dir.path;
}

inline void write_file(const std::filesystem::path& path, const std::uint8_t* data, std::size_t size) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
}

}  // namespace towerflow::fuzz
