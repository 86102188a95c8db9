#include <catch2/catch.hpp>

#include "test_skip.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/kernel_choice.h"
#include "core/platform/platform.h"
#include "core/platform/registry.h"
#include "core/version.h"
#include "examples/cifar10/predict.h"
#include "examples/cifar10/training.h"
#include "io/atomic_file.h"
#include "io/checkpoint_dir.h"
#include "data/builtin.h"
#include "data/image_codec.h"
#include "io/model_state.h"
#include "models/models.h"
#include "optim/optim.h"
#include "train/checkpoint.h"
#include "training_test_util.h"

namespace tw = towerflow;
namespace fs = std::filesystem;
using namespace towerflow::cifar10;
using namespace towerflow::cifar10::testing;
using towerflow::train::kModelFile;
using towerflow::train::read_checkpoint_info;

namespace {

std::vector<float> flat_params(const tw::nn::Module& m) { return m.flat_parameters().to_host(); }

}  // namespace

TEST_CASE("a tiny run trains, evaluates, checkpoints and keeps the newest N", "[cifar10][training]") {
  fresh_devices();
  TempDir dir;
  Output out;
  Reporter reporter(out.reporter_options());
  TrainOptions o = tiny_options(dir.path);
  FitResult r = run_training(o, {}, reporter);
  CHECK(r.steps == 8);  // 2 epochs of 128 / 32
  CHECK_FALSE(r.stopped_early);
  CHECK(r.test_acc >= 0.0);
  CHECK(std::isfinite(r.test_loss));
  CHECK(steps_in(dir.path) == std::vector<std::int64_t>{6, 8});  // saved at 3, 6 and the end; 2 kept
  CHECK(r.last_checkpoint == dir.path / "ckpt-0000000008");
  CHECK_THAT(out.text(), Catch::Contains("every 3 steps and at the end, newest 2 kept"));

  auto metrics = jsonl(dir.path / "metrics.jsonl");
  int train_lines = 0, eval_lines = 0;
  for (const auto& m : metrics) {
    if (m.contains("test_acc")) ++eval_lines;
    if (m.contains("loss")) {
      ++train_lines;
      for (const char* k : {"step", "epoch", "acc", "lr", "img_per_s"}) CHECK(m.contains(k));
    }
  }
  CHECK(train_lines == 4);  // every 2 steps
  CHECK(eval_lines == 2);   // after each epoch

  // The saved model is the trained one: it loads strictly into a fresh model of the same kind,
  // and its state records where the run stopped.
  auto info = read_checkpoint_info(r.last_checkpoint);
  CHECK(info.position.step == 8);
  CHECK(info.position.epoch == 2);
  CHECK(info.position.step_in_epoch == 0);
  CHECK(info.metadata.at("model") == "tfcnn");
  auto fresh = tw::models::make_model("tfcnn", tw::Device::cpu(0), {.num_classes = 10, .seed = 99});
  auto before = flat_params(*fresh);
  tw::io::load_module(*fresh, r.last_checkpoint / kModelFile);
  CHECK(flat_params(*fresh) != before);
}

TEST_CASE("a tiny ResNet-20 run with --batch_norm sync trains with statistics over both towers", "[cifar10][training][syncbn]") {
  fresh_devices();
  TempDir dir;
  Output out;
  Reporter reporter(out.reporter_options());
  TrainOptions o = tiny_options(dir.path);
  o.model = "resnet20";
  o.batch_norm = "sync";
  o.max_steps = 2;
  o.save_every = 0;
  o.keep_checkpoints = 0;  // one checkpoint either way; checks the start-up block's wording
  FitResult r = run_training(o, {}, reporter);
  CHECK(r.steps == 2);
  CHECK(std::isfinite(r.test_loss));
  auto info = read_checkpoint_info(r.last_checkpoint);
  CHECK_THAT(info.metadata.at("options"), Catch::Contains("\"batch_norm\":\"sync\""));
  CHECK_THAT(out.text(), Catch::Contains("at the end only, all kept"));
}

TEST_CASE("the cutout and label_smoothing options reach the training images and the loss, and are recorded", "[cifar10][training]") {
  fresh_devices();
  Output out;
  Reporter reporter(out.reporter_options());
  // The first step's loss: the same initial model on the same batch, so only the option differs.
  auto first_loss = [&](int cutout, double smoothing) {
    TempDir dir;
    TrainOptions o = tiny_options(dir.path);
    o.max_steps = 1;
    o.log_every = 1;
    o.save_every = 0;
    o.cutout = cutout;
    o.label_smoothing = smoothing;
    run_training(o, {}, reporter);
    auto options = nlohmann::json::parse(read_checkpoint_info(dir.path / "ckpt-0000000001").metadata.at("options"));
    CHECK(options["cutout"] == cutout);
    CHECK(options["label_smoothing"] == smoothing);
    for (const auto& m : jsonl(dir.path / "metrics.jsonl"))
      if (m.contains("loss")) return m["loss"].get<double>();
    FAIL("no training line in metrics.jsonl");
    return 0.0;
  };
  const double plain = first_loss(0, 0.0);
  CHECK(first_loss(0, 0.0) == plain);  // the comparison below is not run-to-run noise
  CHECK(first_loss(16, 0.0) != plain);
  CHECK(first_loss(0, 0.5) != plain);  // the value itself is checked against PyTorch in the op tests
  {
    TempDir dir;
    TrainOptions o = tiny_options(dir.path);
    o.cutout = 33;
    CHECK_THROWS_WITH(run_training(o, {}, reporter), Catch::Contains("--cutout 33") && Catch::Contains("32x32") &&
                                                         Catch::Contains("0 (none) .. 32"));
  }
  // The start-up blocks said so.
  const std::string text = out.text();
  CHECK_THAT(text, Catch::Contains("cutout 16x16") && Catch::Contains("label smoothing 0.5"));
}

