#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <map>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/collectives/communicator.h"
#include "core/error.h"
#include "core/nn/init.h"
#include "core/nn/layers.h"
#include "core/tensor/ops.h"
#include "data/data.h"
#include "io/io.h"
#include "models/models.h"
#include "optim/optim.h"
#include "tower/tower.h"
#include "train/fit_fixtures.h"
#include "train/train.h"

namespace tw = towerflow;
namespace fs = std::filesystem;
using namespace towerflow::train;
using namespace towerflow::train::testing;


TEST_CASE("fit trains a model of the program's own on two towers, calling every hook in order", "[train][fit]") {
  fresh_devices();
  TempDir dir;
  Recorder rec;
  MetricsFile metrics(dir.path / "metrics.jsonl");
  {
    Setup s;
    auto before = params_of(s.trainer);
    FitResult r = fit(s.trainer, s.sgd, s.train, &s.test, tiny(dir.path), {&rec, &metrics});
    CHECK(r.steps == 8);
    CHECK_FALSE(r.stopped_early);
    CHECK(r.test_examples == 64);
    CHECK(std::isfinite(r.test_loss));
    CHECK(r.last_checkpoint == dir.path / "ckpt-0000000008");
    CHECK(params_of(s.trainer) != before);
    // The replicas stayed identical (all-reduce), and the checkpoint holds the trained model.
    CHECK(s.trainer.replica(1).flat_parameters().to_host() == params_of(s.trainer));
    auto saved = tensors_of(r.last_checkpoint / kModelFile);
    CHECK(saved.count("fc1.weight") == 1);
    CHECK(saved.count("fc2.bias") == 1);
  }
  const std::vector<std::string> expected{
      "start:0", "step:1", "step:2", "log:2", "step:3", "ckpt:3", "step:4", "log:4", "epoch_end:0", "eval:4",
      "step:5", "step:6", "log:6", "ckpt:6", "step:7", "step:8", "log:8", "epoch_end:1", "eval:8", "ckpt:8", "end:8"};
  CHECK(rec.events == expected);
  CHECK(steps_in(dir.path) == std::vector<std::int64_t>{6, 8});
  auto lines = jsonl(dir.path / "metrics.jsonl");
  REQUIRE(lines.size() == 6);  // 4 training records, 2 evaluations
  CHECK(lines[0]["step"] == 2);
  CHECK(lines[2].contains("test_acc"));
  CHECK(lines[5]["examples"] == 64);
}

TEST_CASE("the schedule factory gets the run's plan, plan() refuses a batch larger than the data", "[train][fit]") {
  fresh_devices();
  TempDir dir;
  {
    Setup s;
    FitOptions o = tiny(dir.path);
    o.schedule = schedule("cosine", 0.1, 1.0);  // one warm-up epoch: 4 steps
    std::vector<double> lrs;
    LambdaHook h;
    h.step = [&](const StepInfo& i) { lrs.push_back(i.lr); };
    fit(s.trainer, s.sgd, s.train, nullptr, o, {&h});
    auto expected = tw::optim::warmup_schedule(tw::optim::cosine_schedule(0.1, 8), 4);
    REQUIRE(lrs.size() == 8);
    for (int i = 0; i < 8; ++i) CHECK(lrs[i] == Approx(expected(i)));

    Plan p = plan(s.train, o);
    CHECK(p.steps_per_epoch == 4);
    CHECK(p.total_steps == 8);
    CHECK(p.epochs == 2);
    o.max_steps = 5;
    CHECK(plan(s.train, o).epochs == 2);
    o.batch = 129;
    CHECK_THROWS_WITH(plan(s.train, o), Catch::Contains("FitOptions::batch = 129") && Catch::Contains("128 images") &&
                                                   Catch::Contains("use FitOptions::batch = 128 or less"));
    o.batch = 32;
    o.train_dir.clear();
    o.resume = true;
    CHECK_THROWS_AS(fit(s.trainer, s.sgd, s.train, nullptr, o), tw::InvalidArgument);
  }
}

