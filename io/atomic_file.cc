#include "io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <system_error>
#include <utility>
#include <vector>

#include "core/error.h"

namespace towerflow::io {
namespace fs = std::filesystem;
namespace {

[[noreturn]] void fail(const char* call, const fs::path& path, int err) {
  raise<DataError>("cannot write ", path.string(), ": ", call, " failed: ", std::strerror(err),
                   err == ENOSPC   ? " (the disk is full; free space or write elsewhere)"
                   : err == EACCES ? " (permission denied; choose a writable directory)"
                                   : "");
}

// Closes on scope exit; on failure also unlinks the temporary so nothing partial stays behind.
struct TempFile {
  int fd = -1;
  fs::path path;
  bool committed = false;
  ~TempFile() {
    if (fd >= 0) ::close(fd);
    if (!committed && !path.empty()) ::unlink(path.c_str());
  }
};

void write_all(int fd, std::string_view bytes, const fs::path& path) {
  const char* p = bytes.data();
  std::size_t left = bytes.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("write", path, errno);
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

}  // namespace

fs::path temporary_path_for(const fs::path& path) {
  static std::atomic<unsigned long> counter{0};
  return fs::path(str(path.string(), kTemporaryMarker, ::getpid(), "-", counter.fetch_add(1)));
}

bool is_temporary_name(const fs::path& path) {
  return path.filename().string().find(kTemporaryMarker) != std::string::npos;
}

void fsync_directory(const fs::path& dir) {
  fs::path d = dir.empty() ? fs::path(".") : dir;
  int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail("open (directory)", d, errno);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some file systems (and /dev/shm-like mounts) refuse fsync on directories; the rename is
  // still atomic there, only its durability across a power loss is not guaranteed.
  if (rc != 0 && err != EINVAL && err != EROFS) fail("fsync (directory)", d, err);
}

void fsync_tree(const fs::path& dir) {
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    int fd = ::open(entry.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail("open", entry.path(), errno);
    int rc = ::fsync(fd);
    int err = errno;
    ::close(fd);
    if (rc != 0) fail("fsync", entry.path(), err);
  }
  fsync_directory(dir);
}

void write_file_atomically(const fs::path& path, std::string_view bytes) {
  TempFile tmp;
  tmp.path = temporary_path_for(path);
  tmp.fd = ::open(tmp.path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (tmp.fd < 0) {
    int err = errno;
    tmp.path.clear();  // nothing was created
    fail("open", path, err);
  }
  write_all(tmp.fd, bytes, tmp.path);
  if (::fsync(tmp.fd) != 0) fail("fsync", tmp.path, errno);
  int fd = tmp.fd;
  tmp.fd = -1;
  if (::close(fd) != 0) fail("close", tmp.path, errno);
  if (::rename(tmp.path.c_str(), path.c_str()) != 0) fail("rename", path, errno);
  tmp.committed = true;
  fsync_directory(path.parent_path());
}

std::string read_file(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) raise<NotFound>("file ", path.string(), " does not exist");
    raise<DataError>("cannot read ", path.string(), ": ", std::strerror(err));
  }
  std::string out;
  struct stat st{};
  if (::fstat(fd, &st) == 0 && st.st_size > 0) out.reserve(static_cast<std::size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      raise<DataError>("cannot read ", path.string(), ": ", std::strerror(err));
    }
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return out;
}

int remove_stale_temporaries(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return 0;
  int removed = 0;
  std::vector<fs::path> stale;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (is_temporary_name(entry.path())) stale.push_back(entry.path());
  for (const auto& p : stale) {
    fs::remove_all(p, ec);
    if (!ec) ++removed;
  }
  return removed;
}

LineAppender::LineAppender(const fs::path& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("open", path, errno);
}

LineAppender::~LineAppender() {
  if (fd_ >= 0) ::close(fd_);
}

LineAppender::LineAppender(LineAppender&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}

LineAppender& LineAppender::operator=(LineAppender&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
  }
  return *this;
}

void LineAppender::append(std::string_view line) {
  TW_CHECK(fd_ >= 0, "append to a closed LineAppender");
  std::string buf;
  buf.reserve(line.size() + 1);
  buf.append(line);
  buf.push_back('\n');
  // One write(2) per line: with O_APPEND the kernel places it whole at the end of the file.
  write_all(fd_, buf, path_);
}

}  // namespace towerflow::io