TEST_CASE("device choice: two CPU towers by default, explicit lists, and errors", "[cifar10][training][devices]") {
  fresh_devices();
  if (!tw::make_system_platform()->gpus().empty()) {
    TW_SKIP("this machine has a GPU, so the default towers are the GPUs");
  }
  const tw::Device cpu0 = tw::Device::cpu(0), cpu1 = tw::Device::cpu(1);
  TrainOptions o;
  tw::ProcessOptions p;
  CHECK(choose_devices(o, p) == std::vector<tw::Device>{cpu0, cpu1});
  CHECK(p.device_count.at("CPU") == 2);

  o.devices = "/cpu:1, /device:CPU:0";
  p = {};
  CHECK(choose_devices(o, p) == std::vector<tw::Device>{cpu1, cpu0});
  o.devices = "/cpu:1,/cpu:1";
  p = {};
  CHECK_THROWS_WITH(choose_devices(o, p), Catch::Contains("twice"));
  const tw::ProcessOptions two_cpus{.device_count = {{"CPU", 2}}};
  o.devices = "/gpu:0";
  p = two_cpus;
  CHECK_THROWS_AS(choose_devices(o, p), tw::NotFound);
  o.devices = "tpu:0";
  CHECK_THROWS_WITH(choose_devices(o, p), Catch::Contains("--devices") && Catch::Contains("tpu:0"));
  o.devices = "";
  o.num_gpus = 2;
  p = two_cpus;
  CHECK_THROWS_WITH(choose_devices(o, p), Catch::Contains("--num_gpus 2") && Catch::Contains("0 GPUs"));
  // A CPU device index past the host's threads would make that many devices sharing them: only on
  // purpose (--device_count), never from a --devices list alone.
  const unsigned threads = std::thread::hardware_concurrency();
  o.num_gpus = -1;
  o.devices = tw::str("/cpu:", threads);
  p = {};
  CHECK_THROWS_WITH(choose_devices(o, p), Catch::Contains(tw::str("needs ", threads + 1, " logical CPU devices")) &&
                                              Catch::Contains(tw::str("--device_count CPU=", threads + 1)));
  CHECK(p.device_count.count("CPU") == 0);  // nothing was set up
}

TEST_CASE("out of memory ends with every allocator's report and the flags that would help", "[cifar10][training][oom]") {
  tw::reset_backends_for_testing();
  tw::reset_devices_for_testing();
  TempDir dir;
  Output out;
  Reporter reporter(out.reporter_options());
  TrainOptions o = tiny_options(dir.path);
  tw::ProcessOptions tight{.memory_limit_mb = {{tw::Device::cpu(0), 4.0}, {tw::Device::cpu(1), 4.0}},
                           .device_count = {{"CPU", 2}}};
  std::string message;
  try {
    run_training(o, tight, reporter);
  } catch (const tw::OutOfMemory& e) {
    message = as_flags(e.what());  // as the program prints it
  }
  CHECK_THAT(message, Catch::Contains("allocators:") && Catch::Contains("/cpu:0: in use") &&
                          Catch::Contains("/cpu:1: in use") && Catch::Contains("--batch_size 16, now 32") &&
                          Catch::Contains("--memory_limit cpu:0=") && !Catch::Contains("Options::"));
  CHECK_THAT(message, !Catch::Contains("per_process_gpu_memory_fraction"));  // no GPU advice for CPU towers
  fresh_devices();
}

