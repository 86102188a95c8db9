#include <catch2/catch.hpp>

#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "io/atomic_file.h"
#include "io/checkpoint_dir.h"
#include "io/model_state.h"
#include "models/models.h"
#include "optim/optim.h"
#include "train/checkpoint.h"
#include "train/fit_test_util.h"

namespace tw = towerflow;
namespace fs = std::filesystem;
using namespace towerflow::train;
using namespace towerflow::train::testing;

namespace {

std::vector<float> flat_params(const tw::nn::Module& m) { return m.flat_parameters().to_host(); }

// A tfcnn model (10 classes, initialised from `seed`) and SGD with momentum over a host copy of
// its parameters: what a checkpoint saves and loads.
struct TfcnnSgd {
  explicit TfcnnSgd(unsigned seed)
      : model(tw::models::make_model("tfcnn", tw::Device::cpu(0), {.num_classes = 10, .seed = seed})),
        params(flat_params(*model)),
        sgd(tw::optim::ParameterSet::single(std::span<float>(params), std::span<const float>(params)),
            {.lr = 0.1, .momentum = 0.9}) {}
  TfcnnSgd(const TfcnnSgd&) = delete;
  TfcnnSgd& operator=(const TfcnnSgd&) = delete;

  std::shared_ptr<tw::nn::Module> model;
  std::vector<float> params;  // the optimizer's copy
  tw::optim::Sgd sgd;
};

}  // namespace

TEST_CASE("mismatched checkpoints are refused naming the tensor, and load nothing", "[train][checkpoint]") {
  fresh_devices();
  TempDir dir;
  tw::io::CheckpointDir ckdir(dir.path);
  auto model = tw::models::make_model("tfcnn", tw::Device::cpu(0), {.num_classes = 10, .seed = 1});
  auto params = model->flat_parameters().to_host();
  tw::optim::Sgd sgd(tw::optim::ParameterSet::single(std::span<float>(params), std::span<const float>(params)),
                     {.lr = 0.1, .momentum = 0.9});
  fs::path ckpt = save_checkpoint(ckdir, *model, sgd, {.step = 5, .epoch = 1, .step_in_epoch = 2}, {{"model", "tfcnn"}}, 0);

  auto target = tw::models::make_model("tfcnn", tw::Device::cpu(0), {.num_classes = 10, .seed = 2});
  auto target_params = target->flat_parameters().to_host();
  std::vector<float> p2 = target_params;
  tw::optim::Sgd sgd2(tw::optim::ParameterSet::single(std::span<float>(p2), std::span<const float>(p2)),
                      {.lr = 0.1, .momentum = 0.9});

  SECTION("a model with other shapes (another number of classes)") {
    auto other = tw::models::make_model("tfcnn", tw::Device::cpu(0), {.num_classes = 100, .seed = 2});
    auto other_before = flat_params(*other);
    CHECK_THROWS_WITH(load_checkpoint(ckpt, *other, sgd2), Catch::Contains("fc3.weight") && Catch::Contains("[10, 192]"));
    CHECK(flat_params(*other) == other_before);
  }
  SECTION("a truncated model file") {
    std::string bytes = tw::io::read_file(ckpt / kModelFile);
    tw::io::write_file_atomically(ckpt / kModelFile, bytes.substr(0, bytes.size() - 100));
    CHECK_THROWS_AS(load_checkpoint(ckpt, *target, sgd2), tw::DataError);
    CHECK(flat_params(*target) == target_params);
  }
  SECTION("a train_state without the position") {
    auto state = tw::io::SafetensorsFile::load(ckpt / kStateFile);
    tw::io::Metadata meta = state.metadata();
    meta.erase("step_in_epoch");
    std::vector<tw::io::TensorView> views;
    for (const auto& e : state.entries()) views.push_back({e.name, e.dtype, e.shape, state.data(e)});
    tw::io::save_safetensors(ckpt / kStateFile, views, meta);
    CHECK_THROWS_WITH(load_checkpoint(ckpt, *target, sgd2), Catch::Contains("step_in_epoch"));
    CHECK(flat_params(*target) == target_params);
  }
  SECTION("optimizer state of another optimizer") {
    std::vector<float> p3 = target_params;
    tw::optim::Adam adam(tw::optim::ParameterSet::single(std::span<float>(p3), std::span<const float>(p3)), {.lr = 0.1});
    CHECK_THROWS_WITH(load_checkpoint(ckpt, *target, adam), Catch::Contains("exp_avg"));
    CHECK(flat_params(*target) == target_params);
  }
  SECTION("a matching checkpoint loads model and optimizer") {
    auto info = load_checkpoint(ckpt, *target, sgd2);
    CHECK(info.position.step == 5);
    CHECK(info.position.step_in_epoch == 2);
    CHECK(flat_params(*target) == params);
  }
}


