// docs/migrating-from-tf1.md: TensorFlow 1.x's multi-GPU CIFAR-10 tutorial (towers on every GPU,
// gradients averaged on /cpu:0, a per-tower batch, a staircase decay, a Saver) in towerflow.
// Usage: doc_tf1 CIFAR10_DIR [max_steps] [train_dir] (defaults: 1000000 steps, cifar10_train).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/platform/registry.h"
#include "data/data.h"
#include "models/models.h"
#include "optim/optim.h"
#include "tower/tower.h"
#include "train/train.h"

namespace tw = towerflow;

int main(int argc, char** argv) {
  const std::string data_dir = argc > 1 ? argv[1] : "data/cifar-10-batches-bin";
  const std::int64_t max_steps = argc > 2 ? std::atoll(argv[2]) : 1000000;
  const std::string train_dir = argc > 3 ? argv[3] : "cifar10_train";
  // [docs:tf1]
  tw::ProcessOptions config{.allow_growth = true, .allow_soft_placement = true};   // tf.ConfigProto
  auto devices = tw::logical_devices(config);       // the GPUs ('/gpu:%d' % i), else the CPU devices
  tw::tower::Trainer trainer{tw::models::factory("tfcnn"), devices,           // tower_loss(), reused variables
                             {.reduction = tw::tower::ParameterDevice{tw::Device::cpu(0)},  // average_gradients on /cpu:0
                              .split = tw::tower::PerTowerBatch{}}};                         // FLAGS.batch_size per tower
  tw::optim::Sgd opt{trainer.parameters(), {.lr = 0.1}};                      // GradientDescentOptimizer(lr)
  tw::data::Cifar10 train{data_dir, tw::data::Split::Train};                  // cifar10.distorted_inputs()
  tw::data::Cifar10 test{data_dir, tw::data::Split::Test};
  tw::train::Reporter log;                                                    // the tutorial's loss lines
  auto result = tw::train::fit(trainer, opt, train, &test,
                               {.batch = tw::tower::global_batch(128, int(devices.size()), tw::tower::PerTowerBatch{}),
                                .augment = tw::data::cifar_augment(),               // random crop, flip
                                .max_steps = max_steps,                              // FLAGS.max_steps
                                .schedule = tw::train::schedule("step:135000:0.1", 0.1),  // exponential_decay, staircase
                                .log_every = 10,
                                .train_dir = train_dir, .save_every = 1000,          // saver.save every 1000 steps
                                .resume = true},                                     // restore the latest checkpoint
                               {&log});
  // [end]
  std::printf("%lld steps, test top-1 %.2f%%\n", static_cast<long long>(result.steps), 100 * result.test_acc);
  return result.steps == max_steps ? 0 : 1;
}
