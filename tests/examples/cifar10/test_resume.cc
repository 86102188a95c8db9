// --resume as a user runs it: the run continues with the options it recorded, whatever the
// command line leaves out; flags given now override them and are listed; another model or data
// set is refused in plain words; --resume_from picks an older checkpoint (the newer ones kept
// aside); --init_from starts a new run from a checkpoint's weights.

#include <catch2/catch.hpp>

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "examples/cifar10/training.h"
#include "io/checkpoint_dir.h"
#include "io/model_state.h"
#include "models/models.h"
#include "tower/tower.h"
#include "train/checkpoint.h"
#include "training_test_util.h"

namespace tw = towerflow;
namespace fs = std::filesystem;
using namespace towerflow::cifar10;
using namespace towerflow::cifar10::testing;
using towerflow::train::kModelFile;
using towerflow::train::kStateFile;

namespace {

// A run whose every recorded option that matters differs from the defaults: the model, the data,
// the schedule, the seed, the length. A resume that took a default instead would train another
// model, on other data, or at another rate.
TrainOptions recorded_run(const fs::path& dir) {
  TrainOptions o = tiny_options(dir);
  o.model = "resnet20";
  o.builtin_train_size = 96;
  o.builtin_test_size = 32;
  o.lr = 0.03;
  o.momentum = 0.8;
  o.label_smoothing = 0.1;
  o.seed = 7;
  o.max_steps = 6;
  o.save_every = 2;
  o.keep_checkpoints = 0;
  return o;
}

// Runs `o`, stopping after `stop_after` steps when > 0.
FitResult run(const TrainOptions& o, int stop_after = 0, Output* out = nullptr,
              const std::optional<std::set<std::string>>& given = std::nullopt) {
  fresh_devices();
  Output own;
  Output& sink = out ? *out : own;
  Reporter reporter(sink.reporter_options());
  tw::train::LambdaHook stopper;
  stopper.step = [&](const tw::train::StepInfo& i) {
    if (stop_after > 0 && i.step == stop_after) stopper.stop_training("stopped by the test");
  };
  return run_training(o, {}, reporter, {&stopper}, given);
}

// What the command line gives when a user types only these flags.
TrainOptions typed(const fs::path& dir, bool resume = true) {
  TrainOptions o;
  o.train_dir = dir.string();
  o.resume = resume;
  return o;
}

}  // namespace

TEST_CASE("cifar10_train --resume continues the run with the options it recorded, bit for bit", "[cifar10][resume]") {
  TempDir whole, parts;
  FitResult full = run(recorded_run(whole.path));
  REQUIRE(full.steps == 6);
  REQUIRE(run(recorded_run(parts.path), 4).steps == 4);

  // `cifar10_train --train_dir DIR --resume`: every other option from the checkpoint.
  Output out;
  FitResult resumed = run(typed(parts.path), 0, &out, std::set<std::string>{"train_dir", "resume"});
  CHECK(resumed.steps == 6);
  CHECK(tensors_of(whole.path / "ckpt-0000000006" / kModelFile) == tensors_of(parts.path / "ckpt-0000000006" / kModelFile));
  CHECK(tensors_of(whole.path / "ckpt-0000000006" / kStateFile) == tensors_of(parts.path / "ckpt-0000000006" / kStateFile));
  CHECK_THAT(out.text(), Catch::Contains("resumed options") && Catch::Contains("as the run recorded them"));
  CHECK_THAT(out.text(), Catch::Contains("resnet20"));
}