namespace {

// A byte of a tensor's data in a safetensors file's bytes: its offset in the whole file.
std::size_t data_offset(const std::string& bytes, const tw::io::SafetensorsFile::Entry& e, std::size_t at) {
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  return 8 + n + e.begin + at;
}

// `file` rewritten with the same tensors and metadata but no checksum keys (as written before
// checkpoints carried them).
void strip_checksums(const fs::path& file) {
  auto f = tw::io::SafetensorsFile::load(file);
  tw::io::Metadata meta;
  for (const auto& [k, v] : f.metadata())
    if (!k.starts_with(tw::io::kChecksumKeyPrefix)) meta[k] = v;
  std::vector<tw::io::TensorView> views;
  for (const auto& e : f.entries()) views.push_back({e.name, e.dtype, e.shape, f.data(e)});
  tw::io::save_safetensors(file, views, meta);
}

}  // namespace

TEST_CASE("a byte changed in any tensor of a checkpoint is detected, naming the file and the tensor", "[train][checkpoint][checksum]") {
  fresh_devices();
  TempDir dir;
  tw::io::CheckpointDir ckdir(dir.path);
  TfcnnSgd saved(1);
  saved.sgd.step();  // momentum buffers that are not all zero
  fs::path ckpt = save_checkpoint(ckdir, *saved.model, saved.sgd, {.step = 5, .epoch = 1, .step_in_epoch = 2}, {}, 0);
  CHECK(verify_checkpoint(ckpt).checksummed);

  for (const char* name : {kModelFile, kStateFile}) {
    const fs::path file = ckpt / name;
    const std::string good = tw::io::read_file(file);
    auto parsed = tw::io::SafetensorsFile::parse(good, file.string());
    REQUIRE(parsed.checksummed());
    REQUIRE_FALSE(parsed.entries().empty());  // the model: every parameter; the state: one flat momentum buffer
    int flips = 0;
    for (const auto& e : parsed.entries()) {
      const std::size_t size = e.end - e.begin;
      for (std::size_t at : {std::size_t{0}, size / 3, size / 2, size - 1}) {
        INFO(name << ": tensor " << e.name << ", byte " << at << " of " << size);
        std::string bad = good;
        bad[data_offset(good, e, at)] ^= 0x5a;
        CHECK_THROWS_AS(tw::io::SafetensorsFile::parse(bad, file.string()), tw::DataError);
        CHECK_THROWS_WITH(tw::io::SafetensorsFile::parse(bad, file.string()),
                          Catch::Contains(file.string()) && Catch::Contains("tensor \"" + e.name + "\"") &&
                              Catch::Contains("has CRC-32C") && Catch::Contains("the file records") &&
                              Catch::Contains("use an earlier checkpoint"));
        ++flips;
      }
    }
    CHECK(flips == 4 * static_cast<int>(parsed.entries().size()));

    // Through load_checkpoint on disk: refused, and nothing loaded.
    TfcnnSgd target(2);
    const auto before = flat_params(*target.model);
    std::string bad = good;
    const auto& last = parsed.entries().back();
    bad[data_offset(good, last, (last.end - last.begin) / 2)] ^= 0x01;
    tw::io::write_file_atomically(file, bad);
    CHECK_THROWS_WITH(load_checkpoint(ckpt, *target.model, target.sgd), Catch::Contains("tensor \"" + last.name + "\""));
    CHECK_THROWS_AS(verify_checkpoint(ckpt), tw::DataError);
    CHECK(flat_params(*target.model) == before);
    tw::io::write_file_atomically(file, good);
  }
}