TEST_CASE("a validation set is evaluated during training and the test set once, at the end", "[train][fit][validation]") {
  std::vector<std::string> evals;
  std::vector<EvalRecord> records;
  LambdaHook h;
  h.eval = [&](const EvalRecord& r) {
    evals.push_back(tw::str(metric_prefix(r.set), ":", r.step, ":", r.examples));
    records.push_back(r);
  };
  fresh_devices();
  TempDir dir, dir2;
  {
  Setup s;
  auto [train, val] = tw::data::holdout(s.train, 0.25, 3);  // 98 and 30 images (a quarter of each class): 3 steps an epoch
  FitOptions o = tiny(dir.path);
  o.validation_set = val.get();
  h.start = [&](const StartInfo& i) { CHECK(i.validation_set == val.get()); };
  MetricsFile metrics(dir.path / "metrics.jsonl");
  FitResult r = fit(s.trainer, s.sgd, *train, &s.test, o, {&h, &metrics});
  CHECK(evals == std::vector<std::string>{"val:3:30", "val:6:30", "test:6:64"});
  CHECK(r.val_examples == 30);
  CHECK(r.test_examples == 64);
  CHECK(r.val_acc == records[1].test_acc);
  CHECK(r.test_acc == records[2].test_acc);
  // The same numbers as evaluating the sets on their own, after the run.
  CHECK(evaluate(s.trainer, *val, 32, 0).loss == Approx(r.val_loss).epsilon(1e-6));
  CHECK(evaluate(s.trainer, s.test, 32, 0).loss == Approx(r.test_loss).epsilon(1e-6));
  auto lines = jsonl(dir.path / "metrics.jsonl");
  std::vector<std::string> eval_keys;
  for (const auto& l : lines)
    if (l.contains("examples")) eval_keys.push_back(l.contains("val_acc") ? "val" : l.contains("test_acc") ? "test" : "?");
  CHECK(eval_keys == std::vector<std::string>{"val", "val", "test"});

  }
  // A hook that stops the run after a validation still gets the test set's evaluation.
  fresh_devices();
  Setup s;
  auto [train, val] = tw::data::holdout(s.train, 0.25, 3);
  FitOptions o = tiny(dir2.path);
  o.validation_set = val.get();
  evals.clear();
  h.start = nullptr;
  LambdaHook stopper;
  stopper.eval = [&](const EvalRecord& e) {
    if (e.set == EvalSet::Validation) stopper.stop_training("validation seen");
  };
  FitResult r = fit(s.trainer, s.sgd, *train, &s.test, o, {&h, &stopper});
  CHECK(r.stopped_early);
  CHECK(evals == std::vector<std::string>{"val:3:30", "test:3:64"});
}

TEST_CASE("a hook stops the run early: final evaluation and checkpoint, and resuming finishes it bit for bit", "[train][fit][resume]") {
  fresh_devices();
  TempDir full_dir, stop_dir;
  {
    Setup s;
    fit(s.trainer, s.sgd, s.train, &s.test, tiny(full_dir.path));
  }
  {
    Setup s;
    LambdaHook stopper;
    stopper.step = [&](const StepInfo& i) {
      if (i.step == 5) stopper.stop_training("enough for now");
    };
    Recorder rec;
    FitResult r = fit(s.trainer, s.sgd, s.train, &s.test, tiny(stop_dir.path), {&stopper, &rec});
    CHECK(r.steps == 5);
    CHECK(r.stopped_early);
    CHECK(r.stop_reason == "enough for now");
    CHECK(r.last_checkpoint == stop_dir.path / "ckpt-0000000005");
    const std::vector<std::string> tail{"step:5", "log:5", "epoch_end:1", "eval:5", "ckpt:5", "end:5"};
    CHECK(std::vector<std::string>(rec.events.end() - 6, rec.events.end()) == tail);
    stopper.stop_training("outside fit: nothing happens");
  }
  {
    Setup s;
    FitOptions o = tiny(stop_dir.path);
    o.resume = true;
    Recorder rec;
    FitResult r = fit(s.trainer, s.sgd, s.train, &s.test, o, {&rec});
    CHECK(r.steps == 8);
    CHECK(rec.events.front() == "start:5");
    CHECK(rec.events[1] == "step:6");
  }
  CHECK(tensors_of(full_dir.path / "ckpt-0000000008" / kModelFile) ==
        tensors_of(stop_dir.path / "ckpt-0000000008" / kModelFile));
  CHECK(tensors_of(full_dir.path / "ckpt-0000000008" / kStateFile) ==
        tensors_of(stop_dir.path / "ckpt-0000000008" / kStateFile));
}

