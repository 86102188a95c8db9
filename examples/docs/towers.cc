// docs/towers.md: two CPU towers, all-reduce, SGD with a schedule, a loop over the loader and an
// evaluation (on the GPUs where there are some); then the same model on the two CPU devices with a
// 3:1 split and synchronised batch norm.
#include <cstdio>
#include <vector>

#include "core/platform/registry.h"
#include "data/data.h"
#include "models/models.h"
#include "optim/optim.h"
#include "tower/tower.h"

namespace tw = towerflow;

int main() {
  tw::ProcessOptions opts{.device_count = {{"CPU", 2}}};
  tw::data::Builtin train_set{tw::data::Split::Train, {.train_size = 256}};
  tw::data::Builtin test_set{tw::data::Split::Test, {.test_size = 64}};
  tw::data::Loader loader{train_set, {.batch = 128, .threads = 1}};
  tw::data::Loader test_loader{test_set, {.batch = 64, .shuffle = false, .threads = 0}};
  const auto& test_batch = *test_loader.begin();
  const std::int64_t total_steps = 2;
  // [docs:loop]
  auto devices = tw::logical_devices(opts);   // e.g. /cpu:0, /cpu:1 with [cpu] device_count = 2
  tw::tower::Trainer trainer{tw::models::factory("resnet20"), devices,
                             {.reduction = tw::tower::AllReduce{}, .split = tw::tower::EvenSplit{}}};
  tw::optim::Sgd sgd{trainer.parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-4}};
  sgd.set_schedule(tw::optim::parse_schedule("warmup:500,cosine", 0.1, total_steps));
  for (const auto& batch : loader) {
    float loss = trainer.forward_backward(batch);   // split, run every tower, reduce
    sgd.step();                                     // every replica, or once on the parameter device
    std::printf("loss %.3f\n", loss);
  }
  auto eval = trainer.evaluate(test_batch);         // loss and top-1, split over the towers
  // [end]
  std::printf("test loss %.4f, top-1 %.3f over %lld rows\n", eval.loss, eval.accuracy,
              static_cast<long long>(eval.rows));

  // [docs:weighted]
  // A faster device takes 3 rows for every 1 of the slower one; batch norm over the whole batch.
  std::vector<tw::Device> cpus{tw::Device::cpu(0), tw::Device::cpu(1)};
  tw::tower::Trainer weighted{tw::models::factory("resnet20"), cpus,
                              {.split = tw::tower::WeightedSplit{{3, 1}},
                               .batch_norm = tw::tower::BatchNormMode::Synchronised}};
  // [end]
  tw::optim::Sgd sgd2{weighted.parameters(), {.lr = 0.1}};
  for (const auto& batch : loader) {
    weighted.forward_backward(batch);
    sgd2.step();
    const auto& split = weighted.last_step().split;
    std::printf("3:1 split of %d rows: %d + %d\n", batch.n, split[0], split[1]);
    if (split[0] != 3 * split[1]) return 1;
    break;
  }
  return eval.rows == 64 ? 0 : 1;
}
