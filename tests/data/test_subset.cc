#include <catch2/catch.hpp>

#include <map>
#include <set>
#include <vector>

#include "core/error.h"
#include "data/builtin.h"
#include "data/subset.h"

using namespace towerflow;
using namespace towerflow::data;

TEST_CASE("holdout is stratified, disjoint, complete and fixed by the seed", "[data][subset]") {
  Builtin set(Split::Train, {.train_size = 1000});  // labels cycle 0..9: 100 a class
  auto [train, val] = holdout(set, 0.1, 7);
  REQUIRE(val->size() == 100);
  REQUIRE(train->size() == 900);
  std::map<int, int> per_class;
  for (std::int64_t i = 0; i < val->size(); ++i) ++per_class[val->label(i)];
  for (int c = 0; c < 10; ++c) CHECK(per_class[c] == 10);

  // Disjoint and together the whole set, each in the parent's order.
  std::set<std::int64_t> all(train->indices().begin(), train->indices().end());
  for (std::int64_t i : val->indices()) CHECK(all.insert(i).second);
  CHECK(all.size() == 1000);
  CHECK(std::is_sorted(train->indices().begin(), train->indices().end()));
  CHECK(std::is_sorted(val->indices().begin(), val->indices().end()));

  // Items read through to the parent.
  std::vector<std::uint8_t> a(set.shape().bytes()), b(set.shape().bytes());
  const std::int64_t k = val->indices()[3];
  CHECK(val->read(3, a) == set.read(k, b));
  CHECK(a == b);
  CHECK(val->describe().find("validation part of") != std::string::npos);

  // The same seed holds out the same items; another seed others.
  CHECK(holdout(set, 0.1, 7).validation->indices() == val->indices());
  CHECK(holdout(set, 0.1, 8).validation->indices() != val->indices());
}

TEST_CASE("holdout refuses fractions that leave a side empty", "[data][subset]") {
  Builtin set(Split::Train, {.train_size = 20});
  CHECK_THROWS_AS(holdout(set, 0.0, 1), InvalidArgument);
  CHECK_THROWS_AS(holdout(set, 1.0, 1), InvalidArgument);
  CHECK_THROWS_WITH(holdout(set, 0.01, 1), Catch::Contains("leaves 20 training and 0 validation"));
  CHECK_THROWS_AS(Subset(set, {20}, "part"), InvalidArgument);
}
