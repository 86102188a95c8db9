#pragma once
// Files that are either wholly written or not there: the building block of checkpoints.
//
// Contract: write_file_atomically(path, bytes) leaves `path` holding either its previous content
// or exactly `bytes`, never a mixture, whatever happens to the process (SIGKILL, a full disk, an
// exception). It writes a temporary file beside `path` (same directory, so the rename cannot cross
// file systems), fsyncs it, renames it over `path`, and fsyncs the directory so the rename itself
// survives a power loss. A failed write removes its temporary and throws DataError naming the
// path, the system call and the reason. Temporaries left by a killed process carry the marker
// kTemporaryMarker in their name; remove_stale_temporaries() deletes them.
// Functions here are safe to call from several threads on different paths.

#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>

namespace towerflow::io {

// Every temporary file or directory created here has this in its name: "<name>.tmp-<pid>-<n>".
inline constexpr std::string_view kTemporaryMarker = ".tmp-";

// Writes bytes to path atomically (see the contract above). The parent directory must exist.
void write_file_atomically(const std::filesystem::path& path, std::string_view bytes);

// Reads a whole file. NotFound when it does not exist, DataError when it cannot be read.
std::string read_file(const std::filesystem::path& path);

// fsyncs a directory so that renames and creations inside it are durable. DataError on failure.
void fsync_directory(const std::filesystem::path& dir);

// fsyncs every regular file directly in `dir`, then the directory itself.
void fsync_tree(const std::filesystem::path& dir);

// A fresh temporary name beside `path`: "<path>.tmp-<pid>-<counter>".
std::filesystem::path temporary_path_for(const std::filesystem::path& path);

bool is_temporary_name(const std::filesystem::path& path);

// Removes every temporary file or directory directly inside `dir` (left by an interrupted
// write). Returns how many entries were removed. A missing `dir` removes nothing.
int remove_stale_temporaries(const std::filesystem::path& dir);

// Appends whole lines to a log file (metrics.jsonl): each append() is one write(2) of the line
// and its newline on a file opened with O_APPEND, then flushed to the kernel, so a killed process
// leaves at most its last line incomplete and never interleaves bytes of two lines.
class LineAppender {
 public:
  LineAppender() = default;
  explicit LineAppender(const std::filesystem::path& path);  // creates the file; DataError on failure
  ~LineAppender();
  LineAppender(LineAppender&& other) noexcept;
  LineAppender& operator=(LineAppender&& other) noexcept;
  LineAppender(const LineAppender&) = delete;
  LineAppender& operator=(const LineAppender&) = delete;

  bool is_open() const { return fd_ >= 0; }
  void append(std::string_view line);  // line without the newline
  const std::filesystem::path& path() const { return path_; }

 private:
  int fd_ = -1;
  std::filesystem::path path_;
};

}  // namespace towerflow::io