TEST_CASE("resuming after a crash reproduces the uninterrupted run bit for bit", "[train][fit][resume]") {
  // In fp32, bf16 and fp16 (they change the arithmetic of the products, not what a checkpoint
  // holds; fp16's loss scale, which grows every 2 good steps here, is restored from the checkpoint).
  const tw::Precision precision = GENERATE(tw::Precision::Fp32, tw::Precision::Bf16, tw::Precision::Fp16);
  INFO("precision " << tw::to_string(precision));
  const tw::tower::TrainerOptions options{.precision = precision, .loss_scale = {.initial_scale = 1024, .growth_interval = 2}};
  std::optional<tw::tower::LossScaleState> full_scale;
  fresh_devices();
  TempDir full_dir, crash_dir;
  struct Crash {};
  {
    Setup s(tw::models::factory("tfcnn", {.seed = 1}), 0.02, options);
    MetricsFile metrics(full_dir.path / "metrics.jsonl");
    fit(s.trainer, s.sgd, s.train, &s.test, tiny(full_dir.path), {&metrics});
    if (auto* ls = s.trainer.loss_scaler()) full_scale = ls->state();
  }
  {
    Setup s(tw::models::factory("tfcnn", {.seed = 1}), 0.02, options);
    MetricsFile metrics(crash_dir.path / "metrics.jsonl");
    LambdaHook crash;
    crash.step = [](const StepInfo& i) {
      if (i.step == 5) throw Crash{};
    };
    CHECK_THROWS_AS(fit(s.trainer, s.sgd, s.train, &s.test, tiny(crash_dir.path), {&metrics, &crash}), Crash);
  }
  CHECK(steps_in(crash_dir.path) == std::vector<std::int64_t>{3});  // the steps since 3 are lost
  {
    // A fresh trainer whose model starts elsewhere: everything comes from the checkpoint.
    Setup s(tw::models::factory("tfcnn", {.seed = 2}), 0.02, options);
    MetricsFile metrics(crash_dir.path / "metrics.jsonl");
    FitOptions o = tiny(crash_dir.path);
    o.resume = true;
    FitResult r = fit(s.trainer, s.sgd, s.train, &s.test, o, {&metrics});
    CHECK(r.steps == 8);
    CHECK((s.trainer.loss_scaler() != nullptr) == (precision == tw::Precision::Fp16));
    if (auto* ls = s.trainer.loss_scaler()) {
      REQUIRE(full_scale);
      CHECK(full_scale->scale > 1024);  // it grew: the comparison means something
      CHECK(ls->state().scale == full_scale->scale);
      CHECK(ls->state().good_steps == full_scale->good_steps);
      CHECK(ls->state().skipped_steps == full_scale->skipped_steps);
    }
  }
  auto a = tensors_of(full_dir.path / "ckpt-0000000008" / kModelFile);
  auto b = tensors_of(crash_dir.path / "ckpt-0000000008" / kModelFile);
  REQUIRE(a.size() == b.size());
  for (const auto& [name, bytes] : a) {
    INFO(name);
    CHECK(b.at(name) == bytes);
  }
  CHECK(tensors_of(full_dir.path / "ckpt-0000000008" / kStateFile) ==
        tensors_of(crash_dir.path / "ckpt-0000000008" / kStateFile));

  // metrics.jsonl reads as one run: the crashed run's records after step 3 were dropped, and the
  // records are the uninterrupted run's (the same batches on the same parameters).
  auto full_metrics = jsonl(full_dir.path / "metrics.jsonl");
  auto resumed_metrics = jsonl(crash_dir.path / "metrics.jsonl");
  REQUIRE(full_metrics.size() == resumed_metrics.size());
  for (std::size_t i = 0; i < full_metrics.size(); ++i) {
    CHECK(full_metrics[i]["step"] == resumed_metrics[i]["step"]);
    CHECK(full_metrics[i].contains("test_acc") == resumed_metrics[i].contains("test_acc"));
    if (full_metrics[i].contains("test_acc")) CHECK(full_metrics[i]["test_loss"] == resumed_metrics[i]["test_loss"]);
    // The first record after the checkpoint (step 4) averages only the steps since it (4, not 3-4).
    if (full_metrics[i].contains("loss") && full_metrics[i]["step"] > 4)
      CHECK(full_metrics[i]["loss"] == resumed_metrics[i]["loss"]);
  }
}

