#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io_test_util.h"

namespace tw = towerflow;
namespace fs = std::filesystem;
using namespace towerflow::io;
using towerflow::io::testing::TempDir;

namespace {
int count_entries(const fs::path& dir) {
  int n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++n;
  return n;
}
}  // namespace

TEST_CASE("an atomic write creates, then replaces, the whole file and leaves nothing else", "[io][atomic]") {
  TempDir dir;
  write_file_atomically(dir / "f", "first");
  CHECK(read_file(dir / "f") == "first");
  write_file_atomically(dir / "f", "second, longer");
  CHECK(read_file(dir / "f") == "second, longer");
  write_file_atomically(dir / "f", "");
  CHECK(read_file(dir / "f").empty());
  CHECK(count_entries(dir.path) == 1);
}

TEST_CASE("a failed atomic write keeps the old content and removes its temporary", "[io][atomic]") {
  TempDir dir;
  fs::create_directories(dir / "target" / "child");  // rename over a non-empty directory fails
  CHECK_THROWS_WITH(write_file_atomically(dir / "target", "x"),
                    Catch::Contains((dir / "target").string()) && Catch::Contains("rename"));
  CHECK(fs::is_directory(dir / "target" / "child"));
  CHECK(count_entries(dir.path) == 1);

  CHECK_THROWS_AS(write_file_atomically(dir / "missing" / "f", "x"), tw::DataError);
  CHECK_THROWS_AS(read_file(dir / "nothing"), tw::NotFound);
}

TEST_CASE("SIGKILL in the middle of atomic writes never leaves a partial file", "[io][atomic]") {
  TempDir dir;
  const fs::path target = dir / "model.safetensors";
  const std::size_t size = 4 << 20;
  const std::string a(size, 'a'), b(size, 'b');
  for (int round = 0; round < 4; ++round) {
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      for (int i = 0;; ++i) write_file_atomically(target, (i % 2) ? b : a);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(15 + 20 * round));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    REQUIRE(WIFSIGNALED(status));
    if (fs::exists(target)) {
      std::string content = read_file(target);
      REQUIRE(content.size() == size);
      CHECK((content == a || content == b));
    }
    // Whatever the child was writing is a recognisable temporary, and goes.
    remove_stale_temporaries(dir.path);
    for (const auto& e : fs::directory_iterator(dir.path)) CHECK(e.path() == target);
  }
}

TEST_CASE("stale temporaries are recognised by name and removed, nothing else", "[io][atomic]") {
  TempDir dir;
  write_file_atomically(dir / "keep.json", "{}");
  fs::path t1 = temporary_path_for(dir / "keep.json");
  fs::path t2 = temporary_path_for(dir / "ckpt-0000000010");
  CHECK(t1 != temporary_path_for(dir / "keep.json"));
  write_file_atomically(t1, "partial");
  fs::create_directories(t2 / "inner");
  CHECK(is_temporary_name(t1));
  CHECK_FALSE(is_temporary_name(dir / "keep.json"));
  CHECK(remove_stale_temporaries(dir.path) == 2);
  CHECK(count_entries(dir.path) == 1);
  CHECK(remove_stale_temporaries(dir / "absent") == 0);
}

TEST_CASE("LineAppender appends whole lines and keeps what was there", "[io][atomic]") {
  TempDir dir;
  write_file_atomically(dir / "metrics.jsonl", "{\"step\": 1}\n");
  {
    LineAppender log(dir / "metrics.jsonl");
    log.append("{\"step\": 2}");
    LineAppender second(dir / "metrics.jsonl");
    second.append("{\"step\": 3}");
    log.append("{\"step\": 4}");
  }
  CHECK(read_file(dir / "metrics.jsonl") == "{\"step\": 1}\n{\"step\": 2}\n{\"step\": 3}\n{\"step\": 4}\n");
  CHECK_THROWS_AS(LineAppender(dir / "no" / "such.jsonl"), tw::DataError);
}