TEST_CASE("cifar10_train --resume with flags given now: they win, and the start-up block lists each against the run's value",
          "[cifar10][resume]") {
  TempDir dir;
  REQUIRE(run(recorded_run(dir.path), 2).steps == 2);
  TrainOptions o = typed(dir.path);
  o.lr = 0.01;
  o.max_steps = 4;
  o.seed = 7;  // given, but the run's own value: not a change
  Output out;
  FitResult r = run(o, 0, &out, std::set<std::string>{"train_dir", "resume", "lr", "max_steps", "seed"});
  CHECK(r.steps == 4);
  CHECK_THAT(out.text(), Catch::Contains("lr 0.01 (the run's: 0.03)") && Catch::Contains("max_steps 4 (the run's: 6)"));
  CHECK_THAT(out.text(), !Catch::Contains("seed 7 (the run's"));
  // What the checkpoint records now is what the run continued with.
  const auto info = tw::train::read_checkpoint_info(r.last_checkpoint);
  CHECK_THAT(info.metadata.at("options"), Catch::Contains("\"lr\":0.01") && Catch::Contains("\"model\":\"resnet20\""));
}

TEST_CASE("cifar10_train --resume refuses another model, and another data set unless --resume_new_data", "[cifar10][resume]") {
  TempDir dir;
  REQUIRE(run(recorded_run(dir.path), 2).steps == 2);

  TrainOptions model = typed(dir.path);
  model.model = "tfcnn";
  CHECK_THROWS_WITH(run(model, 0, nullptr, std::set<std::string>{"train_dir", "resume", "model"}),
                    Catch::Contains("trains resnet20, and --model tfcnn cannot continue it") &&
                        Catch::Contains("Leave --model out"));

  TrainOptions data = typed(dir.path);
  data.builtin_train_size = 128;
  CHECK_THROWS_WITH(run(data, 0, nullptr, std::set<std::string>{"train_dir", "resume", "builtin_train_size"}),
                    Catch::Contains("trained on builtin, 96 training images, 10 classes") &&
                        Catch::Contains("the data given now is builtin, 128 training images") &&
                        Catch::Contains("--resume_new_data"));
  // Nothing was changed by the refusals: the run's checkpoint is still its newest.
  CHECK(steps_in(dir.path) == std::vector<std::int64_t>{2});

  data.resume_new_data = true;
  FitResult r = run(data, 0, nullptr, std::set<std::string>{"train_dir", "resume", "builtin_train_size", "resume_new_data"});
  CHECK(r.steps == 6);
}

TEST_CASE("cifar10_train --resume_from continues from an older checkpoint, the newer ones are kept aside, not replaced",
          "[cifar10][resume]") {
  TempDir whole, dir;
  REQUIRE(run(recorded_run(whole.path)).steps == 6);
  REQUIRE(run(recorded_run(dir.path)).steps == 6);
  const auto newest_before = tensors_of(dir.path / "ckpt-0000000006" / kModelFile);

  TrainOptions o = typed(dir.path, false);
  o.resume_from = "ckpt-2";
  FitResult r = run(o, 0, nullptr, std::set<std::string>{"train_dir", "resume_from"});
  CHECK(r.steps == 6);
  // The same run again from step 2: the same end.
  CHECK(tensors_of(dir.path / "ckpt-0000000006" / kModelFile) == tensors_of(whole.path / "ckpt-0000000006" / kModelFile));
  // The checkpoints of steps 4 and 6 that were there are in train_dir/earlier-*/, unchanged.
  std::vector<fs::path> aside;
  for (const auto& e : fs::directory_iterator(dir.path))
    if (e.path().filename().string().starts_with("earlier-")) aside.push_back(e.path());
  REQUIRE(aside.size() == 1);
  CHECK(fs::exists(aside[0] / "ckpt-0000000004" / kModelFile));
  CHECK(tensors_of(aside[0] / "ckpt-0000000006" / kModelFile) == newest_before);

  TrainOptions missing = typed(dir.path, false);
  missing.resume_from = "ckpt-9";
  CHECK_THROWS_AS(run(missing, 0, nullptr, std::set<std::string>{"train_dir", "resume_from"}), tw::NotFound);
  CHECK_THROWS_WITH(run(missing, 0, nullptr, std::set<std::string>{"train_dir", "resume_from"}),
                    Catch::Contains("--resume_from: no checkpoint of step 9") && Catch::Contains("ckpt-0000000006"));
  missing.resume_from = "latest";
  CHECK_THROWS_WITH(run(missing, 0, nullptr, std::set<std::string>{"train_dir", "resume_from"}),
                    Catch::Contains("\"latest\" names no step") && Catch::Contains("ckpt-200"));
}

