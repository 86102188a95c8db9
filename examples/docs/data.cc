// docs/data.md: CIFAR-10 from its binary files, a loader with augmentation on two threads, and
// the loop that feeds a trainer. Usage: doc_data CIFAR10_DIR [epochs] (default 30).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/platform/registry.h"
#include "data/data.h"
#include "models/models.h"
#include "tower/tower.h"

namespace tw = towerflow;

int main(int argc, char** argv) {
  const std::string data_dir = argc > 1 ? argv[1] : "data/cifar-10-batches-bin";
  const int epochs = argc > 2 ? std::atoi(argv[2]) : 30;
  auto devices = tw::logical_devices(tw::ProcessOptions{.device_count = {{"CPU", 2}}});
  tw::tower::Trainer trainer{tw::models::factory("tfcnn"), devices};
  long batches = 0;
  // [docs:loader]
  namespace data = towerflow::data;
  data::Cifar10 train{data_dir, data::Split::Train};
  data::Loader loader{train, {.batch = 128, .augment = data::cifar_augment(), .seed = 1, .threads = 2}};
  for (int epoch = 0; epoch < epochs; ++epoch)
    for (const data::Batch& batch : loader)      // epoch 0, 1, ... (or loader.set_epoch(e))
      trainer.forward_backward(batch);           // batch.images: n*32*32*3 floats, batch.labels: n
  // [end]
  for (const data::Batch& batch : loader) batches += batch.n > 0;
  std::printf("%lld training images, %ld batches of 128 per epoch\n", static_cast<long long>(train.size()), batches);
  return batches > 0 ? 0 : 1;
}