TEST_CASE("the accumulation_steps and Adam flags reach the trainer and the optimizer", "[cifar10][training]") {
  fresh_devices();
  Output out;
  Reporter reporter(out.reporter_options());
  auto final_params = [&](int micro_batches, const std::string& optimizer, double beta1) {
    TempDir dir;
    TrainOptions o = tiny_options(dir.path);
    o.max_steps = 2;
    o.save_every = 0;
    o.accumulation_steps = micro_batches;
    o.optimizer = optimizer;
    o.lr = optimizer == "adam" ? 1e-3 : o.lr;
    o.adam_beta1 = beta1;
    FitResult r = run_training(o, {}, reporter);
    std::vector<float> all;
    for (const auto& [name, bytes] : tensors_of(r.last_checkpoint / kModelFile)) {
      std::vector<float> v(bytes.size() / 4);
      std::memcpy(v.data(), bytes.data(), bytes.size());
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  };
  // tfcnn has no batch statistics: two micro-batches of 16 rows give the gradient of the batch of
  // 32 up to float rounding, so the parameters after two steps agree closely.
  auto whole = final_params(1, "sgd", 0.9);
  auto micro = final_params(2, "sgd", 0.9);
  REQUIRE(whole.size() == micro.size());
  double max_diff = 0;
  for (std::size_t i = 0; i < whole.size(); ++i) max_diff = std::max(max_diff, double(std::abs(whole[i] - micro[i])));
  INFO("max difference " << max_diff);
  CHECK(max_diff < 1e-5);
  CHECK_THAT(out.text(), Catch::Contains("32 global (16 + 16 per tower), in 2 micro-batches"));
  // Adam's betas change the result, and the start-up block shows them instead of a momentum.
  CHECK(final_params(1, "adam", 0.5) != final_params(1, "adam", 0.9));
  CHECK_THAT(out.text(), Catch::Contains("adam, lr 0.001, betas (0.5, 0.999), eps 1e-08"));
  CHECK_THAT(out.text(), !Catch::Contains("adam, lr 0.001, momentum"));
}

TEST_CASE("command-line errors name flags, not library internals", "[cifar10][training][errors]") {
  fresh_devices();
  Output out;
  Reporter reporter(out.reporter_options());
  TempDir dir;
  TrainOptions o = tiny_options(dir.path);
  // As the program prints a library error (cifar10::as_flags).
  auto said = [&] {
    try {
      run_training(o, {}, reporter);
    } catch (const tw::Error& e) {
      return as_flags(e.what());
    }
    return std::string("(no error)");
  };
  SECTION("a batch that does not split over the towers") {
    o.batch_size = 33;
    CHECK_THAT(said(), Catch::Contains("--batch_size 33 cannot be split evenly over 2 towers") &&
                           Catch::Contains("use --batch_size 32 or 34, or --split_remainder spread") &&
                           !Catch::Contains("Remainder::") && !Catch::Contains("Options::"));
    o.dry_run = true;  // the same check before the dry run's forward and backward
    CHECK_THAT(said(), Catch::Contains("--batch_size 33 cannot be split evenly over 2 towers"));
  }
  SECTION("micro-batches that do not split over the towers, with accumulation") {
    o.batch_size = 30;  // 4 micro-batches of 8, 8, 7 and 7 rows: 7 does not split over 2 towers
    o.accumulation_steps = 4;
    CHECK_THAT(said(), Catch::Contains("--batch_size 30 with --accumulation_steps 4 gives micro-batches of 8 and 7 rows") &&
                           Catch::Contains("one of 7 rows cannot be split evenly over 2 towers") &&
                           Catch::Contains("use --batch_size 32 or 24, --accumulation_steps 3") &&
                           Catch::Contains("--split_remainder spread") && !Catch::Contains("Remainder::") &&
                           !Catch::Contains("Options::"));
  }
  SECTION("a warm-up as long as the run") {
    o.warmup_epochs = 2;
    // fit()'s own check (train::schedule), in flags.
    CHECK_THAT(said(), Catch::Contains("a warm-up of 2 epochs (8 steps) is not shorter than the run (8 steps of 4 per epoch)") &&
                           Catch::Contains("shorten the warm-up (--warmup_epochs) or lengthen the run (--epochs, or --max_steps)") &&
                           !Catch::Contains("Options::") && !Catch::Contains("schedule()"));
    o.dry_run = true;  // the same check before the dry run's forward and backward
    CHECK_THAT(said(), Catch::Contains("a warm-up of 2 epochs (8 steps) is not shorter than the run"));
    o.dry_run = false;
    o.warmup_epochs = 1.5;  // shorter: trains
    CHECK(run_training(o, {}, reporter).steps == 8);
  }
  SECTION("a train_dir holding an earlier run") {
    run_training(o, {}, reporter);
    CHECK_THROWS_WITH(run_training(o, {}, reporter),
                      Catch::Contains("--train_dir " + dir.path.string() + " holds an earlier run: 2 checkpoints") &&
                          Catch::Contains("nothing was changed") && Catch::Contains("--resume") &&
                          Catch::Contains("--start_over move") && Catch::Contains("--start_over delete"));
    CHECK(steps_in(dir.path) == std::vector<std::int64_t>{6, 8});
    o.start_over = "move";
    CHECK(run_training(o, {}, reporter).steps == 8);
  }
  SECTION("a number out of range prints its range as numbers") {
    CHECK_THROWS_WITH(set_train_option(o, "batch_size", "0"), Catch::Contains("use a value in [1, 16777216]"));
    CHECK_THROWS_WITH(set_train_option(o, "label_smoothing", "2"), Catch::Contains("use a value in [0, 0.999]"));
  }
}

TEST_CASE("cifar10_eval evaluates on the data the checkpoint records unless told otherwise", "[cifar10][training][eval]") {
  fresh_devices();
  Output out;
  Reporter reporter(out.reporter_options());
  TempDir dir;
  TrainOptions o = tiny_options(dir.path);  // the built-in set with 64 test images
  FitResult trained = run_training(o, {}, reporter);

  TrainOptions defaults;  // what cifar10_eval has without flags: the built-in set's 1000 test images
  defaults.devices = "/cpu:0,/cpu:1";
  FitResult r = run_evaluation(defaults, {.checkpoint = dir.path.string()}, {}, reporter);
  CHECK(r.test_examples == 64);
  CHECK(r.test_acc == Approx(trained.test_acc));
  CHECK(r.test_loss == Approx(trained.test_loss).epsilon(1e-6));
  CHECK_THAT(out.text(), Catch::Contains("64 images") && Catch::Contains("(as the checkpoint recorded it)"));

  TrainOptions told = defaults;
  told.builtin_test_size = 32;
  r = run_evaluation(told, {.checkpoint = dir.path.string()}, {}, reporter, {"builtin_test_size"});
  CHECK(r.test_examples == 32);
}

TEST_CASE("an image folder with a corrupt file: the error names --skip_bad_files, which skips it", "[cifar10][training][data]") {
  fresh_devices();
  Output out;
  Reporter reporter(out.reporter_options());
  TempDir dir;
  for (const char* split : {"train", "test"}) write_image_folder(dir.path / "data" / split, 2, 24);
  const fs::path bad = dir.path / "data" / "train" / "class0" / "7.png";
  tw::io::write_file_atomically(bad, "not an image");
  TrainOptions o = tiny_options(dir.path / "run");
  o.data_dir = (dir.path / "data").string();
  o.batch_size = 16;
  o.max_steps = 2;
  std::string said;
  try {
    run_training(o, {}, reporter);
  } catch (const tw::DataError& e) {
    said = as_flags(e.what());  // as the program prints it
  }
  CHECK_THAT(said, Catch::Contains(bad.string()) && Catch::Contains("skip bad files: --skip_bad_files)"));
  o.skip_bad_files = true;
  FitResult r = run_training(o, {}, reporter);
  CHECK(r.steps == 2);
  CHECK_THAT(out.text(), Catch::Contains("skipped 1 of 48"));
}

TEST_CASE("the JSON start event holds the run's facts as values, and checkpoints record the data and version",
          "[cifar10][training][json]") {
  fresh_devices();
  TempDir dir;
  Output out;
  Reporter reporter(out.reporter_options());
  TrainOptions o = tiny_options(dir.path);
  o.batch_size = 30;
  o.split = "weights:2,1";
  FitResult r = run_training(o, {}, reporter);
  nlohmann::json start;
  for (const auto& line : out.lines()) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.value("event", "") == "start") start = j;
  }
  REQUIRE(start.is_object());
  const auto& run = start.at("run");
  CHECK(run.at("towers") == nlohmann::json({"/cpu:0", "/cpu:1"}));
  CHECK(run.at("rows_per_tower") == nlohmann::json({20, 10}));
  CHECK(run.at("global_batch") == 30);
  CHECK(run.at("total_steps") == r.steps);
  CHECK(run.at("steps_per_epoch") == 4);  // 128 / 30
  CHECK(run.at("start_step") == 0);
  CHECK(run.at("resumed_from").is_null());
  CHECK(run.at("train_examples") == 128);
  CHECK(start.at("metadata").at("options").at("split") == "weights:2,1");  // an object, not text
  CHECK(start.at("metadata").at("data") == "builtin, 128 training images, 10 classes");
  CHECK(start.at("towerflow").at("version") == tw::version());
  const auto meta = read_checkpoint_info(r.last_checkpoint).metadata;
  CHECK(meta.at("towerflow_version") == tw::version());
  CHECK(meta.at("towerflow_commit") == tw::commit());
  CHECK(meta.at("data") == "builtin, 128 training images, 10 classes");
}

