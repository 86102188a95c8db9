#pragma once
// Bucketed reduction during backward (private to tower/; Note [Bucketed reduction during
// backward] in buckets.cc): the buckets of a model's flat gradient buffer, and when backward has
// finished each one.
//
// Contract:
// - BucketPlan::plan splits the parameters, from the last backwards (the order backward produces
//   them), into buckets of whole parameters of at most `bytes` (a larger parameter is a bucket of
//   its own).
// - BucketPlan::install_hooks wraps every backward function of the graph under `loss` so that
//   `tracker` learns when each bucket's gradients are final; call it once per step and tower,
//   after the forward pass and before backward.
// - BucketTracker: before_node() and mark_all() run on the tower thread, which drives the
//   backend; wait() on the tower's communication thread; cancel() from either.

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "core/nn/module.h"
#include "core/tensor/backend_impl.h"
#include "core/tensor/tensor.h"

namespace towerflow::tower {

struct Bucket {
  std::size_t begin = 0, end = 0;  // elements of the flat buffer
};

// Which buckets backward has finished, for one tower and one step, and the point in the tower's
// backend queue after which each one's gradients are written (Note [Bucketed reduction during
// backward]). before_node() and mark_all() run on the tower thread, which drives the backend.
class BucketTracker {
 public:
  explicit BucketTracker(Backend& backend) : backend_(&backend) {}
  void reset(std::vector<std::uint64_t> min_sequence) {
    std::lock_guard lock(mu_);
    min_seq_ = std::move(min_sequence);
    ready_.assign(min_seq_.size(), false);
    events_.assign(min_seq_.size(), nullptr);
    cancelled_ = false;
  }
  // The engine is about to run node `sequence`: every node above it has finished.
  void before_node(std::uint64_t sequence) {
    bool any = false;
    {
      std::lock_guard lock(mu_);
      std::shared_ptr<const QueueEvent> event;
      for (std::size_t b = 0; b < min_seq_.size(); ++b)
        if (!ready_[b] && min_seq_[b] > sequence) {
          if (!any) event = backend_->record_event();  // one event for all buckets ready now
          ready_[b] = any = true;
          events_[b] = event;
          ++early_;
        }
    }
    if (any) cv_.notify_all();
  }
  void mark_all() {
    {
      std::lock_guard lock(mu_);
      std::shared_ptr<const QueueEvent> event = backend_->record_event();
      for (std::size_t b = 0; b < ready_.size(); ++b)
        if (!ready_[b]) {
          ready_[b] = true;
          events_[b] = event;
        }
    }
    cv_.notify_all();
  }
  void cancel() {
    {
      std::lock_guard lock(mu_);
      cancelled_ = true;
    }
    cv_.notify_all();
  }
  // Buckets found ready while backward was still running, since construction.
  std::int64_t ready_during_backward() {
    std::lock_guard lock(mu_);
    return early_;
  }
  // False when cancelled; otherwise *event is the point after which bucket b is written (null
  // when nothing is pending, as on the CPU).
  bool wait(std::size_t b, std::shared_ptr<const QueueEvent>* event) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return cancelled_ || ready_[b]; });
    *event = events_[b];
    return !cancelled_;
  }

 private:
  Backend* backend_;
  std::vector<std::shared_ptr<const QueueEvent>> events_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::uint64_t> min_seq_;
  std::vector<bool> ready_;
  bool cancelled_ = false;
  std::int64_t early_ = 0;
};

// The buckets of one model's flat gradient buffer, in reduction order (from the end of the
// buffer), and the bucket of each parameter.
struct BucketPlan {
  std::vector<Bucket> buckets;
  std::vector<std::size_t> bucket_of_param;  // parameter index -> bucket

  void plan(const nn::Module& m, std::size_t bytes);
  void install_hooks(const nn::Module& m, const Tensor& loss, BucketTracker& tracker) const;
};

}  // namespace towerflow::tower
