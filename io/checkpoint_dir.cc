#include "io/checkpoint_dir.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <system_error>

#include "core/error.h"
#include "io/atomic_file.h"

namespace towerflow::io {
namespace fs = std::filesystem;
namespace {

constexpr std::string_view kPrefix = "ckpt-";

void write_plain(const fs::path& path, const std::string& bytes) {
  // Inside a temporary directory a plain write is enough: the directory rename publishes it.
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) raise<DataError>("cannot write ", path.string(), ": ", std::strerror(errno));
  const char* p = bytes.data();
  std::size_t left = bytes.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      raise<DataError>("cannot write ", path.string(), ": ", std::strerror(err),
                       err == ENOSPC ? " (the disk is full; free space or lower FitOptions::keep_checkpoints)" : "");
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  ::close(fd);
}

}  // namespace

CheckpointDir::CheckpointDir(fs::path dir) : dir_(std::move(dir)) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec || !fs::is_directory(dir_))
    raise<DataError>("cannot create the checkpoint directory ", dir_.string(), ": ",
                     ec ? ec.message() : std::string("a file of that name exists"),
                     "; choose another FitOptions::train_dir");
}

std::string CheckpointDir::name_for_step(std::int64_t step) {
  std::string digits = std::to_string(step);
  if (digits.size() < 10) digits.insert(0, 10 - digits.size(), '0');
  return std::string(kPrefix) + digits;
}

std::optional<std::int64_t> CheckpointDir::step_of(const fs::path& path) {
  std::string name = path.filename().string();
  if (!name.starts_with(kPrefix) || is_temporary_name(path)) return std::nullopt;
  std::string_view digits = std::string_view(name).substr(kPrefix.size());
  if (digits.empty()) return std::nullopt;
  std::int64_t step = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (ec != std::errc() || end != digits.data() + digits.size() || step < 0) return std::nullopt;
  return step;
}

std::vector<CheckpointInfo> CheckpointDir::list() const {
  std::vector<CheckpointInfo> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    if (!entry.is_directory()) continue;
    if (auto step = step_of(entry.path())) out.push_back({*step, entry.path()});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
  return out;
}

std::optional<CheckpointInfo> CheckpointDir::latest() const {
  auto all = list();
  if (all.empty()) return std::nullopt;
  return all.back();
}

fs::path CheckpointDir::save(std::int64_t step,
                             const std::vector<std::pair<std::string, std::string>>& files, int keep) {
  TW_CHECK(step >= 0, "negative step ", step);
  fs::path final_path = dir_ / name_for_step(step);
  fs::path tmp = temporary_path_for(final_path);
  std::error_code ec;
  if (!fs::create_directory(tmp, ec) || ec)
    raise<DataError>("cannot create ", tmp.string(), ": ", ec.message());
  try {
    for (const auto& [name, bytes] : files) write_plain(tmp / name, bytes);
    fsync_tree(tmp);
    if (::rename(tmp.c_str(), final_path.c_str()) != 0) {
      int err = errno;
      if (err != ENOTEMPTY && err != EEXIST)
        raise<DataError>("cannot rename ", tmp.string(), " to ", final_path.string(), ": ", std::strerror(err));
      // The step exists already (a resumed run saving the same step): swap the two in one
      // atomic step, then delete the old one now sitting under the temporary name.
      if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_path.c_str(), RENAME_EXCHANGE) != 0)
        raise<DataError>("cannot replace ", final_path.string(), ": ", std::strerror(errno));
    }
    fsync_directory(dir_);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  fs::remove_all(tmp, ec);  // the replaced checkpoint, if there was one
  prune(keep);
  return final_path;
}

int CheckpointDir::prune(int keep) {
  if (keep <= 0) return 0;
  auto all = list();
  if (all.size() <= static_cast<std::size_t>(keep)) return 0;
  all.resize(all.size() - static_cast<std::size_t>(keep));
  return remove(all);
}

int CheckpointDir::remove(const std::vector<CheckpointInfo>& checkpoints) {
  int removed = 0;
  for (const auto& c : checkpoints) {
    // Rename first so a crash in the middle of remove_all leaves a temporary, never a
    // half-deleted directory that looks like a checkpoint.
    fs::path doomed = temporary_path_for(c.path);
    std::error_code ec;
    fs::rename(c.path, doomed, ec);
    if (ec) continue;
    fs::remove_all(doomed, ec);
    ++removed;
  }
  if (removed) fsync_directory(dir_);
  return removed;
}

int CheckpointDir::remove_stale() { return remove_stale_temporaries(dir_); }

}  // namespace towerflow::io