TEST_CASE("cifar10_train --dry_run says what the run would use, memory included, and trains and writes nothing",
          "[cifar10][training][dry_run]") {
  fresh_devices();
  TempDir dir;
  Output out;
  Reporter reporter(out.reporter_options());
  TrainOptions o = tiny_options(dir.path / "never");
  o.dry_run = true;
  FitResult r = run_training(o, {}, reporter);
  CHECK(r.steps == 0);
  CHECK_FALSE(fs::exists(dir.path / "never"));  // no train_dir, no lock, no checkpoint
  const std::string text = out.text();
  CHECK_THAT(text, Catch::Contains("\"event\":\"start\"") && Catch::Contains("\"rows_per_tower\":[16,16]"));
  CHECK_THAT(text, Catch::Contains("\"event\":\"dry_run\"") && Catch::Contains("\"memory /cpu:0\":\"peak ") &&
                       Catch::Contains("after one forward and backward of 32 rows"));
}

TEST_CASE("cifar10_train writes the newest evaluation's confusion matrix, and cifar10_eval --confusion the same",
          "[cifar10][training][eval]") {
  fresh_devices();
  TempDir dir;
  FitResult trained;
  {
    Output out;
    Reporter reporter(out.reporter_options());
    trained = run_training(tiny_options(dir.path), {}, reporter);
    CHECK_THAT(out.text(), Catch::Contains("\"test_top5\":") && Catch::Contains("\"test_class_acc\":["));
  }
  const auto doc = nlohmann::json::parse(tw::io::read_file(dir.path / "confusion.json"));
  CHECK(doc.at("step") == trained.steps);
  CHECK(doc.at("classes").size() == 10);
  std::int64_t all = 0, diagonal = 0;
  for (std::size_t t = 0; t < 10; ++t)
    for (std::size_t p = 0; p < 10; ++p) {
      all += doc.at("confusion").at(t).at(p).get<std::int64_t>();
      if (t == p) diagonal += doc.at("confusion").at(t).at(p).get<std::int64_t>();
    }
  CHECK(all == 64);  // every test image once
  CHECK(static_cast<double>(diagonal) / 64 == Approx(trained.test_acc));
  CHECK(doc.at("set") == "test");
  CHECK(doc.at("acc").get<double>() == Approx(trained.test_acc));
  CHECK(doc.at("top5").get<double>() >= trained.test_acc);

  fresh_devices();
  Output out;
  Reporter reporter(out.reporter_options());
  const fs::path file = dir.path / "eval_confusion.json";
  run_evaluation(tiny_options(dir.path), {.checkpoint = dir.path.string(), .confusion = file.string()}, {}, reporter);
  CHECK(nlohmann::json::parse(tw::io::read_file(file)).at("confusion") == doc.at("confusion"));
}

