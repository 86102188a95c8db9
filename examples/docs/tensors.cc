// docs/tensors-and-models.md: one ResNet-20 training step by hand, then an evaluation.
#include <cstdint>
#include <cstdio>
#include <vector>

#include "core/tensor/ops.h"
#include "models/models.h"

namespace tw = towerflow;

int main() {
  std::vector<float> images(128 * 32 * 32 * 3, 0.5f);
  std::vector<std::int32_t> labels(128, 3);
  // [docs:step]
  auto model = tw::models::make_model("resnet20", tw::Device::cpu(0), {.num_classes = 10, .seed = 0});
  tw::Tensor x = tw::Tensor::from_host(images, {128, 32, 32, 3}, model->device());  // NHWC float32
  tw::Tensor y = tw::Tensor::from_host(labels, {128}, model->device());             // int32
  model->zero_grad();
  tw::Tensor loss = tw::softmax_cross_entropy(model->forward(x), y);  // {.scale = B, .label_smoothing = s}
  loss.backward();                       // gradients land in model->flat_gradients()
  { tw::NoGradGuard no_grad; model->eval(); double acc = tw::accuracy(model->forward(x), y);
  std::printf("top-1 %.3f\n", acc); }
  // [end]
  std::printf("loss %.4f\n", loss.to_host()[0]);
}