TEST_CASE("a checksum header that does not match the tensors is refused", "[train][checkpoint][checksum]") {
  std::vector<float> a{1, 2, 3}, b{4, 5};
  std::vector<tw::io::TensorView> views{{"a", tw::io::DType::F32, {3}, std::as_bytes(std::span(a))},
                                        {"b", tw::io::DType::F32, {2}, std::as_bytes(std::span(b))}};
  auto meta = tw::io::with_checksums(views, {{"format", "pt"}});
  CHECK(meta.at("towerflow.crc32c.a").size() == 8);
  CHECK(tw::io::SafetensorsFile::parse(tw::io::serialize_safetensors(views, meta), "ok").checksummed());
  SECTION("a tensor without its checksum") {
    meta.erase("towerflow.crc32c.b");
    CHECK_THROWS_WITH(tw::io::SafetensorsFile::parse(tw::io::serialize_safetensors(views, meta), "x.safetensors"),
                      Catch::Contains("none for tensor \"b\""));
  }
  SECTION("a checksum of a tensor the file lacks") {
    meta["towerflow.crc32c.c"] = "00000000";
    CHECK_THROWS_WITH(tw::io::SafetensorsFile::parse(tw::io::serialize_safetensors(views, meta), "x.safetensors"),
                      Catch::Contains("tensor \"c\", which the file does not hold"));
  }
}

TEST_CASE("a checkpoint written before checksums loads, with one note that it carries none", "[train][checkpoint][checksum]") {
  fresh_devices();
  TempDir dir;
  tw::io::CheckpointDir ckdir(dir.path);
  TfcnnSgd saved(1);
  fs::path ckpt = save_checkpoint(ckdir, *saved.model, saved.sgd, {.step = 5, .epoch = 1, .step_in_epoch = 2}, {}, 0);
  strip_checksums(ckpt / kModelFile);
  strip_checksums(ckpt / kStateFile);
  CHECK_FALSE(verify_checkpoint(ckpt).checksummed);

  std::vector<std::string> notes;
  auto previous = tw::set_log_sink([&](tw::LogLevel, std::string_view m) { notes.emplace_back(m); });
  TfcnnSgd target(2);
  CHECK(load_checkpoint(ckpt, *target.model, target.sgd).position.step == 5);
  tw::set_log_sink(previous);
  CHECK(flat_params(*target.model) == saved.params);
  REQUIRE(notes.size() == 1);
  CHECK_THAT(notes[0], Catch::Contains(ckpt.string()) && Catch::Contains("carries no tensor checksums"));
}

TEST_CASE("find_checkpoint takes a checkpoint's name, short name, step or path, and names what is there otherwise",
          "[train][checkpoint][resume]") {
  TempDir dir, other;
  TfcnnSgd s(3);
  tw::io::CheckpointDir ckpts(dir.path);
  for (std::int64_t step : {20, 200}) save_checkpoint(ckpts, *s.model, s.sgd, {.step = step}, {}, 0);
  const fs::path c200 = dir.path / "ckpt-0000000200";
  for (const std::string& which : std::vector<std::string>{"ckpt-0000000200", "ckpt-200", "200", c200.string()}) {
    INFO(which);
    CHECK(find_checkpoint(dir.path, which).path == c200);
  }
  CHECK(find_checkpoint(dir.path, "20").step == 20);
  CHECK_THROWS_AS(find_checkpoint(dir.path, "ckpt-2"), tw::NotFound);
  CHECK_THROWS_WITH(find_checkpoint(dir.path, "ckpt-2"),
                    Catch::Contains("no checkpoint of step 2") && Catch::Contains("ckpt-0000000020, ckpt-0000000200"));
  CHECK_THROWS_WITH(find_checkpoint(dir.path, "newest"), Catch::Contains("\"newest\" names no step"));
  // Another train_dir's checkpoint is not this run's.
  tw::io::CheckpointDir elsewhere(other.path);
  save_checkpoint(elsewhere, *s.model, s.sgd, {.step = 5}, {}, 0);
  CHECK_THROWS_WITH(find_checkpoint(dir.path, (other.path / "ckpt-0000000005").string()),
                    Catch::Contains("is not one of") && Catch::Contains("copy the checkpoint there"));
  CHECK_THROWS_WITH(find_checkpoint(other.path / "missing", "5"), Catch::Contains("does not exist"));
}