TEST_CASE("cifar10_train --val_split validates on held-out training images and tests once at the end",
          "[cifar10][training][validation]") {
  fresh_devices();
  TempDir dir;
  Output out;
  Reporter reporter(out.reporter_options());
  TrainOptions o = tiny_options(dir.path);
  o.val_split = 0.25;  // a quarter of each class of 128 images: 30 held out, 98 train (3 steps an epoch)
  FitResult r = run_training(o, {}, reporter);
  CHECK(r.steps == 6);
  CHECK(r.val_examples == 30);
  CHECK(r.test_examples == 64);
  std::vector<std::string> evals;
  for (const auto& line : out.lines()) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("event")) {
      if (j["event"] == "start") CHECK(j["run"]["val_examples"] == 30);
      continue;
    }
    if (j.contains("val_acc")) evals.push_back("val:" + std::to_string(j["step"].get<int>()));
    if (j.contains("test_acc")) evals.push_back("test:" + std::to_string(j["step"].get<int>()));
  }
  CHECK(evals == std::vector<std::string>{"val:3", "val:6", "test:6"});
  CHECK(nlohmann::json::parse(tw::io::read_file(dir.path / "confusion.json")).at("set") == "test");

  fresh_devices();
  o.val_split = 0;
  o.val_dir = dir.path.string();
  CHECK_THROWS_WITH(run_training(o, {}, reporter), Catch::Contains("--val_dir") && Catch::Contains("--val_split"));
  o.val_split = 0.5;
  CHECK_THROWS_WITH(run_training(o, {}, reporter), Catch::Contains("give one of them"));
  CHECK_THROWS_WITH(set_train_option(o, "val_split", "1"), Catch::Contains("out of range"));
}

TEST_CASE("cifar10_train --val_dir validates on a folder of its own", "[cifar10][training][validation][data]") {
  fresh_devices();
  Output out;
  Reporter reporter(out.reporter_options());
  TempDir dir;
  write_image_folder(dir.path / "data" / "train", 2, 24);
  write_image_folder(dir.path / "data" / "test", 2, 8);
  write_image_folder(dir.path / "val", 2, 5);
  write_image_folder(dir.path / "val3", 3, 2);
  TrainOptions o = tiny_options(dir.path / "run");
  o.data_dir = (dir.path / "data").string();
  o.val_dir = (dir.path / "val").string();
  o.batch_size = 16;
  o.epochs = 1;
  FitResult r = run_training(o, {}, reporter);
  CHECK(r.val_examples == 10);
  CHECK(r.test_examples == 16);
  CHECK_THAT(out.text(), Catch::Contains("\"val_acc\"") && Catch::Contains("validation data"));

  fresh_devices();
  o.val_dir = (dir.path / "val3").string();
  o.train_dir = (dir.path / "run3").string();
  CHECK_THROWS_WITH(run_training(o, {}, reporter), Catch::Contains("holds 3 classes") && Catch::Contains("2 of 32x32x3"));
}

