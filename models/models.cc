#include "models/models.h"

#include "core/error.h"
#include "models/airbench.h"
#include "models/resnet.h"
#include "models/tfcnn.h"

namespace towerflow::models {

namespace {
int resnet_depth(const std::string& name) {
  for (int depth : {20, 32, 44, 56, 110})
    if (name == "resnet" + std::to_string(depth)) return depth;
  return 0;
}

std::string known_names() {
  std::string s;
  for (const auto& n : model_names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}
}  // namespace

std::vector<std::string> model_names() {
  return {"tfcnn", "resnet20", "resnet32", "resnet44", "resnet56", "resnet110", "airbench94"};
}

std::shared_ptr<nn::Module> make_model(const std::string& name, const Device& device,
                                       ModelOptions opts) {
  nn::InitRng rng(opts.seed);
  std::shared_ptr<nn::Module> m;
  if (name == "tfcnn") {
    m = std::make_shared<TfCnn>(device, opts.num_classes, rng, opts.image_height, opts.image_width);
  } else if (int depth = resnet_depth(name)) {
    m = std::make_shared<CifarResNet>(device, depth, opts.num_classes, rng);
  } else if (name == "airbench94") {
    m = std::make_shared<Airbench94>(device, Airbench94Options{.num_classes = opts.num_classes}, rng);
  } else {
    raise<NotFound>("unknown model \"", name, "\"; known models: ", known_names());
  }
  m->flatten();
  m->train(true);
  return m;
}

nn::ModelFactory factory(const std::string& name, ModelOptions opts) {
  if (name != "tfcnn" && name != "airbench94" && !resnet_depth(name))
    raise<NotFound>("unknown model \"", name, "\"; known models: ", known_names());
  return [name, opts](const Device& device) { return make_model(name, device, opts); };
}

std::int64_t forward_macs_per_image(const std::string& name, int num_classes) {
  if (name == "tfcnn")
    return 64LL * 32 * 32 * 3 * 25 + 64LL * 16 * 16 * 64 * 25 + 4096LL * 384 + 384LL * 192 +
           192LL * num_classes;
  if (name == "airbench94") {
    // The whitening layer 31x31, then per group conv1 before and conv2 after its pooling.
    std::int64_t macs = 24LL * 31 * 31 * 3 * 4;
    int in = 24, hw = 31;
    for (int width : Airbench94Options{}.widths) {
      macs += static_cast<std::int64_t>(width) * hw * hw * in * 9;
      hw /= 2;
      macs += static_cast<std::int64_t>(width) * hw * hw * width * 9;
      in = width;
    }
    return macs + static_cast<std::int64_t>(in) * num_classes;
  }
  const int depth = resnet_depth(name);
  if (!depth) raise<NotFound>("unknown model \"", name, "\"; known models: ", known_names());
  const int n = (depth - 2) / 6;
  std::int64_t macs = 16LL * 32 * 32 * 3 * 9;  // conv1
  int in = 16, hw = 32;
  const int widths[3] = {16, 32, 64};
  for (int s = 0; s < 3; ++s) {
    for (int i = 0; i < n; ++i) {
      const int stride = (s > 0 && i == 0) ? 2 : 1;
      const int out_hw = hw / stride, c = widths[s];
      macs += static_cast<std::int64_t>(c) * out_hw * out_hw * in * 9;  // conv1
      macs += static_cast<std::int64_t>(c) * out_hw * out_hw * c * 9;   // conv2
      if (stride != 1 || in != c) macs += static_cast<std::int64_t>(c) * out_hw * out_hw * in;
      in = c;
      hw = out_hw;
    }
  }
  return macs + 64LL * num_classes;
}

}  // namespace towerflow::models
