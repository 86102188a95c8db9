#include "train/records.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "train/json_line.h"

namespace towerflow::train {
namespace {

using nlohmann::ordered_json;
using detail::json_line;
using detail::round_to;

ordered_json number_or_null(double x) { return std::isfinite(x) ? ordered_json(x) : ordered_json(nullptr); }

ordered_json json_of(const TrainRecord& r) {
  ordered_json j;
  j["step"] = r.step;
  j["epoch"] = round_to(r.epoch, 3);
  j["loss"] = number_or_null(round_to(r.loss, 5));
  j["acc"] = round_to(r.acc, 5);
  j["lr"] = round_to(r.lr, 8);
  j["img_per_s"] = round_to(r.img_per_s, 1);
  if (r.loss_scale > 0) {  // fp16
    j["loss_scale"] = r.loss_scale;
    j["skipped_steps"] = r.skipped_steps;
  }
  if (!r.split.empty()) j["split"] = r.split;
  return j;
}

ordered_json json_of(const EvalRecord& r) {
  ordered_json j;
  j["step"] = r.step;
  j["epoch"] = round_to(r.epoch, 3);
  const std::string p(metric_prefix(r.set));
  j[p + "_loss"] = number_or_null(round_to(r.test_loss, 5));
  j[p + "_acc"] = round_to(r.test_acc, 5);
  j[p + "_top5"] = round_to(r.test_top5, 5);
  if (r.classes > 0) {
    ordered_json per_class = ordered_json::array();
    for (const auto& a : class_accuracy(r.classes, r.confusion))
      per_class.push_back(a ? ordered_json(round_to(*a, 5)) : ordered_json(nullptr));
    j[p + "_class_acc"] = per_class;
  }
  j["examples"] = r.examples;
  if (r.views > 1) j["views"] = r.views;
  return j;
}

}  // namespace

std::string_view metric_prefix(EvalSet set) { return set == EvalSet::Validation ? "val" : "test"; }

std::vector<std::optional<double>> class_accuracy(int classes, const std::vector<std::int64_t>& confusion) {
  std::vector<std::optional<double>> out(static_cast<std::size_t>(std::max(classes, 0)));
  if (confusion.size() != out.size() * out.size()) return out;
  for (std::size_t t = 0; t < out.size(); ++t) {
    std::int64_t rows = 0;
    for (std::size_t p = 0; p < out.size(); ++p) rows += confusion[t * out.size() + p];
    if (rows > 0) out[t] = static_cast<double>(confusion[t * out.size() + t]) / static_cast<double>(rows);
  }
  return out;
}

std::string to_json(const TrainRecord& r) { return json_line(json_of(r)); }
std::string to_json(const EvalRecord& r) { return json_line(json_of(r)); }

}  // namespace towerflow::train