TEST_CASE("a new run never silently empties a train_dir that holds an earlier run", "[train][fit][start_over]") {
  fresh_devices();
  TempDir dir;
  auto earlier_run = [&] {
    Setup s;
    MetricsFile metrics(dir.path / "metrics.jsonl");
    FitOptions o = tiny(dir.path);
    o.epochs = 1;
    o.save_every = 1;
    o.keep_checkpoints = 0;
    o.start_over = StartOver::Delete;
    fit(s.trainer, s.sgd, s.train, &s.test, o, {&metrics});
  };
  earlier_run();
  REQUIRE(steps_in(dir.path) == std::vector<std::int64_t>{1, 2, 3, 4});
  const auto ckpt4 = tensors_of(dir.path / "ckpt-0000000004" / kModelFile);
  const std::string metrics_before = tw::io::read_file(dir.path / "metrics.jsonl");

  Setup s;
  MetricsFile metrics(dir.path / "metrics.jsonl");
  FitOptions o = tiny(dir.path);
  o.epochs = 1;
  o.save_every = 0;
  SECTION("refused by default: nothing is touched, and the error says what is there") {
    Recorder rec;
    try {
      fit(s.trainer, s.sgd, s.train, &s.test, o, {&metrics, &rec});
      FAIL("the run started");
    } catch (const TrainDirInUse& e) {
      CHECK_THAT(std::string(e.what()), Catch::Contains("4 checkpoints (the latest ckpt-0000000004, step 4, written 20") &&
                                            Catch::Contains("and metrics.jsonl") && Catch::Contains("nothing was changed"));
      CHECK(e.dir == dir.path);
    }
    CHECK(rec.events.empty());  // not even on_start
    CHECK(steps_in(dir.path) == std::vector<std::int64_t>{1, 2, 3, 4});
    CHECK(tensors_of(dir.path / "ckpt-0000000004" / kModelFile) == ckpt4);
    CHECK(tw::io::read_file(dir.path / "metrics.jsonl") == metrics_before);
  }
  SECTION("moved aside when asked: the earlier run's files are kept whole under earlier-<time>/") {
    o.start_over = StartOver::MoveAside;
    fs::path moved;
    LambdaHook h;
    h.start = [&](const StartInfo& i) { moved = i.moved_aside; };
    fit(s.trainer, s.sgd, s.train, &s.test, o, {&metrics, &h});
    REQUIRE_FALSE(moved.empty());
    CHECK(moved.parent_path() == dir.path);
    CHECK_THAT(moved.filename().string(), Catch::StartsWith("earlier-20"));
    CHECK(steps_in(moved) == std::vector<std::int64_t>{1, 2, 3, 4});
    CHECK(tensors_of(moved / "ckpt-0000000004" / kModelFile) == ckpt4);
    CHECK(tw::io::read_file(moved / "metrics.jsonl") == metrics_before);
    CHECK(steps_in(dir.path) == std::vector<std::int64_t>{4});  // the new run's
    CHECK(jsonl(dir.path / "metrics.jsonl").size() == 3);         // 2 training lines, 1 evaluation
  }
  SECTION("deleted when asked") {
    o.start_over = StartOver::Delete;
    int removed = -1;
    LambdaHook h;
    h.start = [&](const StartInfo& i) { removed = i.removed_files; };
    fit(s.trainer, s.sgd, s.train, &s.test, o, {&metrics, &h});
    CHECK(removed == 5);  // 4 checkpoints and metrics.jsonl
    CHECK(steps_in(dir.path) == std::vector<std::int64_t>{4});
    CHECK(jsonl(dir.path / "metrics.jsonl").size() == 3);
  }
}

TEST_CASE("checkpoint rotation deletes only checkpoints of the running run", "[train][fit][start_over]") {
  fresh_devices();
  TempDir dir, other;
  {
    Setup s;
    FitOptions o = tiny(other.path);
    o.max_steps = 1;
    fit(s.trainer, s.sgd, s.train, nullptr, o);
  }
  // This run's checkpoints at steps 1 and 2; its step 1 replaced by another run's, copied in. The
  // run resumes from its own step 2 and keeps its newest 2 while it goes on.
  {
    Setup s;
    FitOptions o = tiny(dir.path);
    o.max_steps = 2;
    o.save_every = 1;
    fit(s.trainer, s.sgd, s.train, nullptr, o);
  }
  fs::remove_all(dir.path / "ckpt-0000000001");
  fs::copy(other.path / "ckpt-0000000001", dir.path / "ckpt-0000000001", fs::copy_options::recursive);
  const auto foreign = tensors_of(dir.path / "ckpt-0000000001" / kModelFile);
  {
    Setup s;
    FitOptions o = tiny(dir.path);
    o.resume = true;
    o.save_every = 1;
    o.keep_checkpoints = 2;
    FitResult r = fit(s.trainer, s.sgd, s.train, nullptr, o);
    CHECK(r.steps == 8);
  }
  CHECK(steps_in(dir.path) == std::vector<std::int64_t>{1, 7, 8});  // the foreign one stays
  CHECK(tensors_of(dir.path / "ckpt-0000000001" / kModelFile) == foreign);
}

