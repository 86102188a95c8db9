#include <catch2/catch.hpp>

#include <span>
#include <vector>

#include "core/error.h"
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