TEST_CASE("cifar10_train --keep_best, --early_stop and --schedule plateau watch the validation set, and resume goes on",
          "[cifar10][training][keep_best]") {
  fresh_devices();
  TempDir dir, cut;
  Output out;
  Reporter reporter(out.reporter_options());
  TrainOptions o = tiny_options(dir.path);
  o.val_split = 0.25;
  o.epochs = 4;
  o.keep_best = "val_acc";
  o.schedule = "plateau:0.5:1";
  o.monitor = "val_loss";
  FitResult r = run_training(o, {}, reporter);
  // The evaluations as the JSON lines show them, and the rates the steps used.
  std::vector<double> val_acc, val_loss, lrs;
  std::vector<std::int64_t> steps;
  for (const auto& line : out.lines()) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("event")) {
      if (j["event"] == "start") CHECK_THAT(j["metrics watched"].get<std::string>(), Catch::Contains("best val_acc"));
      continue;
    }
    if (j.contains("val_acc")) {
      val_acc.push_back(j["val_acc"]);
      val_loss.push_back(j["val_loss"]);
      steps.push_back(j["step"]);
    }
    if (j.contains("lr")) lrs.push_back(j["lr"]);
  }
  REQUIRE(val_acc.size() == 4);
  std::size_t best = 0;
  for (std::size_t i = 1; i < val_acc.size(); ++i)
    if (val_acc[i] > val_acc[best] + 1e-9) best = i;
  const auto kept = tw::io::CheckpointDir(dir.path / "best").list();
  REQUIRE(kept.size() == 1);
  CHECK(kept[0].step == steps[best]);
  // Each evaluation whose loss did not improve on the best by 1e-4 halves the rate from the next step.
  double expected = o.lr, best_loss = INFINITY;
  for (double l : val_loss) {
    if (l < best_loss - 1e-4) best_loss = l;
    else expected *= 0.5;
  }
  CHECK(lrs.back() == Approx(expected));
  // cifar10_eval reads the best checkpoint as any other.
  fresh_devices();
  FitResult e = run_evaluation(o, {.checkpoint = (dir.path / "best").string()}, {}, reporter);
  CHECK(e.test_examples == 64);

  // --early_stop: a run that cannot improve (lr 0) stops after that many evaluations.
  fresh_devices();
  TrainOptions s = tiny_options(cut.path);
  s.val_split = 0.25;
  s.epochs = 6;
  s.lr = 0;
  s.early_stop = 2;
  r = run_training(s, {}, reporter);
  CHECK(r.stopped_early);
  CHECK(r.steps == 9);  // evaluations at 3 (best), 6, 9
  CHECK_THAT(r.stop_reason, Catch::Contains("val_loss"));
  CHECK(r.test_examples == 64);  // the test set still at the end

  // Flags that watch the validation set without one.
  fresh_devices();
  TrainOptions n = tiny_options(cut.path / "n");
  n.keep_best = "val_acc";
  CHECK_THROWS_WITH(run_training(n, {}, reporter), Catch::Contains("--keep_best val_acc") && Catch::Contains("--val_split"));
  n.keep_best = "accuracy";
  CHECK_THROWS_WITH(run_training(n, {}, reporter), Catch::Contains("--keep_best: metric \"accuracy\" is not known"));
  n.keep_best.clear();
  n.schedule = "plateau:2";
  CHECK_THROWS_WITH(run_training(n, {}, reporter), Catch::Contains("--schedule \"plateau:2\"") && Catch::Contains("(0, 1)"));
  n.schedule = "plateau:0.1:x";
  CHECK_THROWS_WITH(run_training(n, {}, reporter), Catch::Contains("PATIENCE"));
}

TEST_CASE("cifar10_train --resume of a run watching metrics goes on as the uninterrupted run", "[cifar10][training][keep_best][resume]") {
  TempDir full, cut;
  auto options = [](const fs::path& d) {
    TrainOptions o = tiny_options(d);
    o.val_split = 0.25;
    o.epochs = 4;
    o.keep_best = "val_acc";
    o.schedule = "plateau:0.5:1";
    return o;
  };
  Output out;
  Reporter reporter(out.reporter_options());
  fresh_devices();
  FitResult a = run_training(options(full.path), {}, reporter);
  fresh_devices();
  TrainOptions first = options(cut.path);
  first.max_steps = 6;  // two of the four epochs
  run_training(first, {}, reporter);
  fresh_devices();
  TrainOptions rest = options(cut.path);
  rest.resume = true;  // the run's own options, but its whole length
  FitResult b = run_training(rest, {}, reporter, {}, std::set<std::string>{"resume", "train_dir", "max_steps"});
  CHECK(b.steps == a.steps);
  CHECK(b.val_acc == a.val_acc);
  CHECK(tensors_of(a.last_checkpoint / tw::train::kModelFile) == tensors_of(b.last_checkpoint / tw::train::kModelFile));
  const auto best_a = tw::io::CheckpointDir(full.path / "best").list();
  const auto best_b = tw::io::CheckpointDir(cut.path / "best").list();
  REQUIRE(best_a.size() == 1);
  REQUIRE(best_b.size() == 1);
  CHECK(best_a[0].step == best_b[0].step);
  CHECK(tensors_of(best_a[0].path / tw::train::kModelFile) == tensors_of(best_b[0].path / tw::train::kModelFile));
}

