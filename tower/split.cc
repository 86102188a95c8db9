#include "tower/split.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace towerflow::tower {

namespace {

std::vector<double> weights_of(const SplitPolicy& policy, std::size_t n) {
  if (const auto* w = std::get_if<WeightedSplit>(&policy)) {
    if (w->weights.size() != n)
      raise<InvalidArgument>("split weights:", to_string(policy).substr(8), " gives ", w->weights.size(),
                             " weights for ", n, " devices; give one weight per device");
    for (double x : w->weights)
      if (!(x > 0) || !std::isfinite(x))
        raise<InvalidArgument>("split weight ", x, " is invalid; weights are positive numbers (e.g. weights:3,1)");
    // Relative to the largest, so that sums and products of huge weights stay finite.
    std::vector<double> scaled = w->weights;
    const double top = *std::max_element(scaled.begin(), scaled.end());
    for (double& x : scaled) x /= top;
    return scaled;
  }
  return std::vector<double>(n, 1.0);
}

// Exact shares when they are whole numbers (to a relative 1e-9), else empty.
std::vector<int> exact_shares(int batch, const std::vector<double>& w) {
  const double total = std::accumulate(w.begin(), w.end(), 0.0);
  std::vector<int> rows;
  int sum = 0;
  for (double x : w) {
    const double share = batch * x / total;
    const double r = std::round(share);
    if (std::abs(share - r) > 1e-9 * std::max(1.0, share)) return {};
    rows.push_back(static_cast<int>(r));
    sum += rows.back();
  }
  if (sum != batch) return {};
  return rows;
}

std::vector<int> largest_remainder(int batch, const std::vector<double>& w) {
  const double total = std::accumulate(w.begin(), w.end(), 0.0);
  const std::size_t n = w.size();
  std::vector<int> rows(n);
  std::vector<double> frac(n);
  int given = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double share = batch * w[i] / total;
    rows[i] = static_cast<int>(std::floor(share + 1e-9));
    frac[i] = share - rows[i];
    given += rows[i];
  }
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return frac[a] > frac[b]; });
  for (std::size_t k = 0; given < batch; k = (k + 1) % n, ++given) rows[order[k]] += 1;
  for (std::size_t k = n; given > batch; k = (k + n - 1) % n) {  // rounding guard: never in practice
    if (rows[order[k % n]] > 0) {
      rows[order[k % n]] -= 1;
      --given;
    }
  }
  return rows;
}

}  // namespace

namespace {
AutoSplit parse_auto(std::string_view spec) {
  AutoSplit a;
  std::string_view rest = spec.size() > 4 ? spec.substr(5) : std::string_view{};
  if (spec.size() > 4 && (spec[4] != ':' || rest.empty()))
    raise<InvalidArgument>("split '", spec, "' is not a split policy; use auto, or auto:NAME=VALUE,... "
                           "(e.g. auto:freeze_after=200)");
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    const auto eq = item.find('=');
    const std::string_view name = item.substr(0, eq), value = eq == std::string_view::npos ? "" : item.substr(eq + 1);
    double x = 0;
    auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), x);
    if (value.empty() || ec != std::errc() || ptr != value.data() + value.size())
      raise<InvalidArgument>("split '", spec, "' has '", item, "', which is not NAME=NUMBER; e.g. auto:freeze_after=200");
    const bool whole = x == std::floor(x) && std::abs(x) < 1e9;
    if (name == "freeze_after" && whole) a.freeze_after = static_cast<int>(x);
    else if (name == "warmup" && whole) a.warmup = static_cast<int>(x);
    else if (name == "smoothing") a.smoothing = x;
    else if (name == "min_share") a.min_share = x;
    else if (name == "hysteresis") a.hysteresis = x;
    else
      raise<InvalidArgument>("split '", spec, "' has '", item, "'; auto takes freeze_after and warmup (steps), "
                             "smoothing, min_share and hysteresis (fractions)");
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
  }
  check(a);
  return a;
}
}  // namespace

SplitPolicy parse_split(std::string_view spec) {
  if (spec == "even") return EvenSplit{};
  if (spec == "per_tower") return PerTowerBatch{};
  if (spec == "auto" || spec.starts_with("auto:")) return parse_auto(spec);
  if (spec.starts_with("weights:")) {
    WeightedSplit w;
    std::string_view rest = spec.substr(8);
    while (!rest.empty()) {
      const auto comma = rest.find(',');
      const std::string_view item = rest.substr(0, comma);
      double x = 0;
      auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), x);
      if (item.empty() || ec != std::errc() || ptr != item.data() + item.size() || !(x > 0))
        raise<InvalidArgument>("split '", spec, "' has a bad weight '", item,
                               "'; weights are positive numbers, one per device (e.g. weights:3,1)");
      w.weights.push_back(x);
      rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    }
    if (w.weights.empty())
      raise<InvalidArgument>("split '", spec, "' lists no weights; use e.g. weights:3,1");
    return w;
  }
  raise<InvalidArgument>("split '", spec, "' is not a split policy; use even, weights:W0,W1,... "
                         "(e.g. weights:3,1), per_tower or auto");
}

std::string to_string(const SplitPolicy& policy) {
  if (std::holds_alternative<EvenSplit>(policy)) return "even";
  if (std::holds_alternative<PerTowerBatch>(policy)) return "per_tower";
  if (const auto* a = std::get_if<AutoSplit>(&policy)) return to_string(*a);
  std::string s = "weights:";
  bool first = true;
  for (double x : std::get<WeightedSplit>(policy).weights) {
    s += (first ? "" : ",") + str(x);
    first = false;
  }
  return s;
}

