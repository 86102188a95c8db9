#pragma once
// Fixtures for tests of fit(): a model of the test's own, a tiny data set on two CPU towers, and a
// hook that records every call.

#include <memory>
#include <string>
#include <vector>

#include "core/nn/init.h"
#include "core/nn/layers.h"
#include "core/tensor/ops.h"
#include "data/data.h"
#include "optim/optim.h"
#include "tower/tower.h"
#include "train/fit_test_util.h"
#include "train/train.h"

namespace towerflow::train::testing {

namespace tw = towerflow;
namespace fs = std::filesystem;

// A model of the test's own, as a research program would write one: two linear layers.
class Mlp : public tw::nn::Module {
 public:
  Mlp(const tw::Device& device, std::uint64_t seed) : Module(device) {
    tw::nn::InitRng rng(seed);
    fc1_ = register_module("fc1", std::make_shared<tw::nn::Linear>(device, 32 * 32 * 3, 32, rng));
    fc2_ = register_module("fc2", std::make_shared<tw::nn::Linear>(device, 32, 10, rng));
  }
  tw::Tensor forward(const tw::Tensor& x) override { return fc2_->forward(tw::relu(fc1_->forward(tw::flatten(x)))); }

 private:
  std::shared_ptr<tw::nn::Linear> fc1_, fc2_;
};

inline tw::nn::ModelFactory mlp_factory() {
  return [](const tw::Device& d) {
    auto m = std::make_shared<Mlp>(d, 7);
    m->flatten();
    return m;
  };
}

// 128 training and 64 test images, two CPU towers, SGD.
struct Setup {
  tw::data::Builtin train{tw::data::Split::Train, {.train_size = 128, .test_size = 64}};
  tw::data::Builtin test{tw::data::Split::Test, {.train_size = 128, .test_size = 64}};
  tw::tower::Trainer trainer;
  tw::optim::Sgd sgd;
  explicit Setup(tw::nn::ModelFactory factory = mlp_factory(), double lr = 0.02,
                 tw::tower::TrainerOptions options = {})
      : trainer(std::move(factory), {tw::Device::cpu(0), tw::Device::cpu(1)}, std::move(options)),
        sgd(trainer.parameters(), {.lr = lr, .momentum = 0.9}) {}
};

// 2 epochs of 4 steps, evaluation every epoch, records every 2 steps, a checkpoint every 3, 2 kept.
inline FitOptions tiny(const fs::path& dir) {
  return {.batch = 32, .loader_threads = 0, .epochs = 2, .schedule = schedule("cosine", 0.02), .log_every = 2,
          .train_dir = dir, .save_every = 3, .keep_checkpoints = 2};
}

// Every hook call, as "event:step".
struct Recorder : Hook {
  std::vector<std::string> events;
  std::int64_t last_step = 0;
  void on_start(const StartInfo& s) override { events.push_back("start:" + std::to_string(s.position.step)); }
  void on_step(const StepInfo& s) override {
    last_step = s.step;
    events.push_back("step:" + std::to_string(s.step));
  }
  void on_log(const TrainRecord& r) override { events.push_back("log:" + std::to_string(r.step)); }
  void on_epoch_end(std::int64_t e) override { events.push_back("epoch_end:" + std::to_string(e)); }
  void on_eval(const EvalRecord& r) override { events.push_back("eval:" + std::to_string(r.step)); }
  void on_checkpoint(const CheckpointRecord& r) override { events.push_back("ckpt:" + std::to_string(r.position.step)); }
  void on_end(const FitResult& r) override { events.push_back("end:" + std::to_string(r.steps)); }
};

inline std::vector<float> params_of(tw::tower::Trainer& t) { return t.model().flat_parameters().to_host(); }


}  // namespace towerflow::train::testing
