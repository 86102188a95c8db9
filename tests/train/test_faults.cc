// Faults a run must survive: a checkpoint writer killed at random points, a full disk while
// saving, out of memory in one tower, a loader worker whose file turned bad, a signal.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <thread>

#include "core/error.h"
#include "core/platform/registry.h"
#include "data/image_codec.h"
#include "io/atomic_file.h"
#include "io/checkpoint_dir.h"
#include "train/fit_fixtures.h"

extern char** environ;

namespace tw = towerflow;
namespace fs = std::filesystem;
using namespace towerflow::train;
using namespace towerflow::train::testing;

namespace {

// Every file of the directory's entries, recursively: what a checkpoint directory holds.
std::vector<fs::path> temporaries_in(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (!tw::io::CheckpointDir::step_of(e.path())) out.push_back(e.path());
  return out;
}

// Lowers this process's file-size limit while alive (a full disk, as the writer sees it: write()
// fails with EFBIG once a file would pass the limit), and restores it.
struct FileSizeLimit {
  rlimit before{};
  struct sigaction old_xfsz {};
  explicit FileSizeLimit(rlim_t bytes) {
    getrlimit(RLIMIT_FSIZE, &before);
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigaction(SIGXFSZ, &ignore, &old_xfsz);  // else the kernel ends the process
    rlimit lim = before;
    lim.rlim_cur = bytes;
    REQUIRE(setrlimit(RLIMIT_FSIZE, &lim) == 0);
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &before);
    sigaction(SIGXFSZ, &old_xfsz, nullptr);
  }
};

}  // namespace

TEST_CASE("a checkpoint writer killed at random points never leaves a partial checkpoint", "[train][faults][kill]") {
  TempDir dir;
  std::mt19937 rng(12345);
  int killed_mid_save = 0;
  tw::io::CheckpointDir ckpts(dir.path);
  for (int round = 0; round < 25; ++round) {
    std::vector<char*> argv{const_cast<char*>(TW_CHECKPOINT_WRITER_BIN), const_cast<char*>(dir.path.c_str()), nullptr};
    const auto before = ckpts.latest();
    pid_t pid = -1;
    REQUIRE(posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) == 0);
    // Once it has written a checkpoint (each ~14 MB with fsyncs), kill it somewhere in the next ones.
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      auto now = ckpts.latest();
      if (now && (!before || now->step > before->step)) break;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(std::uniform_int_distribution<int>(0, 40000)(rng)));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    REQUIRE(WIFSIGNALED(status));
    if (!temporaries_in(dir.path).empty()) ++killed_mid_save;

    // What a resumed run would see: only whole checkpoints, the newest of them its start.
    auto all = ckpts.list();
    for (const auto& c : all) {
      INFO("round " << round << ": " << c.path);
      CHECK(read_checkpoint_info(c.path).position.step == c.step);
      CHECK_NOTHROW(tw::io::SafetensorsFile::load(c.path / kModelFile));
    }
    if (!all.empty()) CHECK(ckpts.latest()->step == all.back().step);
    ckpts.remove_stale();  // as a resumed run does
    CHECK(temporaries_in(dir.path).empty());
  }
  INFO("kills that landed inside a save: " << killed_mid_save);
  CHECK(killed_mid_save > 0);  // the test did exercise the writer mid-save
  CHECK_FALSE(ckpts.list().empty());
}

TEST_CASE("a full disk while saving: a clear error, the earlier checkpoints intact, or training goes on", "[train][faults][disk]") {
  fresh_devices();
  TempDir dir;
  FitOptions o = tiny(dir.path);
  o.save_every = 1;
  o.keep_checkpoints = 0;
  // The disk fills up after step 2's checkpoint and frees up again after step 5.
  std::unique_ptr<FileSizeLimit> full;
  LambdaHook disk;
  disk.step = [&](const StepInfo& s) {
    if (s.step == 3) full = std::make_unique<FileSizeLimit>(4096);
    if (s.step == 6) full.reset();
  };
  SECTION("stop (the default)") {
    Setup s;
    try {
      fit(s.trainer, s.sgd, s.train, nullptr, o, {&disk});
      FAIL("the run went on with a full disk");
    } catch (const tw::DataError& e) {
      full.reset();
      CHECK_THAT(std::string(e.what()), Catch::Contains("cannot write") && Catch::Contains("File too large") &&
                                            Catch::Contains(dir.path.string()));
    }
    CHECK(steps_in(dir.path) == std::vector<std::int64_t>{1, 2});
    CHECK(temporaries_in(dir.path).empty());  // no partial checkpoint
    CHECK(read_checkpoint_info(dir.path / "ckpt-0000000002").position.step == 2);
    CHECK_NOTHROW(tw::io::SafetensorsFile::load(dir.path / "ckpt-0000000002" / kModelFile));
  }
  SECTION("continue: logged, training goes on, later checkpoints are written") {
    o.checkpoint_errors = CheckpointErrors::Continue;
    Setup s;
    FitResult r = fit(s.trainer, s.sgd, s.train, nullptr, o, {&disk});
    CHECK(r.steps == 8);
    CHECK(steps_in(dir.path) == std::vector<std::int64_t>{1, 2, 6, 7, 8});
    CHECK(temporaries_in(dir.path).empty());
  }
}

