// The real program, killed with SIGKILL mid-run and resumed: nothing corrupt is left behind, at
// most the steps since the last checkpoint are lost, and the resumed run ends where the
// uninterrupted one does, bit for bit.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "train/checkpoint.h"
#include "io/checkpoint_dir.h"
#include "training_test_util.h"

extern char** environ;

namespace tw = towerflow;
namespace fs = std::filesystem;
using namespace towerflow::cifar10;
using namespace towerflow::cifar10::testing;
using namespace towerflow::train;

namespace {

std::vector<std::string> args_for(const fs::path& train_dir) {
  return {"--builtin_train_size", "192", "--builtin_test_size", "32", "--batch_size", "32", "--epochs", "2",
          "--save_every", "2", "--keep_checkpoints", "3", "--loader_threads", "0", "--devices", "/cpu:0,/cpu:1",
          "--log_every", "1", "--seed", "3", "--json", "--train_dir", train_dir.string()};
}

// Changes one byte in the middle of tensor `index` (in data-buffer order) of a safetensors file;
// returns the tensor's name.
std::string damage_tensor(const fs::path& file, std::size_t index) {
  std::string bytes = tw::io::read_file(file);
  auto f = tw::io::SafetensorsFile::parse(bytes, file.string());
  const auto& e = f.entries().at(index % f.entries().size());
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  bytes[8 + n + e.begin + (e.end - e.begin) / 2] ^= 0x10;
  tw::io::write_file_atomically(file, bytes);
  return e.name;
}

}  // namespace

TEST_CASE("resume passes over damaged newest checkpoints, saying so, and finishes the same run", "[cifar10][checksum]") {
  TempDir full, damaged;
  REQUIRE(wait_exit(spawn_trainer(args_for(full.path / "run"), full.path / "log.txt")) == 0);
  tw::io::CheckpointDir dir(full.path / "run");
  auto kept = dir.list();  // steps 8, 10, 12 (--keep_checkpoints 3)
  REQUIRE(kept.size() == 3);
  const auto uninterrupted = tensors_of(kept.back().path / kModelFile);

  fs::path log = damaged.path / "log.txt";
  CHECK(wait_exit(spawn_trainer({"verify", dir.path().string()}, log, TW_CKPT_BIN)) == 0);
  CHECK_THAT(tw::io::read_file(log), Catch::Contains("3 checkpoint(s), 0 damaged"));

  // The two newest are damaged (one in its model, one in its optimizer state).
  const std::string in_model = damage_tensor(kept[2].path / kModelFile, 3);
  damage_tensor(kept[1].path / kStateFile, 0);
  CHECK(wait_exit(spawn_trainer({"verify", kept[2].path.string()}, log, TW_CKPT_BIN)) == 1);
  CHECK(wait_exit(spawn_trainer({"verify", (kept[0].path / kModelFile).string()}, log, TW_CKPT_BIN)) == 0);
  CHECK(wait_exit(spawn_trainer({"verify", dir.path().string()}, log, TW_CKPT_BIN)) == 1);
  CHECK(wait_exit(spawn_trainer({"info", kept[0].path.string()}, log, TW_CKPT_BIN)) == 0);
  std::string text = tw::io::read_file(log);
  CHECK_THAT(text, Catch::Contains("DAMAGED: corrupt safetensors file " + (kept[2].path / kModelFile).string()) &&
                       Catch::Contains(in_model) && Catch::Contains("3 checkpoint(s), 2 damaged") &&
                       Catch::Contains("checkpoint " + kept[0].path.string() + ": step 8") &&
                       Catch::Contains("crc32c "));

  auto resume = args_for(full.path / "run");
  resume.push_back("--resume");
  fs::path resume_log = damaged.path / "resume.txt";
  REQUIRE(wait_exit(spawn_trainer(resume, resume_log)) == 0);
  text = tw::io::read_file(resume_log);
  CHECK_THAT(text, Catch::Contains("passing over a damaged checkpoint") && Catch::Contains(kept[2].path.string()) &&
                       Catch::Contains(kept[1].path.string()) && Catch::Contains(in_model) &&
                       Catch::Contains("resuming from " + kept[0].path.string() + " (step 8)"));
  // Steps 9..12 again: the damaged checkpoints are replaced by the ones an uninterrupted run wrote.
  CHECK(wait_exit(spawn_trainer({"verify", dir.path().string()}, log, TW_CKPT_BIN)) == 0);
  CHECK(tensors_of(dir.latest()->path / kModelFile) == uninterrupted);

  // Every checkpoint damaged: a clear error, not a new run over them.
  for (const auto& c : dir.list()) damage_tensor(c.path / kModelFile, 0);
  fs::path none_log = damaged.path / "none.txt";
  CHECK(wait_exit(spawn_trainer(resume, none_log)) != 0);
  CHECK_THAT(tw::io::read_file(none_log), Catch::Contains("every checkpoint in " + dir.path().string() + " is damaged"));
  CHECK(dir.list().size() == 3);  // nothing moved or deleted
}