int global_batch(int configured_batch, int towers, const SplitPolicy& policy) {
  return std::holds_alternative<PerTowerBatch>(policy) ? configured_batch * towers : configured_batch;
}

std::vector<int> split_batch(int batch, const std::vector<Device>& devices, const SplitPolicy& policy,
                             Remainder remainder) {
  if (devices.empty()) raise<InvalidArgument>("cannot split a batch over an empty device list");
  if (batch < 1) raise<InvalidArgument>("batch ", batch, " is invalid; a batch has at least one row");
  const std::vector<double> w = weights_of(policy, devices.size());
  if (remainder == Remainder::Spread || std::holds_alternative<AutoSplit>(policy)) return largest_remainder(batch, w);
  if (auto rows = exact_shares(batch, w); !rows.empty()) return rows;

  auto [below, above] = nearest_exact_batches(batch, devices.size(), policy);
  std::string nearest = below && above ? str(below, " or ", above) : str(below ? below : above);
  const bool even = !std::holds_alternative<WeightedSplit>(policy);
  raise<InvalidArgument>("batch ", batch, " cannot be split ",
                         even ? "evenly" : str("in the proportions ", to_string(policy)), " over ",
                         devices.size(), " devices (", device_list(devices), "); use batch ", nearest,
                         std::holds_alternative<PerTowerBatch>(policy)
                             ? " (with per_tower batches the global batch is towers x per-tower batch)"
                             : "",
                         ", or let the towers' shares differ by a row (TrainerOptions::remainder = Remainder::Spread)");
}

void check_batch_split(int batch, const std::vector<Device>& devices, const SplitPolicy& policy,
                       Remainder remainder, int micro_batches) {
  if (remainder == Remainder::Spread || std::holds_alternative<AutoSplit>(policy) || batch < 1 || devices.empty()) return;
  const std::vector<double> w = weights_of(policy, devices.size());
  auto splits = [&](int rows) { return !exact_shares(rows, w).empty(); };
  // The micro-batches of b rows in `parts` parts, as the trainer cuts them.
  auto micro = [](int b, int parts) { return largest_remainder(b, std::vector<double>(parts, 1.0)); };
  const std::string how = std::holds_alternative<WeightedSplit>(policy)
                              ? str("in the proportions ", to_string(policy), " (TrainerOptions::split)")
                              : std::string("evenly");
  const std::string over = str(" over ", devices.size(), " towers (", device_list(devices), ")");
  const std::string per_tower = std::holds_alternative<PerTowerBatch>(policy)
                                    ? " (with per_tower batches the global batch is towers x per-tower batch)"
                                    : "";
  const std::string spread = "TrainerOptions::remainder = Remainder::Spread (the towers' shares then differ by a row)";
  const int k = std::max(1, micro_batches);
  if (k == 1 || batch < k) {
    if (splits(batch)) return;
    auto [below, above] = nearest_exact_batches(batch, devices.size(), policy);
    raise<InvalidArgument>("FitOptions::batch = ", batch, " cannot be split ", how, over, per_tower,
                           "; use FitOptions::batch = ", below && above ? str(below, " or ", above) : str(below ? below : above),
                           ", or ", spread);
  }
  const std::vector<int> parts = micro(batch, k);
  for (int m : parts) {
    if (splits(m)) continue;
    // Batches near this one whose k micro-batches all split, and micro-batch counts near k that do.
    auto all_split = [&](int b, int n) {
      if (b < n) return false;
      for (int r : micro(b, n))
        if (!splits(r)) return false;
      return true;
    };
    const int reach = 64 * k * static_cast<int>(devices.size());  // how far to look
    std::vector<int> batches;
    for (int d = 1; d <= std::min(batch, reach) && batches.size() < 2; ++d) {
      if (all_split(batch - d, k)) batches.push_back(batch - d);
      if (all_split(batch + d, k) && batches.size() < 2) batches.push_back(batch + d);
    }
    int steps = 0;
    for (int d = 1; d <= 4 * k && steps == 0; ++d) {
      if (k - d >= 1 && all_split(batch, k - d)) steps = k - d;
      else if (k + d <= batch && all_split(batch, k + d)) steps = k + d;
    }
    std::string sizes;
    std::vector<int> seen;
    for (int r : parts)
      if (std::find(seen.begin(), seen.end(), r) == seen.end()) {
        sizes += str(seen.empty() ? "" : " and ", r);
        seen.push_back(r);
      }
    std::string fixes;
    if (!batches.empty()) {
      fixes += "FitOptions::batch = ";
      for (std::size_t i = 0; i < batches.size(); ++i) fixes += str(i ? " or " : "", batches[i]);
    }
    if (steps > 0) fixes += str(fixes.empty() ? "" : ", ", "TrainerOptions::accumulation_steps = ", steps);
    raise<InvalidArgument>("FitOptions::batch = ", batch, " with TrainerOptions::accumulation_steps = ", k,
                           " gives micro-batches of ", sizes, " rows, and one of ", m, " rows cannot be split ", how,
                           over, per_tower, "; use ", fixes.empty() ? std::string() : fixes + ", or ", spread);
  }
}

std::pair<int, int> nearest_exact_batches(int batch, std::size_t towers, const SplitPolicy& policy) {
  const std::vector<double> w = weights_of(policy, towers);
  int below = 0, above = 0;
  for (int d = 1; d <= 1 << 20 && (below == 0 || above == 0); ++d) {
    if (below == 0 && batch - d >= 1 && !exact_shares(batch - d, w).empty()) below = batch - d;
    if (above == 0 && !exact_shares(batch + d, w).empty()) above = batch + d;
  }
  return {below, above};
}

}  // namespace towerflow::tower