TEST_CASE("cifar10_train --mixup and --cutmix train on mixed batches and say so", "[cifar10][training][mix]") {
  fresh_devices();
  TempDir dir;
  Output out;
  Reporter reporter(out.reporter_options());
  TrainOptions o = tiny_options(dir.path);
  o.mixup = 0.2;
  o.cutmix = 1.0;
  FitResult r = run_training(o, {}, reporter);
  CHECK(r.steps == 8);
  CHECK(std::isfinite(r.test_loss));
  CHECK_THAT(out.text(), Catch::Contains("mixup alpha 0.2, CutMix alpha 1 (one of the two per batch)"));
  CHECK_THROWS_WITH(set_train_option(o, "mixup", "-1"), Catch::Contains("out of range"));
  fresh_devices();
  TrainOptions one = tiny_options(dir.path / "one");
  one.mixup = 0.2;
  one.batch_size = 1;
  CHECK_THROWS_WITH(run_training(one, {}, reporter), Catch::Contains("--batch_size 1") && Catch::Contains("at least 2"));
}

TEST_CASE("cifar10_predict classifies image files as the evaluation does, preprocessed as the run recorded",
          "[cifar10][predict]") {
  fresh_devices();
  TempDir dir;
  Output out;
  Reporter reporter(out.reporter_options());
  TrainOptions o = tiny_options(dir.path / "run");
  o.image_size = "40";  // the 32x32 images are resized, in training and in prediction alike
  o.mean = "imagenet";
  o.stddev = "0.3,0.3,0.3";
  FitResult trained = run_training(o, {}, reporter);
  const auto meta = read_checkpoint_info(trained.last_checkpoint).metadata;
  CHECK(meta.at("image_size") == "40x40");
  CHECK(meta.at("mean") == "0.485,0.456,0.406");
  CHECK(meta.at("std") == "0.3,0.3,0.3");
  // cifar10_eval takes the recorded preprocessing: the run's own final evaluation.
  fresh_devices();
  CHECK(run_evaluation(TrainOptions{}, {.checkpoint = o.train_dir}, {}, reporter).test_acc == trained.test_acc);
  for (const auto& [flag, value] : {std::pair{"image_size", "40x"}, {"image_size", "0"}, {"mean", "0.5,0.5"},
                                    {"std", "0.2,0,0.2"}}) {
    TrainOptions bad = o;
    set_train_option(bad, flag, value);
    CHECK_THROWS_WITH(run_training(bad, {}, reporter), Catch::Contains(tw::str("--", flag, " \"", value, "\"")));
  }
  // The test images as PNG files (lossless), named by index and true label.
  const tw::data::Builtin test(tw::data::Split::Test, {.train_size = 128, .test_size = 64});
  std::vector<std::uint8_t> px(test.shape().bytes());
  for (std::int64_t i = 0; i < test.size(); ++i) {
    const int label = test.read(i, px);
    const auto png = tw::data::encode_png({.h = 32, .w = 32, .c = 3, .pixels = px});
    const fs::path f = dir.path / "images" / (i < 10 ? "a" : "b") / tw::str("img", 100 + i, "_", label, ".png");
    fs::create_directories(f.parent_path());
    tw::io::write_file_atomically(f, std::string(png.begin(), png.end()));
  }
  fresh_devices();
  Output pout;
  Reporter preporter(pout.reporter_options());
  const Predictions p = run_prediction({}, {.checkpoint = o.train_dir, .inputs = {(dir.path / "images").string()},
                                            .top_k = 3, .batch = 10}, {}, preporter);
  REQUIRE(p.images.size() == 64);
  CHECK(p.class_names == test.class_names());
  int correct = 0;
  for (const auto& image : p.images) {
    const int label = image.path[image.path.size() - 5] - '0';
    correct += image.top[0] == label;
    CHECK(image.top.size() == 3);
    CHECK(image.probabilities[image.top[0]] >= image.probabilities[image.top[1]]);
    float sum = 0;
    for (float q : image.probabilities) sum += q;
    CHECK(sum == Approx(1.0f).epsilon(1e-5));
  }
  CHECK(p.images.front().path.find("/a/img100_") != std::string::npos);  // folders in name order
  CHECK(static_cast<double>(correct) / 64 == Approx(trained.test_acc));
  const auto lines = pout.lines();
  const auto last = nlohmann::json::parse(lines.back());
  CHECK(last["top"].size() == 3);
  CHECK(last["logits"].size() == 10);

  // Bad input: a missing file, a folder without images, a file that is not an image.
  CHECK_THROWS_WITH(run_prediction({}, {.checkpoint = o.train_dir, .inputs = {"/nonexistent.png"}}, {}, preporter),
                    Catch::Contains("/nonexistent.png does not exist"));
  fs::create_directories(dir.path / "empty");
  CHECK_THROWS_WITH(run_prediction({}, {.checkpoint = o.train_dir, .inputs = {(dir.path / "empty").string()}}, {}, preporter),
                    Catch::Contains("holds no .jpg"));
  tw::io::write_file_atomically(dir.path / "bad.png", "not an image");
  CHECK_THROWS_WITH(run_prediction({}, {.checkpoint = o.train_dir, .inputs = {(dir.path / "bad.png").string()}}, {}, preporter),
                    Catch::Contains("bad.png"));
}

