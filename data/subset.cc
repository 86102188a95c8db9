#include "data/subset.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "data/rng.h"

namespace towerflow::data {

Subset::Subset(const Dataset& parent, std::vector<std::int64_t> indices, std::string what)
    : parent_(parent), indices_(std::move(indices)), what_(std::move(what)) {
  for (std::int64_t i : indices_)
    if (i < 0 || i >= parent_.size())
      raise<InvalidArgument>("subset of ", parent_.describe(), ": index ", i, " is outside [0, ", parent_.size(), ")");
}

std::int32_t Subset::read(std::int64_t i, std::span<std::uint8_t> out) const {
  return parent_.read(indices_[static_cast<std::size_t>(i)], out);
}

std::int32_t Subset::label(std::int64_t i) const { return parent_.label(indices_[static_cast<std::size_t>(i)]); }

std::string Subset::describe() const {
  return str(what_, " of ", parent_.describe(), ": ", indices_.size(), " images");
}

Holdout holdout(const Dataset& set, double fraction, std::uint64_t seed) {
  if (!(fraction > 0 && fraction < 1))
    raise<InvalidArgument>("validation fraction ", fraction, " is outside (0, 1); use e.g. 0.1 to hold out 10% of ",
                           set.describe());
  // Each class's items, in order; a seeded Fisher-Yates shuffle of each picks its held-out share.
  std::vector<std::vector<std::int64_t>> by_class(static_cast<std::size_t>(set.num_classes()));
  for (std::int64_t i = 0; i < set.size(); ++i) by_class[static_cast<std::size_t>(set.label(i))].push_back(i);
  std::vector<char> held(static_cast<std::size_t>(set.size()), 0);
  for (std::size_t c = 0; c < by_class.size(); ++c) {
    auto& items = by_class[c];
    const auto take = static_cast<std::size_t>(std::llround(fraction * static_cast<double>(items.size())));
    SampleRng rng(seed, RngStream::Holdout, c);
    for (std::size_t k = 0; k < take; ++k) {  // the first `take` of a shuffle
      const std::size_t j = k + rng.below(static_cast<std::uint32_t>(items.size() - k));
      std::swap(items[k], items[j]);
      held[static_cast<std::size_t>(items[k])] = 1;
    }
  }
  std::vector<std::int64_t> train, validation;
  for (std::int64_t i = 0; i < set.size(); ++i) (held[static_cast<std::size_t>(i)] ? validation : train).push_back(i);
  if (train.empty() || validation.empty())
    raise<InvalidArgument>("validation fraction ", fraction, " of ", set.describe(), " leaves ", train.size(),
                           " training and ", validation.size(), " validation images; use a fraction that keeps "
                           "both (at least one image of some class on each side)");
  return {std::make_unique<Subset>(set, std::move(train), "training part"),
          std::make_unique<Subset>(set, std::move(validation), "validation part")};
}

}  // namespace towerflow::data
