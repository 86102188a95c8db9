#include "train/lookahead.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "tower/trainer.h"

namespace towerflow::train {

namespace {
constexpr const char* kPrefix = "lookahead.";

nn::NamedTensors state_of(nn::Module& model) {
  nn::NamedTensors all = model.named_parameters();
  for (auto& b : model.named_buffers()) all.push_back(std::move(b));
  return all;
}
}  // namespace

double airbench_lookahead_decay(std::int64_t step, std::int64_t total) {
  const double f = total > 0 ? static_cast<double>(step) / static_cast<double>(total) : 1.0;
  return std::pow(0.95, 5) * f * f * f;
}

Lookahead::Lookahead(LookaheadOptions options) : options_(std::move(options)) {
  if (options_.every < 1) raise<InvalidArgument>("Lookahead: every ", options_.every, " must be at least 1 step");
  if (!options_.decay) raise<InvalidArgument>("Lookahead: decay must be a function of (step, total steps)");
}

void Lookahead::on_start(const StartInfo& info) {
  trainer_ = &info.trainer;
  total_steps_ = info.plan.total_steps;
  trainer_->sync();
  average_.clear();
  for (const auto& [name, t] : state_of(trainer_->model())) average_.push_back({name, t.to_host()});
  if (!info.resumed) return;
  std::size_t found = 0;
  for (const auto& saved : info.resumed_tensors) {
    if (!saved.name.starts_with(kPrefix)) continue;
    const std::string name = saved.name.substr(std::string_view(kPrefix).size());
    auto it = std::find_if(average_.begin(), average_.end(), [&](const auto& a) { return a.name == name; });
    if (it == average_.end() || it->values.size() != saved.values.size())
      raise<DataError>("resume: ", info.resumed_from.string(), " holds the Lookahead average \"", name, "\" of ",
                       saved.values.size(), " values, which this model ",
                       it == average_.end() ? "does not have" : "has with another size",
                       "; resume with the model that wrote it");
    it->values = saved.values;
    ++found;
  }
  if (found != average_.size())
    raise<DataError>("resume: ", info.resumed_from.string(), " holds ", found, " of the ", average_.size(),
                     " Lookahead averages this model needs (written by a run without Lookahead?); resume "
                     "without it or start a new run");
}

void Lookahead::on_step(const StepInfo& step) {
  if (!trainer_) return;
  if (step.step % options_.every == 0) update(options_.decay(step.step, total_steps_));
  if (options_.final_copy && step.step == total_steps_) update(1.0);
}

void Lookahead::update(double decay) {
  if (!(decay >= 0.0 && decay <= 1.0))
    raise<InvalidArgument>("Lookahead: decay ", decay, " must be in [0, 1]");
  trainer_->sync();
  const float keep = static_cast<float>(decay);
  const float take = 1.0f - keep;
  std::size_t k = 0;
  for (const auto& [name, t] : state_of(trainer_->model())) {
    std::vector<float>& avg = average_[k++].values;
    if (take != 0.0f) {
      const std::vector<float> now = t.to_host();
      for (std::size_t i = 0; i < avg.size(); ++i) avg[i] += take * (now[i] - avg[i]);  // torch.lerp
    }
    Tensor(t).copy_from_host(std::span<const float>(avg));
  }
  trainer_->broadcast_from_replica0();
}

std::vector<optim::NamedState> Lookahead::save_tensors() const {
  std::vector<optim::NamedState> out;
  for (const auto& a : average_) out.push_back({kPrefix + a.name, a.values});
  return out;
}

}  // namespace towerflow::train
