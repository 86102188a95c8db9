#pragma once
// TrainDirLock: one training run per train_dir. Two runs writing one directory (a job submitted
// twice, a requeue that overlaps the job it replaces) would overwrite each other's checkpoints
// and metrics; the second one is refused instead.
//
//   io::TrainDirLock lock{"run"};   // TrainDirLocked if another run holds "run"
//   ... write checkpoints into run/ ...
//                                   // released when `lock` is destroyed, or the process dies
//
// Contract:
// - The constructor creates `dir` (and parents) if missing, opens dir/.lock and takes an
//   exclusive flock(2) on it without waiting, then writes the holder into it as text: pid, host,
//   start time (UTC) and program. The lock is held until the object is destroyed (which deletes
//   the file) or the process ends, however it ends: the kernel releases flock locks of a dead
//   process, so a run killed by SIGKILL or the OOM killer never blocks the next one (its file
//   stays, naming it, and the next run says it took it over).
// - Another holder (another process, or another TrainDirLock in this process): TrainDirLocked,
//   naming the dir, the holder's pid, host and start time, and the fixes (wait, another
//   train_dir, or remove the lock file if that process is gone). Nothing in `dir` is changed.
// - A lock file left by a process that ended without releasing it (killed): taken over, and
//   taken_over() returns who left it (a warning is logged). On the same host that is decided by
//   the kernel's lock alone. A file naming ANOTHER host is never assumed stale, because on a
//   network file system the lock may not reach across hosts (Note [The train_dir lock on network
//   file systems] in train_dir_lock.cc): TrainDirLocked, saying so and how to remove the file.
// - A file system that refuses flock (ENOLCK, ENOSYS, EOPNOTSUPP): the file's content alone is
//   the lock (a live pid on this host or any other host refuses; a dead pid on this host is taken
//   over) and a warning says that two runs started at the same moment could both proceed.
// - DataError naming the path and the reason when the directory or the file cannot be made.
// Readers (an evaluation, towerflow_ckpt, TensorBoard) do not take the lock.
// Not synchronised; neither copyable nor movable (the lock belongs to this object's lifetime).

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "core/error.h"

namespace towerflow::io {

// Who holds (or held) a train_dir's lock, as its lock file says.
struct LockHolder {
  long pid = 0;
  std::string host;
  std::string started;  // "2024-05-01 12:00:03 UTC"
  std::string program;  // the process's name, e.g. "cifar10_train"
  // "pid 1234 (cifar10_train) on host node7, started 2024-05-01 12:00:03 UTC"
  std::string describe() const;
};

// Another run holds the train_dir (see TrainDirLock). Nothing was changed.
class TrainDirLocked : public InvalidArgument {
 public:
  TrainDirLocked(std::string message, std::filesystem::path dir, LockHolder holder)
      : InvalidArgument(std::move(message)), dir(std::move(dir)), holder(std::move(holder)) {}
  std::filesystem::path dir;
  LockHolder holder;  // empty fields where the lock file did not say
};

class TrainDirLock {
 public:
  static constexpr std::string_view kFileName = ".lock";

  explicit TrainDirLock(std::filesystem::path dir);
  ~TrainDirLock();
  TrainDirLock(const TrainDirLock&) = delete;
  TrainDirLock& operator=(const TrainDirLock&) = delete;

  const std::filesystem::path& dir() const { return dir_; }
  std::filesystem::path file() const { return dir_ / kFileName; }
  // The holder whose lock was left behind and taken over (nullopt: the lock was free).
  const std::optional<LockHolder>& taken_over() const { return taken_over_; }
  // False where the file system refused flock and the file's content is the only lock.
  bool kernel_lock() const { return kernel_lock_; }

 private:
  std::filesystem::path dir_;
  int fd_ = -1;
  bool kernel_lock_ = true;
  std::optional<LockHolder> taken_over_;
};

}  // namespace towerflow::io