TEST_CASE("cifar10_train --init_from starts a new run from a checkpoint's weights, it does not mix with --resume",
          "[cifar10][resume][init]") {
  TempDir source, fresh;
  FitResult done = run(recorded_run(source.path));
  TrainOptions o = recorded_run(fresh.path);
  o.init_from = source.path.string();  // a train_dir: its newest checkpoint
  o.max_steps = 2;
  std::vector<float> start_params;
  fresh_devices();
  Output out;
  Reporter reporter(out.reporter_options());
  tw::train::LambdaHook at_start;
  at_start.start = [&](const tw::train::StartInfo& s) {
    CHECK(s.position.step == 0);  // a new run
    start_params = s.trainer.model().flat_parameters().to_host();
  };
  FitResult r = run_training(o, {}, reporter, {&at_start});
  CHECK(r.steps == 2);
  // The new run started from the source's final weights.
  {
    // (Destroyed before the next run resets the devices its memory came from.)
    auto reference = tw::models::make_model("resnet20", tw::Device::cpu(0), {.num_classes = 10, .seed = 1});
    tw::io::load_module(*reference, done.last_checkpoint / kModelFile);
    CHECK(start_params == reference->flat_parameters().to_host());
  }
  CHECK_THAT(out.text(), Catch::Contains("initial weights") && Catch::Contains("ckpt-0000000006"));

  // A state_dict as PyTorch saves it: the model's tensors, and each batch norm's
  // num_batches_tracked (an I64 scalar towerflow does not keep), which are left out.
  TempDir torch;
  const fs::path state_dict = torch.path / "resnet20_state_dict.safetensors";
  std::vector<float> torch_params;
  {
    std::vector<tw::io::HostTensor> tensors = [&] {
      auto m = tw::models::make_model("resnet20", tw::Device::cpu(0), {.num_classes = 10, .seed = 5});
      torch_params = m->flat_parameters().to_host();
      return tw::io::module_state(*m);
    }();
    const std::vector<std::byte> zero(8);
    std::vector<tw::io::TensorView> views;
    for (const auto& t : tensors) views.push_back(t.view());
    views.push_back({"bn1.num_batches_tracked", tw::io::DType::I64, {}, zero});
    tw::io::save_safetensors(state_dict, views);
  }
  TempDir tuned;
  TrainOptions from_torch = recorded_run(tuned.path);
  from_torch.init_from = state_dict.string();
  from_torch.max_steps = 1;
  {
    fresh_devices();
    Output torch_out;
    Reporter torch_reporter(torch_out.reporter_options());
    tw::train::LambdaHook torch_start;
    torch_start.start = [&](const tw::train::StartInfo& s) { start_params = s.trainer.model().flat_parameters().to_host(); };
    CHECK(run_training(from_torch, {}, torch_reporter, {&torch_start}).steps == 1);
  }
  CHECK(start_params == torch_params);

  TrainOptions both = recorded_run(fresh.path);
  both.init_from = source.path.string();
  both.resume = true;
  CHECK_THROWS_WITH(run(both), Catch::Contains("--init_from starts a new run") && Catch::Contains("give one of them"));

  TrainOptions wrong = recorded_run(fresh.path);
  wrong.model = "tfcnn";
  wrong.init_from = source.path.string();
  wrong.start_over = "delete";
  CHECK_THROWS_AS(run(wrong), tw::DataError);
  CHECK_THROWS_WITH(run(wrong), Catch::Contains("--init_from ") && Catch::Contains("the model tfcnn"));
}