TEST_CASE("a non-finite loss stops training and keeps the last good checkpoint", "[train][fit][nan]") {
  fresh_devices();
  TempDir dir;
  std::string message;
  {
    Setup s(tw::models::factory("tfcnn", {.seed = 1}), 1e6);  // diverges within a few steps
    FitOptions o = tiny(dir.path);
    o.schedule = {};
    o.save_every = 1;
    o.keep_checkpoints = 0;
    o.epochs = 8;
    try {
      fit(s.trainer, s.sgd, s.train, &s.test, o);
    } catch (const tw::NumericalError& e) {
      message = e.what();
    }
  }
  REQUIRE_THAT(message, Catch::Contains("the loss is") && Catch::Contains("last good checkpoint") &&
                            Catch::Contains("learning rate (1e+06 now)"));
  auto latest = tw::io::CheckpointDir(dir.path).latest();
  REQUIRE(latest);
  CHECK_THAT(message, Catch::Contains(latest->path.string()) &&
                          Catch::Contains(tw::str("at step ", latest->step + 1, " ")));
  // Every saved parameter is finite: the step that produced the bad loss was not applied.
  auto model = tw::io::SafetensorsFile::load(latest->path / kModelFile);
  for (const auto& e : model.entries()) {
    auto d = model.data(e);
    std::vector<float> v(d.size() / 4);
    std::memcpy(v.data(), d.data(), d.size());
    INFO(e.name);
    CHECK(std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); }));
  }
}

TEST_CASE("out of memory in a step reports every allocator and leaves the model as it was", "[train][fit][oom]") {
  tw::reset_backends_for_testing();
  tw::reset_devices_for_testing();
  // The MLP's parameters, gradients and momentum fit in 2 MiB per device; a batch of 128 images
  // (64 per tower, 768 KiB of input alone, plus activations and their gradients) does not.
  tw::initialise_devices(tw::ProcessOptions{.memory_limit_mb = {{tw::Device::cpu(0), 2.0}, {tw::Device::cpu(1), 2.0}},
                                            .device_count = {{"CPU", 2}}});
  std::string message;
  {
    Setup s;
    auto before = params_of(s.trainer);
    FitOptions o = tiny({});
    o.batch = 128;
    try {
      fit(s.trainer, s.sgd, s.train, nullptr, o);
    } catch (const tw::OutOfMemory& e) {
      message = e.what();
    }
    CHECK(params_of(s.trainer) == before);
  }
  CHECK_THAT(message, Catch::Contains("allocators:") && Catch::Contains("/cpu:0: in use") &&
                          Catch::Contains("/cpu:1: in use") && Catch::Contains("a smaller global batch (FitOptions::batch = 64, now 128)") &&
                          Catch::Contains("a larger memory limit for /cpu:0 (ProcessOptions::memory_limit_mb[/cpu:0])"));
  CHECK_THAT(message, !Catch::Contains("allow_growth"));  // no GPU advice for CPU towers
  fresh_devices();
}

TEST_CASE("resuming fp16 from a checkpoint whose loss scale metadata is damaged names it and refuses", "[train][fit][resume]") {
  fresh_devices();
  TempDir dir;
  const tw::tower::TrainerOptions fp16{.precision = tw::Precision::Fp16};
  {
    Setup s(mlp_factory(), 0.02, fp16);
    tw::io::CheckpointDir d(dir.path);
    save_checkpoint(d, s.trainer.model(), s.sgd, {.step = 1, .epoch = 0, .step_in_epoch = 1},
                    {{"loss_scale", "lots"}, {"loss_scale_good_steps", "3"}}, 0);
  }
  Setup s(mlp_factory(), 0.02, fp16);
  FitOptions o = tiny(dir.path);
  o.resume = true;
  CHECK_THROWS_WITH(fit(s.trainer, s.sgd, s.train, &s.test, o, {}),
                    Catch::Contains("ckpt-0000000001") && Catch::Contains("loss scale metadata ('lots'") &&
                        Catch::Contains("resume from an earlier one"));
}

