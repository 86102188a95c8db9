// The real program twice on one --train_dir: the second is refused while the first runs, naming
// it; after the first is killed, --resume takes its lock over; after a clean end, --resume just
// works.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "io/atomic_file.h"
#include "io/checkpoint_dir.h"
#include "training_test_util.h"

extern char** environ;

namespace fs = std::filesystem;
using namespace towerflow::cifar10::testing;

namespace {

std::vector<std::string> args_for(const fs::path& train_dir, const std::string& epochs) {
  return {"--builtin_train_size", "192", "--builtin_test_size", "32", "--batch_size", "32", "--epochs", epochs,
          "--save_every", "2", "--keep_checkpoints", "2", "--loader_threads", "0", "--devices", "/cpu:0,/cpu:1",
          "--log_every", "1", "--seed", "3", "--train_dir", train_dir.string()};
}

}  // namespace

TEST_CASE("cifar10_train twice on one --train_dir: the second is refused naming the first, --resume takes over a killed one",
          "[cifar10][lock]") {
  TempDir tmp;
  const fs::path run = tmp.path / "run";
  // Long enough (1000 epochs) to be running still when the second starts; it is killed below.
  const pid_t first = spawn_trainer(args_for(run, "1000"), tmp.path / "first.log");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(180);
  while (!(fs::exists(run) && towerflow::io::CheckpointDir(run).latest())) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    REQUIRE(::waitpid(first, nullptr, WNOHANG) == 0);  // still running
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }

  const int second = wait_exit(spawn_trainer(args_for(run, "1000"), tmp.path / "second.log"));
  const std::string said = towerflow::io::read_file(tmp.path / "second.log");
  INFO(said);
  CHECK(second == 2);
  CHECK_THAT(said, Catch::Contains("--train_dir " + run.string() + " is in use by another run: pid " +
                                   std::to_string(first) + " (cifar10_train) on host "));
  CHECK_THAT(said, Catch::Contains(", started 20"));
  CHECK_THAT(said, Catch::Contains("Wait for that run to end, or use another --train_dir"));
  CHECK(::waitpid(first, nullptr, WNOHANG) == 0);  // the first one goes on

  ::kill(first, SIGKILL);
  CHECK(wait_exit(first) == -SIGKILL);
  REQUIRE(fs::exists(run / ".lock"));  // left behind, naming the killed run

  // The same user resumes: the lock of the killed run is taken over, with a note. (--epochs 1 so
  // that it ends at once: the checkpoint is at or near the end of the shorter run.)
  auto resume = args_for(run, "1");
  resume.push_back("--resume");
  CHECK(wait_exit(spawn_trainer(resume, tmp.path / "third.log")) == 0);
  const std::string third = towerflow::io::read_file(tmp.path / "third.log");
  INFO(third);
  CHECK_THAT(third, Catch::Contains("taking over the lock left by pid " + std::to_string(first)));
  CHECK_FALSE(fs::exists(run / ".lock"));  // a run that ends releases it

  // ... and after a run that ended cleanly, --resume has nothing to take over.
  CHECK(wait_exit(spawn_trainer(resume, tmp.path / "fourth.log")) == 0);
  const std::string fourth = towerflow::io::read_file(tmp.path / "fourth.log");
  INFO(fourth);
  CHECK_THAT(fourth, !Catch::Contains("taking over the lock"));
  CHECK_FALSE(fs::exists(run / ".lock"));
}