TEST_CASE("SIGKILL mid-run leaves only whole checkpoints, and --resume finishes the same run", "[cifar10][kill]") {
  TempDir full, killed;
  fs::path log = full.path / "log.txt";
  REQUIRE(wait_exit(spawn_trainer(args_for(full.path / "run"), log)) == 0);

  pid_t pid = spawn_trainer(args_for(killed.path / "run"), killed.path / "log.txt");
  tw::io::CheckpointDir dir(killed.path / "run");
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    auto latest = dir.latest();
    if (latest && latest->step >= 4) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ::kill(pid, SIGKILL);
  REQUIRE(wait_exit(pid) == -SIGKILL);

  auto left = dir.list();
  REQUIRE_FALSE(left.empty());
  CHECK(left.back().step < 12);  // it was killed before the end
  for (const auto& c : left) {    // every checkpoint there is whole
    INFO(c.path);
    CHECK_NOTHROW(tw::io::SafetensorsFile::load(c.path / kModelFile));
    CHECK(read_checkpoint_info(c.path).position.step == c.step);
  }

  auto resume = args_for(killed.path / "run");
  resume.push_back("--resume");
  REQUIRE(wait_exit(spawn_trainer(resume, killed.path / "log.txt")) == 0);
  CHECK(dir.latest()->step == 12);
  for (const char* file : {kModelFile, kStateFile}) {
    INFO(file);
    CHECK(tensors_of(full.path / "run" / "ckpt-0000000012" / file) == tensors_of(dir.latest()->path / file));
  }
}

TEST_CASE("SIGINT and SIGTERM finish the step, write a checkpoint and exit 128+N, --resume finishes the same run", "[cifar10][signal]") {
  TempDir full, stopped;
  REQUIRE(wait_exit(spawn_trainer(args_for(full.path / "run"), full.path / "log.txt")) == 0);

  for (int sig : {SIGINT, SIGTERM}) {
    INFO("signal " << sig);
    fs::path run = stopped.path / ("run" + std::to_string(sig));
    fs::path log = stopped.path / ("log" + std::to_string(sig) + ".txt");
    auto args = args_for(run);
    args.push_back("--save_every");  // no periodic checkpoints: the one after the signal is the signal's
    args.push_back("0");
    pid_t pid = spawn_trainer(args, log);
    // Wait for the third training record, then signal.
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      std::string text = tw::io::read_file(log);
      if (std::count(text.begin(), text.end(), '\n') >= 4 && text.find("\"step\":3") != std::string::npos) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ::kill(pid, sig);
    REQUIRE(wait_exit(pid) == 128 + sig);
    tw::io::CheckpointDir dir(run);
    REQUIRE(dir.list().size() == 1);
    const auto ckpt = *dir.latest();
    CHECK(ckpt.step < 12);
    CHECK(read_checkpoint_info(ckpt.path).position.step == ckpt.step);
    const std::string text = tw::io::read_file(log);
    CHECK_THAT(text, Catch::Contains("stopped by SIG") && Catch::Contains(ckpt.path.string()) &&
                         Catch::Contains("continue with --resume"));
    CHECK_THAT(text, !Catch::Contains("test_acc"));  // no evaluation on the way out

    args.push_back("--resume");
    REQUIRE(wait_exit(spawn_trainer(args, log)) == 0);
    for (const char* file : {kModelFile, kStateFile}) {
      INFO(file);
      CHECK(tensors_of(full.path / "run" / "ckpt-0000000012" / file) == tensors_of(dir.latest()->path / file));
    }
  }
}

TEST_CASE("bad flags exit with status 2 and CLI11's message, --help exits 0", "[cifar10][flags]") {
  TempDir dir;
  fs::path log = dir.path / "log.txt";
  CHECK(wait_exit(spawn_trainer({"--no_such_flag"}, log)) == 2);
  CHECK(wait_exit(spawn_trainer({"--epochs"}, log)) == 2);         // a value missing
  CHECK(wait_exit(spawn_trainer({"--epochs", "x"}, log)) == 2);    // a value that does not parse
  CHECK(wait_exit(spawn_trainer({"--epochs", "1", "extra"}, log)) == 2);  // a stray argument
  CHECK(wait_exit(spawn_trainer({"--help"}, log)) == 0);
  const std::string text = tw::io::read_file(log);
  CHECK_THAT(text, Catch::Contains("--no_such_flag") && Catch::Contains("--epochs"));
}

TEST_CASE("a misspelled flag gets the nearest one, --batch-size is --batch_size, a switch's value needs '='",
          "[cifar10][flags]") {
  TempDir dir;
  const fs::path typo = dir.path / "typo.txt", switch_log = dir.path / "switch.txt", dashed = dir.path / "dashed.txt";
  CHECK(wait_exit(spawn_trainer({"--batchsize", "64"}, typo)) == 2);
  CHECK_THAT(tw::io::read_file(typo), Catch::Contains("--batchsize: no such flag; did you mean --batch_size?"));
  CHECK(wait_exit(spawn_trainer({"--resume", "false"}, switch_log)) == 2);
  CHECK_THAT(tw::io::read_file(switch_log),
             Catch::Contains("--resume is a switch and takes no value after a space; write --resume=false"));
  CHECK(wait_exit(spawn_trainer({"--batch-size", "16", "--max-steps=1", "--builtin_train_size", "64",
                                 "--builtin_test_size", "16", "--eval_every", "0", "--tensorboard=false",
                                 "--train_dir", (dir.path / "run").string(), "--progress", "json"},
                                dashed)) == 0);
  const std::string run = tw::io::read_file(dashed);
  CHECK_THAT(run, Catch::Contains("\"steps\":1"));
  CHECK_THAT(run, Catch::Contains("\"batch\":\"16 global"));
}
