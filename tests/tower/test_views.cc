// Test-time augmentation (data/views.h, Trainer::evaluate with views) against PyTorch: airbench94's
// views of 6x6 images through a linear model (tests/fixtures/compute/airbench.bin, "tta.*").

#include <catch2/catch.hpp>

#include <cmath>

#include "core/tensor/ops.h"
#include "data/views.h"
#include "tests/core/tensor/fixtures.h"
#include "tests/tower/four_cpu_devices.h"
#include "tower/tower.h"

using namespace towerflow;

namespace {

const std::map<std::string, testing::FixtureArray>& fx() {
  static const auto f = testing::load_fixture("airbench.bin");
  return f;
}

constexpr int kSide = 6, kChannels = 3, kClasses = 5;
constexpr data::ImageShape kShape{kSide, kSide, kChannels};

// logits = W flatten(x), flatten in PyTorch's (c, h, w) order.
class Linear : public nn::Module {
 public:
  explicit Linear(const Device& d) : Module(d) {
    weight_ = register_parameter("weight", Tensor::from_host(std::span<const float>(fx().at("tta.weight").f),
                                                             {kClasses, kChannels * kSide * kSide}, d));
    flatten();
  }
  Tensor forward(const Tensor& x) override { return linear(towerflow::flatten(x), weight_, Tensor()); }

 private:
  Tensor weight_;
};

// The same in plain loops over one NHWC image.
std::vector<double> linear_logits(const float* image) {
  const auto& w = fx().at("tta.weight").f;
  std::vector<double> out(kClasses, 0.0);
  for (int k = 0; k < kClasses; ++k)
    for (int c = 0; c < kChannels; ++c)
      for (int y = 0; y < kSide; ++y)
        for (int x = 0; x < kSide; ++x)
          out[k] += double(w[((k * kChannels + c) * kSide + y) * kSide + x]) * image[(y * kSide + x) * kChannels + c];
  return out;
}

}  // namespace

TEST_CASE("test views: airbench94's six views weighted as PyTorch's reference weights them",
          "[views][torch]") {
  const auto& images = fx().at("tta.images").f;
  const int n = 3;
  for (int level : {0, 1, 2}) {
    INFO("level " << level);
    const auto views = data::test_views(level);
    double total = 0;
    for (const auto& v : views) total += v.weight;
    CHECK(total == 1.0);
    std::vector<float> got(static_cast<std::size_t>(n) * kClasses, 0.0f);
    std::vector<float> view(images.size());
    for (const auto& v : views) {
      data::apply_view(v, kShape, n, images.data(), view.data());
      for (int i = 0; i < n; ++i) {
        const auto z = linear_logits(view.data() + static_cast<std::size_t>(i) * kShape.bytes());
        for (int k = 0; k < kClasses; ++k) got[static_cast<std::size_t>(i * kClasses + k)] += static_cast<float>(v.weight * z[k]);
      }
    }
    testing::require_close(got, fx().at("tta.logits" + std::to_string(level)).f, 1e-5, 1e-5, "logits");
  }
}

TEST_CASE("test views: reflect shifts and mirror on a 3x3 image, bad levels and shifts refused",
          "[views]") {
  // One channel, pixel (y, x) = 3y + x.
  std::vector<float> image(9);
  for (int i = 0; i < 9; ++i) image[i] = static_cast<float>(i);
  std::vector<float> out(9);
  data::apply_view({.dy = -1, .dx = -1}, {3, 3, 1}, 1, image.data(), out.data());
  // Row -1 is row 1 and column -1 is column 1 (reflection without repeating the edge).
  CHECK(out == std::vector<float>{4, 3, 4, 1, 0, 1, 4, 3, 4});
  data::apply_view({.flip = true, .dy = 1, .dx = 1}, {3, 3, 1}, 1, image.data(), out.data());
  // Shifted up-left (row 3 is row 1), then mirrored.
  CHECK(out == std::vector<float>{4, 5, 4, 7, 8, 7, 4, 5, 4});
  CHECK_THROWS_WITH(data::test_views(3), Catch::Contains("level 3"));
  CHECK_THROWS_WITH(data::apply_view({.dy = 3}, {3, 3, 1}, 1, image.data(), out.data()),
                    Catch::Contains("(3, 0)") && Catch::Contains("3x3"));
  CHECK(data::plain_views({}));
  CHECK(data::plain_views(data::test_views(0)));
  CHECK_FALSE(data::plain_views(data::test_views(1)));
}

TEST_CASE("Trainer::evaluate with views: loss and accuracy of the weighted logits, on two towers",
          "[views][torch]") {
  tower::Trainer trainer([](const Device& d) { return std::make_shared<Linear>(d); }, testing::cpus(2), {});
  const auto& images = fx().at("tta.images").f;
  const std::vector<std::int32_t> labels{4, 0, 2};
  tower::HostBatch batch{.images = images, .labels = labels, .n = 3, .h = kSide, .w = kSide, .c = kChannels};
  for (int level : {0, 2}) {
    INFO("level " << level);
    const auto& logits = fx().at("tta.logits" + std::to_string(level)).f;
    double loss = 0;
    int correct = 0;
    for (int i = 0; i < 3; ++i) {
      const float* z = logits.data() + i * kClasses;
      double m = z[0], s = 0;
      for (int k = 0; k < kClasses; ++k) m = std::max(m, double(z[k]));
      for (int k = 0; k < kClasses; ++k) s += std::exp(z[k] - m);
      loss += m + std::log(s) - z[labels[i]];
      correct += std::max_element(z, z + kClasses) - z == labels[i];
    }
    const tower::EvalResult r = trainer.evaluate(batch, data::test_views(level));
    CHECK(r.loss == Approx(loss / 3).epsilon(1e-5));
    CHECK(r.correct == correct);
  }
}
