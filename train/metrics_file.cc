#include "train/metrics_file.h"

#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "train/reporter.h"

namespace towerflow::train {
namespace fs = std::filesystem;

void MetricsFile::on_start(const StartInfo& start) {
  std::string kept;
  std::error_code ec;
  if (start.position.step > 0 && fs::exists(path_, ec)) {
    std::istringstream in(io::read_file(path_));
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) continue;
      if (j["step"].get<std::int64_t>() <= start.position.step) kept += line + "\n";
    }
  }
  if (!path_.parent_path().empty()) fs::create_directories(path_.parent_path(), ec);
  io::write_file_atomically(path_, kept);
  out_ = io::LineAppender(path_);
}

void MetricsFile::on_log(const TrainRecord& r) {
  if (out_.is_open()) out_.append(to_json(r));
}

void MetricsFile::on_eval(const EvalRecord& r) {
  if (out_.is_open()) out_.append(to_json(r));
}

}  // namespace towerflow::train
