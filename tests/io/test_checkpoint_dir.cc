#include <catch2/catch.hpp>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/checkpoint_dir.h"
#include "io_test_util.h"

namespace tw = towerflow;
namespace fs = std::filesystem;
using namespace towerflow::io;
using towerflow::io::testing::TempDir;

namespace {
std::vector<std::int64_t> steps(const CheckpointDir& d) {
  std::vector<std::int64_t> out;
  for (const auto& c : d.list()) out.push_back(c.step);
  return out;
}
}  // namespace

TEST_CASE("checkpoint names encode the step and sort by it", "[io][checkpoint]") {
  CHECK(CheckpointDir::name_for_step(1200) == "ckpt-0000001200");
  CHECK(CheckpointDir::step_of("ckpt-0000001200") == 1200);
  CHECK(CheckpointDir::step_of("/a/b/ckpt-12345678901") == 12345678901);
  CHECK_FALSE(CheckpointDir::step_of("ckpt-12x"));
  CHECK_FALSE(CheckpointDir::step_of("ckpt-"));
  CHECK_FALSE(CheckpointDir::step_of("model.safetensors"));
  CHECK_FALSE(CheckpointDir::step_of(temporary_path_for("ckpt-0000000005")));
}

TEST_CASE("save writes every file, latest finds the newest, and only the last N are kept", "[io][checkpoint]") {
  TempDir tmp;
  CheckpointDir dir(tmp / "run");
  CHECK_FALSE(dir.latest());
  for (std::int64_t step : {100, 200, 900, 1000, 50})
    dir.save(step, {{"model.safetensors", "m" + std::to_string(step)}, {"state.json", "s"}}, 3);
  // Keep-last-N keeps the newest steps (1000, 900, 200) plus the one just written (50)?
  // No: the newest three by step are kept, whatever the order of saving.
  CHECK(steps(dir) == std::vector<std::int64_t>{200, 900, 1000});
  REQUIRE(dir.latest());
  CHECK(dir.latest()->step == 1000);
  CHECK(read_file(dir.latest()->path / "model.safetensors") == "m1000");
  CHECK(read_file(dir.latest()->path / "state.json") == "s");

  dir.save(1100, {{"model.safetensors", "x"}}, 0);  // keep <= 0 keeps everything
  CHECK(steps(dir) == std::vector<std::int64_t>{200, 900, 1000, 1100});
  CHECK(dir.prune(1) == 3);
  CHECK(steps(dir) == std::vector<std::int64_t>{1100});
}

TEST_CASE("saving an existing step replaces it whole", "[io][checkpoint]") {
  TempDir tmp;
  CheckpointDir dir(tmp.path);
  dir.save(7, {{"a", "old"}, {"b", "old"}}, 5);
  dir.save(7, {{"a", "new"}}, 5);
  REQUIRE(dir.list().size() == 1);
  CHECK(read_file(tmp / "ckpt-0000000007" / "a") == "new");
  CHECK_FALSE(fs::exists(tmp / "ckpt-0000000007" / "b"));
  CHECK(std::distance(fs::directory_iterator(tmp.path), fs::directory_iterator()) == 1);
}

TEST_CASE("an interrupted save is invisible to latest and removed by remove_stale", "[io][checkpoint]") {
  TempDir tmp;
  CheckpointDir dir(tmp.path);
  dir.save(10, {{"model.safetensors", "good"}}, 0);
  fs::path partial = temporary_path_for(tmp / CheckpointDir::name_for_step(20));
  fs::create_directories(partial);
  write_file_atomically(partial / "model.safetensors", "half");
  CHECK(dir.latest()->step == 10);
  CHECK(dir.remove_stale() == 1);
  CHECK_FALSE(fs::exists(partial));
  CHECK(steps(dir) == std::vector<std::int64_t>{10});
}

TEST_CASE("a checkpoint directory that cannot be created is a DataError naming it", "[io][checkpoint]") {
  TempDir tmp;
  write_file_atomically(tmp / "file", "x");
  CHECK_THROWS_WITH(CheckpointDir(tmp / "file"), Catch::Contains((tmp / "file").string()) && Catch::Contains("FitOptions::train_dir"));
}