TEST_CASE("cifar10_train --recipe airbench94 whitens from the data, trains the whitening bias for 3 epochs, stops inside "
          "a fractional epoch and evaluates through six views at the end",
          "[cifar10][training][recipe]") {
  fresh_devices();
  TempDir dir;
  Output out;
  Reporter reporter(out.reporter_options());
  TrainOptions o = tiny_options(dir.path);
  o.recipe = "airbench94";
  o.batch_size = 64;  // 2 steps an epoch
  o.epochs = 3.5;     // 7 steps
  o.save_every = 2;
  o.keep_checkpoints = 0;
  o.lookahead = 0;  // Lookahead would average the frozen bias with its earlier values
  apply_recipe(o, {"builtin_train_size", "builtin_test_size", "batch_size", "epochs", "save_every",
                   "keep_checkpoints", "lookahead", "train_dir", "devices", "loader_threads", "log_every",
                   "eval_every", "lr"});
  FitResult r = run_training(o, {}, reporter);
  CHECK(r.steps == 7);
  CHECK(steps_in(dir.path) == std::vector<std::int64_t>{2, 4, 6, 7});
  auto tensor_at = [&](int step, const std::string& name) {
    char ckpt[32];
    std::snprintf(ckpt, sizeof ckpt, "ckpt-%010d", step);
    return tensors_of(dir.path / ckpt / kModelFile).at(name);
  };
  auto bias_at = [&](int step) { return tensor_at(step, "0.bias"); };
  CHECK(bias_at(4) != bias_at(6));  // trained in the third epoch (steps 5 and 6)
  CHECK(bias_at(6) == bias_at(7));  // frozen from the fourth
  // The whitening layer is the data's, not the model's initial one.
  const auto weight = tensor_at(7, "0.weight");
  REQUIRE(weight.size() == 24 * 3 * 2 * 2 * sizeof(float));
  for (const auto& [name, t] : tw::models::make_model("airbench94", tw::Device::cpu(0))->named_buffers())
    if (name == "0.weight") {
      const auto initial = t.to_host();
      CHECK(std::memcmp(initial.data(), weight.data(), weight.size()) != 0);
    }
  auto metrics = jsonl(dir.path / "metrics.jsonl");
  REQUIRE(metrics.size() >= 2);
  CHECK_FALSE(metrics[metrics.size() - 2].contains("views"));  // the plain evaluation at the end
  CHECK(metrics.back()["views"] == 6);
  CHECK(metrics.back()["step"] == 7);
  const std::string text = out.text();
  CHECK_THAT(text, Catch::Contains("whitening") && Catch::Contains("first 128 training images") &&
                       Catch::Contains("64x the lr") && Catch::Contains("six (mirror, one-pixel shifts)") &&
                       Catch::Contains("linear:0=0.2,0.23=1,1=0.07"));
}

TEST_CASE("cifar10_train --kernel_choice auto lists the kernels chosen in the first step, and a second run "
          "reads them from the cache and trains to the same loss",
          "[cifar10][training][kernel_choice]") {
  fresh_devices();
  const std::filesystem::path cache = std::filesystem::temp_directory_path() /
                                      ("towerflow-cli-kernel-choices-" + std::to_string(::getpid()) + ".json");
  std::filesystem::remove(cache);
  tw::reset_kernel_choices_for_testing();
  tw::set_kernel_choice_cache(cache.string());
  auto run = [&](const std::string& choice) {
    fresh_devices();
    TempDir dir;
    Output out;
    Reporter reporter(out.reporter_options());
    TrainOptions o = tiny_options(dir.path);
    o.kernel_choice = choice;
    const FitResult r = run_training(o, {}, reporter);
    return std::pair{r, out.text()};
  };
  const auto [fixed, fixed_text] = run("fixed");
  CHECK_THAT(fixed_text, !Catch::Contains("kernels chosen"));
  const auto [first, first_text] = run("auto");
  tw::reset_kernel_choices_for_testing();  // as a new process: the cache file only
  const auto [second, second_text] = run("auto");
  tw::set_kernel_choice(tw::KernelChoice::kFixed);
  tw::reset_kernel_choices_for_testing();
  tw::set_kernel_choice_cache("");
  std::filesystem::remove(cache);
  INFO(first_text);
  INFO(second_text);
  CHECK_THAT(first_text, Catch::Contains("measured in the first step"));
  // The candidates agree to rounding, so the losses do; the second run makes the first's choices.
  CHECK(first.test_loss == Approx(fixed.test_loss).epsilon(1e-3));
  CHECK(second.test_loss == first.test_loss);
  if (tw::kernel_choice_candidates().size() > 1) {
    // The reporter's JSON form here (the text form is checked in docs/cli.md's commands).
    CHECK_THAT(first_text, Catch::Contains("{\"event\":\"kernel_choice\",\"cache\":\"" + cache.string() + "\"") &&
                               Catch::Contains("\"layer\":\"conv1\",\"pass\":\"forward\"") &&
                               Catch::Contains("\"cached\":false") && !Catch::Contains("\"cached\":true"));
    CHECK_THAT(second_text, Catch::Contains("\"layer\":\"conv1\",\"pass\":\"forward\"") &&
                                Catch::Contains("\"cached\":true") && !Catch::Contains("\"cached\":false"));
  }
}