TEST_CASE("TensorBoard event files of a crashed and resumed run read as one continuous run", "[train][fit][tensorboard]") {
  // With TOWERFLOW_TB_DIR set (tests/train/check_tensorboard.py), the files and the curve they must
  // show are left there for TensorBoard's own reader; else in a temporary directory.
  fresh_devices();
  TempDir tmp;
  const char* env = std::getenv("TOWERFLOW_TB_DIR");
  const fs::path dir = env ? fs::path(env) : tmp.path;
  // What TensorBoard must show: per tag, (step, value) in step order.
  std::map<std::string, std::map<std::int64_t, double>> expected;
  LambdaHook record;
  record.log = [&](const TrainRecord& r) {
    expected["train/loss"][r.step] = r.loss;
    expected["train/learning_rate"][r.step] = r.lr;
  };
  record.eval = [&](const EvalRecord& r) { expected["test/accuracy"][r.step] = r.test_acc; };
  record.log = [&, log = record.log](const TrainRecord& r) {
    log(r);
    for (std::size_t g = 0; g < r.split.size(); ++g) expected["split/tower" + std::to_string(g)][r.step] = r.split[g];
  };
  const tw::tower::TrainerOptions balanced{.split = tw::tower::AutoSplit{}};  // one scalar per tower too
  struct Crash {};
  {
    Setup s(mlp_factory(), 0.02, balanced);
    TensorBoard tb(dir);
    LambdaHook crash;
    crash.step = [](const StepInfo& i) {
      if (i.step == 5) throw Crash{};
    };
    CHECK_THROWS_AS(fit(s.trainer, s.sgd, s.train, &s.test, tiny(dir), {&tb, &record, &crash}), Crash);
  }
  // The resumed run repeats the steps after its checkpoint (3): TensorBoard must drop the crashed
  // run's records of them, so the expected curve keeps the crashed run's only up to step 3.
  for (auto& [tag, points] : expected) std::erase_if(points, [](const auto& p) { return p.first > 3; });
  {
    Setup s(mlp_factory(), 0.02, balanced);
    TensorBoard tb(dir);
    FitOptions o = tiny(dir);
    o.resume = true;
    fit(s.trainer, s.sgd, s.train, &s.test, o, {&tb, &record});
  }
  CHECK(TensorBoard(dir).files().size() == 2);  // one event file per session
  CHECK(expected["train/loss"].size() == 4);    // steps 2 (crashed run), 4, 6, 8 (resumed)
  CHECK(expected["split/tower1"].size() == 4);
  nlohmann::json j;
  for (const auto& [tag, points] : expected)
    for (const auto& [step, value] : points) j[tag].push_back({step, value});
  tw::io::write_file_atomically(dir / "expected.json", j.dump());
}

TEST_CASE("a mixed batch's loss is mix * CE(labels) + (1 - mix) * CE(mix_labels), however the towers split it",
          "[train][fit][mix]") {
  fresh_devices();
  Setup s;
  tw::data::Loader loader(s.train, {.batch = 32, .seed = 4, .threads = 0});
  const tw::data::Batch& b = *loader.begin();
  std::vector<std::int32_t> other(b.labels.rbegin(), b.labels.rend());
  tw::tower::HostBatch h = tw::tower::HostBatch::of(b);
  const float own = s.trainer.forward_backward(h);
  tw::tower::HostBatch h2 = h;
  h2.labels = other;
  const float theirs = s.trainer.forward_backward(h2);
  tw::tower::HostBatch mixed = h;
  mixed.mix_labels = other;
  mixed.mix = 0.3f;
  CHECK(s.trainer.forward_backward(mixed) == Approx(0.3 * own + 0.7 * theirs).epsilon(1e-5));
  mixed.mix_labels = std::span<const std::int32_t>(other.data(), 3);
  CHECK_THROWS_AS(s.trainer.forward_backward(mixed), tw::InvalidArgument);
}

namespace {
// The fixtures' MLP, whose forward on /cpu:1 sleeps 1.5 s at its third call.
class LateOnCpu1 : public tw::nn::Module {
 public:
  explicit LateOnCpu1(const tw::Device& d) : Module(d) { inner_ = register_module("mlp", std::make_shared<Mlp>(d, 7)); }
  tw::Tensor forward(const tw::Tensor& x) override {
    if (device() == tw::Device::cpu(1) && ++calls_ == 3) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    return inner_->forward(x);
  }

