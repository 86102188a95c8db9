#pragma once
// Private to train/: how the run's JSON lines are written (records.cc, startup.cc, reporter.cc).

#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

namespace towerflow::train::detail {

// One JSON line. Names and paths come from the user's files and may not be UTF-8: such bytes
// become U+FFFD instead of an exception in the middle of a run.
inline std::string json_line(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

// Short numbers in JSON: 0.4321 rather than 0.43210000000000004.
inline double round_to(double x, int digits) {
  if (!std::isfinite(x)) return x;
  const double scale = std::pow(10.0, digits);
  return std::round(x * scale) / scale;
}

}  // namespace towerflow::train::detail
