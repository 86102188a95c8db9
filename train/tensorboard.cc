#include "train/tensorboard.h"

#include <span>

#include "core/nn/module.h"
#include "tower/trainer.h"

namespace towerflow::train {
namespace fs = std::filesystem;

TensorBoard::TensorBoard(fs::path logdir, TensorBoardOptions options)
    : logdir_(std::move(logdir)), options_(options) {}

void TensorBoard::on_start(const StartInfo& start) {
  writer_ = std::make_unique<io::SummaryWriter>(logdir_);
  trainer_ = &start.trainer;
  if (start.resumed) writer_->session_start(start.position.step + 1);
}

void TensorBoard::on_step(const StepInfo& s) {
  if (options_.histogram_every <= 0 || s.step % options_.histogram_every != 0 || !trainer_) return;
  nn::Module& model = trainer_->model();
  const std::vector<float> grads = model.flat_gradients().to_host();
  std::size_t offset = 0;  // parameters and gradients share the flat layout (Module::flatten)
  for (const auto& [name, p] : model.named_parameters()) {
    const std::vector<float> w = p.to_host();
    writer_->histogram("weights/" + name, w, s.step);
    writer_->histogram("gradients/" + name, std::span<const float>(grads).subspan(offset, w.size()), s.step);
    offset += w.size();
  }
}

void TensorBoard::on_log(const TrainRecord& r) {
  writer_->scalar("train/loss", r.loss, r.step);
  writer_->scalar("train/accuracy", r.acc, r.step);
  writer_->scalar("train/learning_rate", r.lr, r.step);
  writer_->scalar("train/images_per_second", r.img_per_s, r.step);
  if (r.loss_scale > 0) {  // fp16
    writer_->scalar("train/loss_scale", r.loss_scale, r.step);
    writer_->scalar("train/skipped_steps", static_cast<double>(r.skipped_steps), r.step);
  }
  writer_->scalar("step_time/total_ms", 1e3 * r.step_s, r.step);
  writer_->scalar("step_time/compute_ms", 1e3 * r.compute_s, r.step);
  writer_->scalar("step_time/reduction_ms", 1e3 * r.reduction_s, r.step);
  writer_->scalar("step_time/optimizer_ms", 1e3 * r.optimizer_s, r.step);
  writer_->scalar("step_time/data_wait_ms", 1e3 * r.data_wait_s, r.step);
  for (std::size_t g = 0; g < r.split.size(); ++g)  // an auto split: rows per tower
    writer_->scalar("split/tower" + std::to_string(g), r.split[g], r.step);
}

void TensorBoard::on_eval(const EvalRecord& r) {
  const std::string p(metric_prefix(r.set));
  writer_->scalar(p + "/loss", r.test_loss, r.step);
  writer_->scalar(p + "/accuracy", r.test_acc, r.step);
  writer_->scalar(p + "/accuracy_top5", r.test_top5, r.step);
}

void TensorBoard::on_checkpoint(const CheckpointRecord&) { writer_->flush(); }

void TensorBoard::on_end(const FitResult&) { writer_->flush(); }

std::vector<fs::path> TensorBoard::files() const {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(logdir_, ec))
    if (e.is_regular_file() && e.path().filename().string().starts_with("events.out.tfevents.")) out.push_back(e.path());
  return out;
}

}  // namespace towerflow::train