TEST_CASE("a checkpoint holds the loss scaler's state, and a damaged one loads nothing",
          "[train][checkpoint][fp16]") {
  fresh_devices();
  TempDir dir;
  tw::io::CheckpointDir ckdir(dir.path);
  TfcnnSgd source(1);
  tw::tower::LossScaler scaler;
  scaler.load_state({.scale = 256.5, .good_steps = 3, .skipped_steps = 1});
  const fs::path ckpt =
      save_checkpoint(ckdir, *source.model, source.sgd, {.step = 4, .epoch = 0, .step_in_epoch = 4}, {}, 0, &scaler);
  CHECK(read_checkpoint_info(ckpt).metadata.at("loss_scale") == "256.5");

  TfcnnSgd target(2);
  tw::tower::LossScaler restored;
  load_checkpoint(ckpt, *target.model, target.sgd, &restored);
  CHECK(restored.state().scale == 256.5);
  CHECK(restored.state().good_steps == 3);
  CHECK(restored.state().skipped_steps == 1);
  CHECK(flat_params(*target.model) == flat_params(*source.model));

  // A negative count is refused before the model or the optimizer change.
  const fs::path bad = save_checkpoint(ckdir, *source.model, source.sgd, {.step = 5, .epoch = 0, .step_in_epoch = 5},
                                       {{"loss_scale", "8"}, {"loss_scale_skipped_steps", "-2"}}, 0);
  TfcnnSgd untouched(3);
  const auto before = flat_params(*untouched.model);
  tw::tower::LossScaler fresh;
  CHECK_THROWS_WITH(load_checkpoint(bad, *untouched.model, untouched.sgd, &fresh),
                    Catch::Contains("loss scale metadata ('8'") && Catch::Contains("skipped '-2'"));
  CHECK(flat_params(*untouched.model) == before);
  CHECK(untouched.sgd.step_count() == 0);
  CHECK(fresh.state().scale == tw::tower::LossScaler().state().scale);
}

TEST_CASE("a checkpoint holds the update counts of parameters a frozen group held back, and refuses "
          "damaged ones",
          "[train][checkpoint][groups]") {
  fresh_devices();
  TempDir dir;
  tw::io::CheckpointDir ckdir(dir.path);
  auto model = tw::models::make_model("tfcnn", tw::Device::cpu(0), {.num_classes = 10, .seed = 1});
  std::vector<tw::optim::ParameterSlot> slots;
  std::size_t offset = 0;
  for (const auto& [name, t] : model->named_parameters()) {
    slots.push_back({name, offset, static_cast<std::size_t>(t.numel()), t.shape()});
    offset += static_cast<std::size_t>(t.numel());
  }
  auto adam_over = [&](std::vector<float>& p) {
    return std::make_unique<tw::optim::Adam>(
        tw::optim::ParameterSet::single(std::span<float>(p), std::span<const float>(p), slots),
        tw::optim::AdamOptions{.lr = 1e-3},
        std::vector<tw::optim::ParameterGroup>{{.name = "head", .slots = tw::optim::slots_containing("fc3"), .frozen = true}});
  };
  auto params = model->flat_parameters().to_host();
  auto adam = adam_over(params);
  adam->step();
  adam->step();
  adam->set_group_frozen("head", false);
  adam->step();
  REQUIRE(adam->state().slot_steps == std::map<std::string, std::int64_t>{{"fc3.weight", 1}, {"fc3.bias", 1}});
  const fs::path ckpt = save_checkpoint(ckdir, *model, *adam, {.step = 3}, {}, 0);

  std::vector<float> other = params;
  auto resumed = adam_over(other);
  load_checkpoint(ckpt, *model, *resumed);
  CHECK(resumed->state().step == 3);
  CHECK(resumed->state().slot_steps == adam->state().slot_steps);

  // Update counts above the step are damage: refused, naming the field.
  std::vector<float> fresh = params;
  auto never_stepped = adam_over(fresh);
  TempDir bad_dir;
  tw::io::CheckpointDir bad(bad_dir.path);
  const fs::path damaged =
      save_checkpoint(bad, *model, *never_stepped, {.step = 3}, {{"optimizer_slot_steps", R"({"fc3.weight": 9})"}}, 0);
  CHECK_THROWS_WITH(load_checkpoint(damaged, *model, *resumed),
                    Catch::Contains("optimizer_slot_steps") && Catch::Contains("fc3.weight"));
}
