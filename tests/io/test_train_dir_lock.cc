// TrainDirLock: one run per train_dir. Other holders are real processes (fork), since the lock is
// the kernel's and what matters is what it does across processes and when one dies.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "io/atomic_file.h"
#include "io/train_dir_lock.h"
#include "io_test_util.h"

namespace fs = std::filesystem;
using namespace towerflow::io;
using towerflow::io::testing::TempDir;

namespace {

std::string hostname() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

// Another process holding the lock on `dir` until release() (clean: the destructor runs) or
// kill() (SIGKILL: the kernel drops the lock, the file keeps the holder's details).
struct OtherRun {
  pid_t pid = -1;
  int go[2] = {-1, -1};

  explicit OtherRun(const fs::path& dir) {
    int ready[2];
    REQUIRE(::pipe(ready) == 0);
    REQUIRE(::pipe(go) == 0);
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      char c = 0;
      {
        TrainDirLock lock(dir);
        (void)!::write(ready[1], "r", 1);
        (void)!::read(go[0], &c, 1);
      }
      ::_exit(0);
    }
    ::close(ready[1]);
    char c = 0;
    REQUIRE(::read(ready[0], &c, 1) == 1);  // the lock is held
    ::close(ready[0]);
  }
  int release() {
    (void)!::write(go[1], "g", 1);
    return wait();
  }
  void kill() {
    ::kill(pid, SIGKILL);
    wait();
  }
  int wait() {
    int status = 0;
    ::waitpid(pid, &status, 0);
    ::close(go[1]);
    ::close(go[0]);
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  ~OtherRun() {
    if (pid > 0) kill();
  }
};

}  // namespace

TEST_CASE("a second run on a train_dir is refused, naming the dir, the holder and the fix", "[io][lock]") {
  TempDir tmp;
  const fs::path dir = tmp / "run";
  OtherRun first(dir);
  const std::string held = read_file(dir / ".lock");
  CHECK_THAT(held, Catch::Contains("pid " + std::to_string(first.pid)));

  try {
    TrainDirLock second(dir);
    FAIL("the second lock was granted while the first run holds it");
  } catch (const TrainDirLocked& e) {
    const std::string m = e.what();
    INFO(m);
    CHECK(e.dir == dir);
    CHECK(e.holder.pid == first.pid);
    CHECK(e.holder.host == hostname());
    CHECK_FALSE(e.holder.started.empty());
    CHECK_THAT(m, Catch::Contains("train_dir " + dir.string() + " is in use by another run"));
    CHECK_THAT(m, Catch::Contains("pid " + std::to_string(first.pid)));
    CHECK_THAT(m, Catch::Contains("on host " + hostname() + ", started " + e.holder.started));
    CHECK_THAT(m, Catch::Contains("Wait for that run to end, or use another train_dir"));
  }
  CHECK(read_file(dir / ".lock") == held);  // the refused run changed nothing

  REQUIRE(first.release() == 0);
  CHECK_FALSE(fs::exists(dir / ".lock"));  // released: deleted
  TrainDirLock after(dir);                 // ... and free, without a note
  CHECK_FALSE(after.taken_over());
  CHECK_THAT(read_file(dir / ".lock"), Catch::Contains("pid " + std::to_string(::getpid())));
  // Not a temporary, not a checkpoint: CheckpointDir and the start_over checks pass it by.
  CHECK_FALSE(is_temporary_name(dir / ".lock"));
}

TEST_CASE("two locks on one train_dir in one process: the second is refused", "[io][lock]") {
  TempDir tmp;
  TrainDirLock first(tmp.path);
  CHECK_THROWS_WITH(TrainDirLock(tmp.path), Catch::Contains("That is this process"));
}

TEST_CASE("a lock left by a killed run is taken over, saying whose it was", "[io][lock]") {
  TempDir tmp;
  const fs::path dir = tmp / "run";
  OtherRun killed(dir);
  const pid_t gone = killed.pid;
  killed.kill();
  CHECK_THAT(read_file(dir / ".lock"), Catch::Contains("pid " + std::to_string(gone)));  // left behind

  TrainDirLock next(dir);
  REQUIRE(next.taken_over());
  CHECK(next.taken_over()->pid == gone);
  CHECK(next.taken_over()->host == hostname());
  CHECK(next.kernel_lock());
  CHECK_THAT(read_file(dir / ".lock"), Catch::Contains("pid " + std::to_string(::getpid())));
}

TEST_CASE("a lock file naming another host is never assumed stale", "[io][lock]") {
  TempDir tmp;
  const fs::path lock_file = tmp / ".lock";
  const std::string other = "pid 4242\nhost node-elsewhere.example\nstarted 2024-05-01 12:00:03 UTC\nprogram cifar10_train\n";
  write_file_atomically(lock_file, other);
  try {
    TrainDirLock lock(tmp.path);
    FAIL("a lock of another host was taken over");
  } catch (const TrainDirLocked& e) {
    const std::string m = e.what();
    INFO(m);
    CHECK(e.holder.host == "node-elsewhere.example");
    CHECK_THAT(m, Catch::Contains("locked by a run on another host: pid 4242 (cifar10_train) on host "
                                  "node-elsewhere.example, started 2024-05-01 12:00:03 UTC"));
    CHECK_THAT(m, Catch::Contains("never assumed stale"));
    CHECK_THAT(m, Catch::Contains("remove the lock by hand: rm " + lock_file.string()));
  }
  CHECK(read_file(lock_file) == other);
  fs::remove(lock_file);  // what the message says to do once that run is known to be gone
  TrainDirLock lock(tmp.path);
  CHECK_FALSE(lock.taken_over());
}
