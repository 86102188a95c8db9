#include "io/train_dir_lock.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <system_error>

#include "core/log.h"

namespace towerflow::io {
namespace fs = std::filesystem;

// Note [The train_dir lock on network file systems]: flock(2) is advisory and held by an open
// file description; the kernel drops it when the last descriptor closes, so a process killed by
// SIGKILL releases it as surely as one that exits. On one host that makes "is the holder still
// running?" the kernel's answer, not a guess from a pid. Across hosts it depends on the file
// system:
// - Linux NFS (v3 with lockd, v4) maps flock onto byte-range locks on the server, so a run on
//   another client is seen; a client that crashes keeps its lock until the server's lease or
//   grace period ends (about 90 s on NFSv4), after which the lock is free.
// - NFS mounted with -o nolock, Lustre with -o localflock, and some FUSE file systems keep locks
//   local to each client: a run on another host is NOT seen by the kernel.
// - Lustre with -o noflock (its default), and others, refuse flock (ENOSYS, ENOLCK, EOPNOTSUPP).
// Hence: a lock file that names another host and was never released (not emptied) is never taken
// over, even when the kernel says the lock is free, since that may only mean the lock did not
// reach this host; the user, who can look at that host, removes the file. And where flock is
// refused, the file's content is the lock (a pid that lives, or another host, refuses), with a
// warning that two runs started at the same moment could both pass.
namespace {

std::string this_host() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

std::string program_name() {
  std::ifstream in("/proc/self/comm");
  std::string name;
  std::getline(in, name);
  return name.empty() ? "unknown" : name;
}

std::string now_utc() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

// Whether a process with this pid exists on this host (EPERM: it does, another user's). A zombie
// (killed, not yet reaped by its parent) is gone.
bool pid_exists(long pid) {
  if (pid <= 0 || (::kill(static_cast<pid_t>(pid), 0) != 0 && errno != EPERM)) return false;
  std::ifstream in(str("/proc/", pid, "/stat"));
  std::string stat;
  std::getline(in, stat);
  const auto paren = stat.rfind(')');  // "pid (comm) state ...", comm may hold spaces
  return paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] != 'Z';
}

std::string read_all(int fd) {
  std::string out;
  char buf[4096];
  for (off_t at = 0;;) {
    ssize_t n = ::pread(fd, buf, sizeof buf, at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
    at += n;
    if (out.size() > 65536) break;  // not a lock file of ours
  }
  return out;
}

// The holder a lock file names; nullopt for an empty file (released, or never written).
std::optional<LockHolder> parse_holder(const std::string& text) {
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) return std::nullopt;
  LockHolder h;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const auto space = line.find(' ');
    if (space == std::string::npos) continue;
    const std::string key = line.substr(0, space), value = line.substr(space + 1);
    if (key == "pid") h.pid = std::strtol(value.c_str(), nullptr, 10);
    else if (key == "host") h.host = value;
    else if (key == "started") h.started = value;
    else if (key == "program") h.program = value;
  }
  return h;
}

void write_holder(int fd, const fs::path& file, const LockHolder& h) {
  const std::string text =
      str("pid ", h.pid, "\nhost ", h.host, "\nstarted ", h.started, "\nprogram ", h.program, "\n");
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size()))
    raise<DataError>("cannot write the lock file ", file.string(), ": ", std::strerror(errno));
  ::fsync(fd);  // best effort: the text is for messages, the lock itself is the kernel's
}

std::string holder_text(const std::optional<LockHolder>& h) {
  return h ? h->describe() : std::string("a process that has not written its details yet");
}

}  // namespace

std::string LockHolder::describe() const {
  return str("pid ", pid, program.empty() ? "" : " (" + program + ")", " on host ", host.empty() ? "?" : host,
             ", started ", started.empty() ? "?" : started);
}

