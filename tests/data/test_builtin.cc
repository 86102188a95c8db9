#include <catch2/catch.hpp>

#include <set>
#include <string>

#include "core/error.h"
#include "data/builtin.h"
#include "data/open.h"
#include "tests/data/helpers.h"

using namespace towerflow;
using namespace towerflow::data;

namespace {

std::vector<std::uint8_t> item(const Dataset& d, std::int64_t i) {
  std::vector<std::uint8_t> px(d.shape().bytes());
  d.read(i, px);
  return px;
}

// Nearest class mean on raw pixels: a weak learner that shows how much of the signal is trivial.
double nearest_mean_accuracy(const Dataset& train, const Dataset& test) {
  const std::size_t d = train.shape().bytes();
  const int k = train.num_classes();
  std::vector<double> mean(k * d, 0.0);
  std::vector<int> count(k, 0);
  for (std::int64_t i = 0; i < train.size(); ++i) {
    const auto px = item(train, i);
    const int y = train.label(i);
    ++count[y];
    for (std::size_t p = 0; p < d; ++p) mean[y * d + p] += px[p];
  }
  for (int y = 0; y < k; ++y)
    for (std::size_t p = 0; p < d; ++p) mean[y * d + p] /= count[y];
  int correct = 0;
  for (std::int64_t i = 0; i < test.size(); ++i) {
    const auto px = item(test, i);
    int best = 0;
    double best_dist = 1e300;
    for (int y = 0; y < k; ++y) {
      double dist = 0;
      for (std::size_t p = 0; p < d; ++p) dist += (px[p] - mean[y * d + p]) * (px[p] - mean[y * d + p]);
      if (dist < best_dist) best_dist = dist, best = y;
    }
    correct += best == test.label(i);
  }
  return static_cast<double>(correct) / static_cast<double>(test.size());
}

}  // namespace

TEST_CASE("The built-in set is a pure function of its seed, balanced, with disjoint splits", "[data][builtin]") {
  const Builtin a(Split::Train, {.train_size = 200});
  const Builtin b(Split::Train, {.train_size = 300});
  const Builtin other_seed(Split::Train, {.train_size = 200, .seed = 1});
  const Builtin test(Split::Test, {.test_size = 200});
  REQUIRE(a.size() == 200);
  CHECK(a.shape() == ImageShape{32, 32, 3});
  CHECK(a.num_classes() == 10);
  CHECK(a.class_names().size() == 10);
  std::set<std::vector<std::uint8_t>> train_images;
  std::vector<int> per_class(10, 0);
  int differs = 0;
  for (std::int64_t i = 0; i < 200; ++i) {
    const auto px = item(a, i);
    CHECK(px == item(b, i));  // the size does not change the images
    differs += px != item(other_seed, i);
    ++per_class[a.label(i)];
    train_images.insert(px);
  }
  CHECK(differs == 200);
  CHECK(per_class == std::vector<int>(10, 20));
  CHECK(train_images.size() == 200);
  for (std::int64_t i = 0; i < 200; ++i) CHECK(train_images.count(item(test, i)) == 0);
  CHECK_THROWS_AS(Builtin(Split::Train, {.train_size = 0}), InvalidArgument);
}

TEST_CASE("The built-in set has structure beyond colour: a nearest-mean classifier is weak", "[data][builtin]") {
  const Builtin train(Split::Train, {.train_size = 2000});
  const Builtin test(Split::Test, {.test_size = 500});
  const double accuracy = nearest_mean_accuracy(train, test);
  INFO("nearest class mean accuracy " << accuracy);
  CHECK(accuracy > 0.15);  // the classes carry signal (chance is 0.10) ...
  CHECK(accuracy < 0.60);  // ... but mostly in shape, which a CNN has to learn
}

TEST_CASE("open_dataset builds the built-in set without files", "[data][builtin]") {
  auto d = open_dataset(DatasetKind::Builtin, "", Split::Test, {.builtin = {.test_size = 30}});
  CHECK(d->size() == 30);
  CHECK(d->describe().find("built-in") != std::string::npos);
}
