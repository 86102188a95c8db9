#include "tower/replica_buffers.h"

#include <algorithm>

#include "core/collectives/process_group.h"
#include "tower/workers.h"

namespace towerflow::tower {

ReplicaBuffers::ReplicaBuffers(std::vector<std::shared_ptr<nn::Module>>& replicas, DeviceWorkers& workers,
                               collectives::ProcessGroup& processes)
    : replicas_(&replicas), workers_(&workers), processes_(&processes), gathered_(replicas.size()) {
  for (const Tensor& t : of(*replicas.front())) numel_ += static_cast<std::size_t>(t.numel());
  take_snapshot();
}

std::vector<Tensor> ReplicaBuffers::of(const nn::Module& m) {
  std::vector<Tensor> out;
  for (auto& [name, t] : m.named_buffers())
    if (t.dtype() == DType::kFloat32) out.push_back(t);
  return out;
}

void ReplicaBuffers::read(const nn::Module& m, std::vector<float>& out) const {
  out.resize(numel_);
  std::size_t off = 0;
  for (const Tensor& t : of(m)) {
    t.to_host(std::span<float>(out.data() + off, static_cast<std::size_t>(t.numel())));
    off += static_cast<std::size_t>(t.numel());
  }
}

void ReplicaBuffers::write(nn::Module& m, const std::vector<float>& in) const {
  std::size_t off = 0;
  for (Tensor& t : of(m)) {
    t.copy_from_host(std::span<const float>(in.data() + off, static_cast<std::size_t>(t.numel())));
    off += static_cast<std::size_t>(t.numel());
  }
}

void ReplicaBuffers::take_snapshot() { read(*replicas_->front(), snapshot_); }

void ReplicaBuffers::gather(int tower) {
  if (numel_ > 0) read(*(*replicas_)[static_cast<std::size_t>(tower)], gathered_[static_cast<std::size_t>(tower)]);
}

void ReplicaBuffers::average(const std::vector<float>& weights) {
  if (numel_ == 0) return;
  std::fill(snapshot_.begin(), snapshot_.end(), 0.0f);
  for (std::size_t i = 0; i < gathered_.size(); ++i)
    for (std::size_t j = 0; j < numel_; ++j) snapshot_[j] += weights[i] * gathered_[i][j];
  processes_->all_reduce_sum(std::span<float>(snapshot_));  // every process's towers
  workers_->run([&](int i) { write(*(*replicas_)[static_cast<std::size_t>(i)], snapshot_); });
}

void ReplicaBuffers::restore() {
  if (numel_ == 0) return;
  workers_->run([&](int i) { write(*(*replicas_)[static_cast<std::size_t>(i)], snapshot_); });
}

}  // namespace towerflow::tower