 private:
  std::shared_ptr<Mlp> inner_;
  int calls_ = 0;
};
}  // namespace

TEST_CASE("a tower that does not arrive stops the run at the timeout, naming it and the step, and "
          "leaves the towers' last collectives in the train dir", "[train][fit][stall]") {
  fresh_devices();
  TempDir dir;
  ::setenv("TOWERFLOW_STALL_WARNING", "0.1", 1);  // read when the trainer makes its communicator
  ::setenv("TOWERFLOW_COLLECTIVE_TIMEOUT", "0.5", 1);
  std::optional<Setup> s;
  s.emplace([](const tw::Device& d) {
    auto m = std::make_shared<LateOnCpu1>(d);
    m->flatten();
    return m;
  });
  ::unsetenv("TOWERFLOW_STALL_WARNING");
  ::unsetenv("TOWERFLOW_COLLECTIVE_TIMEOUT");
  std::string message;
  try {
    fit(s->trainer, s->sgd, s->train, nullptr, tiny(dir.path));
  } catch (const tw::collectives::CollectiveAborted& e) {
    message = e.what();
  }
  INFO(message);
  CHECK_THAT(message, Catch::Contains("tower 1 (/cpu:1) did not arrive at all-reduce #") &&
                          Catch::Contains(" at step 3, gradients within 0.5 s; tower 0 (/cpu:0) waited"));
  const fs::path file = dir.path / "collectives.json";
  REQUIRE(fs::exists(file));
  const auto record = nlohmann::json::parse(tw::io::read_file(file));
  CHECK(record["processes"] == nlohmann::json::array());  // one process
  const auto& towers = record["towers"];
  REQUIRE(towers.size() == 2);
  // Tower 0 waited in step 3's all-reduce; tower 1 had last completed step 2's.
  CHECK(towers[0]["recent"].back()["step"] == 3);
  CHECK(towers[0]["recent"].back()["done"] == false);
  CHECK(towers[1]["device"] == "/cpu:1");
  CHECK(towers[1]["recent"].back()["step"] == 2);
  CHECK(towers[1]["recent"].back()["done"] == true);
  // Nothing the run had written is lost: the checkpoint of step 3 in tiny()'s schedule was never reached.
  CHECK(steps_in(dir.path).empty());
}

namespace {
// The fixtures' MLP, whose forward on /cpu:1 sleeps 2 ms per row: a tower at a small fraction of
// the other's speed on any machine, sanitizers included.
class SlowOnCpu1 : public tw::nn::Module {
 public:
  explicit SlowOnCpu1(const tw::Device& d) : Module(d) { inner_ = register_module("mlp", std::make_shared<Mlp>(d, 7)); }
  tw::Tensor forward(const tw::Tensor& x) override {
    // 8 ms a row: several times the MLP's own time even in a sanitizer build on a busy machine.
    if (device() == tw::Device::cpu(1)) std::this_thread::sleep_for(std::chrono::microseconds(8000 * x.shape()[0]));
    return inner_->forward(x);
  }

 private:
  std::shared_ptr<Mlp> inner_;
};

tw::nn::ModelFactory slow_on_cpu1() {
  return [](const tw::Device& d) {
    auto m = std::make_shared<SlowOnCpu1>(d);
    m->flatten();
    return m;
  };
}
}  // namespace