// Note [Locking a file that its holder deletes]: a run deletes the lock file as it releases it,
// so the file opened here may have been unlinked by its holder between our open() and flock():
// a lock on it would lock nothing anyone else sees. After flock the descriptor must still be the
// file at that path (same device and inode), else it is opened again.
TrainDirLock::TrainDirLock(fs::path dir) : dir_(std::move(dir)) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec || !fs::is_directory(dir_))
    raise<DataError>("cannot create the train directory ", dir_.string(), ": ",
                     ec ? ec.message() : std::string("a file of that name exists"), "; choose another train_dir");
  const fs::path f = file();
  const std::string d = dir_.string();
  // On any refusal below the descriptor (and with it a lock just taken) goes before the throw.
  auto give_up = [&] {
    ::close(fd_);
    fd_ = -1;
  };
  const std::string host = this_host();

  // Note [Locking a file that its holder deletes].
  for (int attempt = 0;; ++attempt) {
    fd_ = ::open(f.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0)
      raise<DataError>("cannot open the lock file ", f.string(), " of train_dir ", d, ": ", std::strerror(errno),
                       errno == EACCES ? " (the directory or the file belongs to someone else: use another train_dir)"
                                       : "");
    const int locked = ::flock(fd_, LOCK_EX | LOCK_NB);
    const int err = errno;
    struct stat opened {}, now {};
    const bool same = ::fstat(fd_, &opened) == 0 && ::stat(f.c_str(), &now) == 0 && opened.st_dev == now.st_dev &&
                      opened.st_ino == now.st_ino;
    if (locked == 0 || err == EWOULDBLOCK) {
      if (!same && attempt < 100) {
        give_up();
        continue;
      }
      if (locked == 0) break;
    }
    if (err == EWOULDBLOCK) {
      const auto holder = parse_holder(read_all(fd_));
      give_up();
      std::string why;
      if (holder && holder->host != host)
        why = str(" That run is on another host (", holder->host, "; this is ", host, "): if it is gone, its lock "
                  "may outlive it until the file server's lease ends (about 90 s on NFSv4); after that, or if "
                  "that host is down for good, remove ", f.string(), " by hand.");
      else if (holder && holder->pid == ::getpid())
        why = " That is this process: the train_dir is already locked by an earlier lock in this program.";
      else if (holder && !pid_exists(holder->pid))
        why = str(" pid ", holder->pid, " no longer exists, but a process it started still holds the lock file "
                  "open (it inherited it): end that process (fuser ", f.string(), " names it).");
      else
        why = " The lock goes with that process (even if it is killed), so there is nothing to remove by hand here.";
      throw TrainDirLocked(str("train_dir ", d, " is in use by another run: ", holder_text(holder), " holds ",
                               f.string(), ". Two runs in one train_dir would overwrite each other's checkpoints; "
                               "nothing was changed. Wait for that run to end, or use another train_dir.", why),
                           dir_, holder.value_or(LockHolder{}));
    }
    if (err != ENOLCK && err != ENOSYS && err != EOPNOTSUPP && err != EINVAL) {
      give_up();
      raise<DataError>("cannot lock ", f.string(), " of train_dir ", d, ": flock: ", std::strerror(err));
    }
    kernel_lock_ = false;
    log_warning(str("train_dir ", d, ": this file system does not support flock (", std::strerror(err),
                    "); the lock is only the content of ", f.string(),
                    ", so two runs started at the same moment could both proceed"));
    break;
  }

  if (auto previous = parse_holder(read_all(fd_))) {
    // Note [The train_dir lock on network file systems]: another host's lock is never stale here.
    if (previous->host != host) {
      give_up();
      throw TrainDirLocked(
          str("train_dir ", d, " is locked by a run on another host: ", previous->describe(), " (", f.string(),
              "; this is ", host, "). This host cannot tell whether that process still runs (on a network "
              "file system a lock may not reach across hosts), so it is never assumed stale; nothing was changed. "
              "Wait for that run to end or use another train_dir; if that process is gone (check on ",
              previous->host, ": ps -p ", previous->pid, "), remove the lock by hand: rm ", f.string()),
          dir_, *previous);
    }
    const bool exists = pid_exists(previous->pid);
    if (!kernel_lock_ && exists) {
      give_up();
      throw TrainDirLocked(str("train_dir ", d, " is in use by another run: ", previous->describe(), " (",
                               f.string(), "; this file system has no flock, so the lock is its content). "
                               "Nothing was changed. Wait for that run to end, or use another train_dir; "
                               "if pid ", previous->pid, " is not that run, remove ", f.string(), " by hand"),
                           dir_, *previous);
    }
    log_warning(str("train_dir ", d, ": taking over the lock left by ", previous->describe(),
                    ", which ended without releasing it (",
                    exists ? str("pid ", previous->pid, " is now another process") : "that process no longer exists",
                    ")"));
    taken_over_ = std::move(previous);
  }
  try {
    write_holder(fd_, f, {.pid = ::getpid(), .host = host, .started = now_utc(), .program = program_name()});
  } catch (...) {
    give_up();
    throw;
  }
}

TrainDirLock::~TrainDirLock() {
  if (fd_ < 0) return;
  // Deleted while still locked (Note [Locking a file that its holder deletes]): a train_dir with
  // no lock file has no run; one whose file outlived its run was left by a run that was killed.
  // Without flock the content is the lock, so the file goes only while it still names this process.
  bool ours = kernel_lock_;
  if (!ours)
    if (auto h = parse_holder(read_all(fd_))) ours = h->pid == ::getpid();
  if (ours) ::unlink(file().c_str());
  ::close(fd_);
}

}  // namespace towerflow::io