TEST_CASE("out of memory in one tower mid-step leaves the model and the optimizer unchanged", "[train][faults][oom]") {
  tw::reset_backends_for_testing();
  tw::reset_devices_for_testing();
  // Only /cpu:1 is tight: the MLP's parameters, gradients and momentum fit in 2 MiB, a slice of 64
  // images (768 KiB of input alone, plus activations and their gradients) does not.
  tw::initialise_devices(tw::ProcessOptions{.memory_limit_mb = {{tw::Device::cpu(1), 2.0}}, .device_count = {{"CPU", 2}}});
  std::string message;
  {
    Setup s;
    FitOptions o = tiny({});
    o.max_steps = 2;
    fit(s.trainer, s.sgd, s.train, nullptr, o);  // batch 32: 16 rows a tower fit
    const auto params0 = params_of(s.trainer);
    const auto params1 = s.trainer.replica(1).flat_parameters().to_host();
    const auto state = s.sgd.state();
    o.batch = 128;
    try {
      fit(s.trainer, s.sgd, s.train, nullptr, o);
    } catch (const tw::OutOfMemory& e) {
      message = e.what();
    }
    CHECK(params_of(s.trainer) == params0);
    CHECK(s.trainer.replica(1).flat_parameters().to_host() == params1);
    const auto after = s.sgd.state();
    CHECK(after.step == state.step);
    REQUIRE(after.tensors.size() == state.tensors.size());
    for (std::size_t i = 0; i < state.tensors.size(); ++i) CHECK(after.tensors[i].values == state.tensors[i].values);
  }
  CHECK_THAT(message, Catch::Contains("/cpu:1") && Catch::Contains("allocators:") &&
                          Catch::Contains("a smaller global batch (FitOptions::batch = 64, now 128)"));
  CHECK_THAT(message, !Catch::Contains("allow_growth"));  // no GPU advice for CPU towers
  fresh_devices();
}

TEST_CASE("a file that turns bad after validation surfaces on the training thread with its path", "[train][faults][data]") {
  fresh_devices();
  TempDir dir;
  tw::data::Image img{.h = 32, .w = 32, .c = 3, .pixels = std::vector<std::uint8_t>(32 * 32 * 3, 128)};
  const auto png = tw::data::encode_png(img);
  for (int cls = 0; cls < 2; ++cls) {
    fs::create_directories(dir.path / "data" / ("class" + std::to_string(cls)));
    for (int i = 0; i < 32; ++i)
      tw::io::write_file_atomically(dir.path / "data" / ("class" + std::to_string(cls)) / (std::to_string(i) + ".png"),
                                    std::string(png.begin(), png.end()));
  }
  tw::data::ImageFolder folder(dir.path / "data");  // validated: every file decodes now
  const fs::path victim = dir.path / "data" / "class1" / "17.png";
  tw::io::write_file_atomically(victim, "not a png any more");
  Setup s;
  FitOptions o = tiny({});
  o.loader_threads = 2;  // the file is read on a worker thread
  CHECK_THROWS_WITH(fit(s.trainer, s.sgd, folder, nullptr, o), Catch::Contains(victim.string()));
}

TEST_CASE("StopOnSignal: a signal ends the run after the step with a checkpoint and no evaluation", "[train][faults][signal]") {
  fresh_devices();
  TempDir dir;
  Setup s;
  LambdaHook sender;
  sender.step = [](const StepInfo& i) {
    if (i.step == 3) std::raise(SIGTERM);
  };
  StopOnSignal signals;
  CHECK_THROWS_AS(StopOnSignal(), tw::InvalidArgument);  // one at a time
  Recorder rec;
  FitResult r = fit(s.trainer, s.sgd, s.train, &s.test, tiny(dir.path), {&sender, &signals, &rec});
  CHECK(signals.received() == SIGTERM);
  CHECK(r.steps == 3);
  CHECK(r.stopped_early);
  CHECK(r.stop_reason == "SIGTERM");
  CHECK(r.last_checkpoint == dir.path / "ckpt-0000000003");
  CHECK(r.test_examples == 0);  // no evaluation on the way out
  CHECK(std::find(rec.events.begin(), rec.events.end(), "eval:3") == rec.events.end());
}