TEST_CASE("an auto split is in metrics.jsonl, TensorBoard's scalars and the checkpoint, and a resumed run goes "
          "on from the recorded split", "[train][fit][auto_split]") {
  fresh_devices();
  TempDir dir;
  FitOptions o{.batch = 32, .loader_threads = 0, .max_steps = 6, .log_every = 1, .train_dir = dir.path, .save_every = 3};
  std::vector<std::vector<int>> first;
  {
    Setup s(slow_on_cpu1(), 0.02, {.split = tw::tower::AutoSplit{}});
    MetricsFile metrics(dir.path / "metrics.jsonl");
    TensorBoard board(dir.path);
    LambdaHook record;
    record.step = [&](const StepInfo&) { first.push_back(s.trainer.last_step().global_split); };
    fit(s.trainer, s.sgd, s.train, nullptr, o, {&record, &metrics, &board});
  }
  REQUIRE(first.size() == 6);
  CHECK(first[0] == std::vector<int>{16, 16});  // warm-up
  CHECK(first[1] == std::vector<int>{16, 16});  // measured: applies from step 3
  CHECK(first[2][1] < 8);                       // tower 1 is several times slower
  const auto lines = jsonl(dir.path / "metrics.jsonl");
  REQUIRE(lines.size() == 6);
  for (std::size_t i = 0; i < lines.size(); ++i) CHECK(lines[i]["split"] == first[i]);
  // One scalar per tower (TensorBoard's own reader checks their values: "TensorBoard event files of
  // a crashed and resumed run ...", under tests/train/check_tensorboard.py).
  const std::vector<fs::path> files = TensorBoard(dir.path).files();
  REQUIRE(files.size() == 1);
  const std::string events = tw::io::read_file(files[0]);
  CHECK(events.find("split/tower0") != std::string::npos);
  CHECK(events.find("split/tower1") != std::string::npos);
  // The checkpoint of step 3 holds the shares in force for step 4.
  const CheckpointInfo at3 = read_checkpoint_info(dir.path / "ckpt-0000000003");
  const auto recorded = nlohmann::json::parse(at3.metadata.at("towerflow.split_shares")).get<std::vector<double>>();
  REQUIRE(recorded.size() == 2);
  CHECK(static_cast<int>(std::lround(recorded[1] * 32)) == first[3][1]);

  // Resumed from step 3: step 4 runs the recorded split (the balancer measures again from there).
  o.resume = true;
  o.resume_from = dir.path / "ckpt-0000000003";
  o.max_steps = 4;
  Setup s(slow_on_cpu1(), 0.02, {.split = tw::tower::AutoSplit{}});
  LambdaHook record;
  std::vector<std::vector<int>> resumed;
  record.step = [&](const StepInfo&) { resumed.push_back(s.trainer.last_step().global_split); };
  fit(s.trainer, s.sgd, s.train, nullptr, o, {&record});
  REQUIRE(resumed.size() == 1);
  CHECK(resumed[0] == first[3]);
}

TEST_CASE("resuming an auto split: damaged shares are refused naming them, shares of another tower count or "
          "none start even, saying so", "[train][fit][auto_split][resume]") {
  fresh_devices();
  const tw::tower::TrainerOptions balanced{.split = tw::tower::AutoSplit{}};
  const auto resume_with = [&](const tw::io::Metadata& metadata) {
    TempDir dir;
    {
      Setup s(mlp_factory(), 0.02, balanced);
      tw::io::CheckpointDir d(dir.path);
      save_checkpoint(d, s.trainer.model(), s.sgd, {.step = 1, .epoch = 0, .step_in_epoch = 1}, metadata, 0);
    }
    Setup s(mlp_factory(), 0.02, balanced);
    FitOptions o = tiny(dir.path);
    o.resume = true;
    o.max_steps = 2;
    std::vector<std::string> notes;
    auto previous = tw::set_log_sink([&](tw::LogLevel, std::string_view m) { notes.emplace_back(m); });
    std::string error;
    try {
      fit(s.trainer, s.sgd, s.train, nullptr, o, {});
    } catch (const tw::DataError& e) {
      error = e.what();
    }
    tw::set_log_sink(previous);
    std::string said;
    for (const auto& n : notes)
      if (n.find("auto split") != std::string::npos) said += n + "\n";
    return std::pair{error, said};
  };
  const auto [damaged, none1] = resume_with({{"towerflow.split_shares", "half"}});
  CHECK_THAT(damaged, Catch::Contains("towerflow.split_shares is 'half', not a list of numbers") &&
                          Catch::Contains("resume from another checkpoint"));
  const auto [ok3, three] = resume_with({{"towerflow.split_shares", "[0.3,0.3,0.4]"}});
  CHECK(ok3.empty());
  CHECK_THAT(three, Catch::Contains("the checkpoint's auto split is for 3 towers and this run has 2; the split starts even"));
  const auto [ok0, missing] = resume_with({});
  CHECK(ok0.empty());
  CHECK_THAT(missing, Catch::Contains("the checkpoint records no auto split; the split starts even"));
  const auto [ok2, kept] = resume_with({{"towerflow.split_shares", "[0.75,0.25]"}});
  CHECK(ok2.empty());
  CHECK_THAT(kept, Catch::Contains("the auto split goes on from the checkpoint's shares [0.75,0.25]"));
}
