// The bucketed all-reduce strategy (reduction.h: AllReduce with bucket_bytes > 0): Note
// [Bucketed reduction during backward].
#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "core/collectives/communicator.h"
#include "core/collectives/context.h"
#include "core/tensor/device_ops.h"
#include "core/trace.h"
#include "tower/reducer.h"

// Note [Bucketed reduction during backward]
// The flat gradient buffer is cut into buckets of whole parameters, filled from the last
// parameter backwards (the order backward produces them), each of at most bucket_bytes (a larger
// parameter is a bucket of its own). Autograd names each parameter whose gradient is final
// (BackwardHooks::on_leaf_final, Note [Final leaf gradients] in core/tensor/autograd.cc); a bucket
// is ready once all its parameters are. Each tower has a communication worker, a thread that
// lives as long as the reducer: during the last micro-batch's backward it queues the buckets'
// all-reduces in a fixed order as they become ready, while the tower thread carries on with
// backward, and after backward it waits once for all of them (Communicator::all_reduce_sum_queued
// and wait_queued: NCCL runs them back to back on its stream). Every tower reduces the same
// buckets in the same order, so the collectives match across towers.
// "Final" is the host's view: on a GPU, backward has only queued the kernels that write the
// bucket on the device's compute stream, and NCCL runs on a stream of its own. So when a bucket
// becomes ready the tower thread records an event on its backend's queue (record_event, core/tensor/device_ops.h;
// null on the CPU, whose kernels are done when they return), and the all-reduce of the bucket is
// ordered after that event (the NCCL stream waits for it on the GPU). Without the event NCCL would
// sum partly written gradients and replicas would drift.

namespace towerflow::tower {

namespace {

struct Bucket {
  std::size_t begin = 0, end = 0;  // elements of the flat buffer
};

// Buckets of whole parameters, from the last parameter backwards, each of at most `bytes` (a
// larger parameter alone); bucket_of[p] is parameter p's bucket.
void plan_buckets(const std::vector<std::size_t>& sizes, std::size_t bytes, std::vector<Bucket>& buckets,
                  std::vector<std::size_t>& bucket_of) {
  const std::size_t cap = std::max<std::size_t>(1, bytes / sizeof(float));
  std::vector<std::size_t> offsets(sizes.size() + 1, 0);
  for (std::size_t p = 0; p < sizes.size(); ++p) offsets[p + 1] = offsets[p] + sizes[p];
  bucket_of.assign(sizes.size(), 0);
  buckets.clear();
  std::size_t end = sizes.size();
  while (end > 0) {
    std::size_t begin = end;
    while (begin > 0 && (begin == end || offsets[end] - offsets[begin] < cap)) --begin;
    if (offsets[end] - offsets[begin] > cap && end - begin > 1) ++begin;  // keep under the cap
    for (std::size_t p = begin; p < end; ++p) bucket_of[p] = buckets.size();
    buckets.push_back({offsets[begin], offsets[end]});
    end = begin;
  }
}

class BucketedReducer final : public GradientReducer {
 public:
  BucketedReducer(std::unique_ptr<collectives::Communicator> comm, std::size_t bucket_bytes,
                  const ReducerSetup& setup)
      : setup_(setup), comm_(std::move(comm)), bucket_bytes_(bucket_bytes) {
    std::vector<std::size_t> sizes;
    for (auto& [name, t] : (*setup.replicas)[0]->named_parameters()) sizes.push_back(static_cast<std::size_t>(t.numel()));
    plan_buckets(sizes, bucket_bytes, buckets_, bucket_of_);
    for (std::size_t i = 0; i < setup.devices.size(); ++i) {
      auto t = std::make_unique<Tower>();
      t->device = setup.devices[i];
      std::size_t p = 0;
      for (auto& [name, param] : (*setup.replicas)[i]->named_parameters()) t->param_of[param.impl()] = p++;
      towers_.push_back(std::move(t));
    }
    for (std::size_t i = 0; i < towers_.size(); ++i)
      towers_[i]->thread = std::thread([this, i] { communicate(static_cast<int>(i)); });
  }

  ~BucketedReducer() override {
    for (auto& t : towers_) {
      {
        std::lock_guard lock(t->mu);
        t->stopping = true;
      }
      t->cv.notify_all();
    }
    for (auto& t : towers_) t->thread.join();
  }

  std::string describe() const override {
    return str("bucketed all_reduce (", buckets_.size(), " buckets of at most ",
               bucket_bytes_ >= (1 << 20) ? str(bucket_bytes_ >> 20, " MiB") : str(bucket_bytes_, " bytes"),
               " or one parameter) over ", comm_->name());
  }

  BackwardHooks backward_hooks(int i) override {
    start(i);
    return {.on_leaf_final = [this, i](const Tensor& leaf) { leaf_final(i, leaf); }};
  }

  void after_backward(int i) override {
    Tower& t = *towers_[static_cast<std::size_t>(i)];
    start(i);  // a tower whose last micro-batch had no rows ran no hooks
    {
      const trace::Span span("reduction", "wait for the last buckets");
      std::shared_ptr<const QueueEvent> event;
      std::unique_lock lock(t.mu);
      for (std::size_t b = 0; b < buckets_.size(); ++b)
        if (!t.ready[b]) {
          if (!event) event = record_event(t.device);
          t.ready[b] = true;
          t.events[b] = event;
        }
      t.cv.notify_all();
      t.cv.wait(lock, [&] { return !t.busy; });
      t.started = false;
      if (t.error) std::rethrow_exception(std::exchange(t.error, nullptr));
    }
  }

  void abort(const std::string& reason) override {
    for (auto& t : towers_) {
      {
        std::lock_guard lock(t->mu);
        t->cancelled = true;
      }
      t->cv.notify_all();
    }
    comm_->abort(reason);
  }

  void reset() override {
    for (auto& t : towers_) {  // every worker back to waiting for a step
      std::unique_lock lock(t->mu);
      t->cv.wait(lock, [&] { return !t->busy; });
      t->cancelled = false;
      t->started = false;
      t->error = nullptr;
    }
    comm_->reset();
  }

  Tensor reduced_gradients() override { return (*setup_.replicas)[0]->flat_gradients(); }
  void scale_gradients(float factor) override { scale_replica_gradients(setup_, factor); }
  optim::ParameterSet parameters() override { return replica_parameter_set(setup_); }
  std::string recent_collectives() const override { return comm_->recent_collectives(); }

  std::int64_t reduced_during_backward() const override {
    std::int64_t n = 0;
    for (const auto& t : towers_) {
      std::lock_guard lock(t->mu);
      n += t->early;
    }
    return n;
  }

 private:
  struct Tower {
    Device device;
    std::unordered_map<const TensorImpl*, std::size_t> param_of;  // parameter index
    std::thread thread;
    mutable std::mutex mu;
    std::condition_variable cv;
    // Under mu. One step: started by the tower thread, busy while the worker reduces.
    std::vector<std::size_t> pending;  // per bucket: parameters not final yet
    std::vector<bool> ready;
    std::vector<std::shared_ptr<const QueueEvent>> events;
    bool started = false, busy = false, cancelled = false, stopping = false;
    std::uint64_t step = 0;
    collectives::CollectiveContext context;  // the tower thread's, for the collectives' reports
    std::exception_ptr error;
    std::int64_t early = 0;
  };

  // Arms tower i's bookkeeping for this step and hands its worker the step (once per step).
  void start(int i) {
    Tower& t = *towers_[static_cast<std::size_t>(i)];
    {
      std::lock_guard lock(t.mu);
      if (t.started) return;
      t.pending.assign(buckets_.size(), 0);
      for (std::size_t b : bucket_of_) ++t.pending[b];
      t.ready.assign(buckets_.size(), false);
      t.events.assign(buckets_.size(), nullptr);
      t.error = nullptr;
      t.started = t.busy = true;
      t.context = collectives::current_context();
      ++t.step;
    }
    t.cv.notify_all();
  }

  // On the tower thread, inside backward.
  void leaf_final(int i, const Tensor& leaf) {
    Tower& t = *towers_[static_cast<std::size_t>(i)];
    auto it = t.param_of.find(leaf.impl());
    if (it == t.param_of.end()) return;
    const std::size_t b = bucket_of_[it->second];
    {
      std::lock_guard lock(t.mu);
      if (--t.pending[b] > 0 || t.ready[b]) return;
      t.events[b] = record_event(t.device);
      t.ready[b] = true;
      ++t.early;
    }
    t.cv.notify_all();
  }

  // Tower i's communication worker.
  void communicate(int i) {
    Tower& t = *towers_[static_cast<std::size_t>(i)];
    trace::set_thread_name(str("tower ", i, " reduction"));
    const Tensor grads = (*setup_.replicas)[static_cast<std::size_t>(i)]->flat_gradients();
    std::uint64_t seen = 0;
    for (;;) {
      collectives::CollectiveContext context;
      {
        std::unique_lock lock(t.mu);
        t.cv.wait(lock, [&] { return t.stopping || t.step != seen; });
        if (t.stopping) return;
        seen = t.step;
        context = t.context;
      }
      const collectives::ContextScope in_step(context);
      std::exception_ptr error;
      try {
        for (std::size_t b = 0; b < buckets_.size(); ++b) {
          std::shared_ptr<const QueueEvent> ready;
          {
            std::unique_lock lock(t.mu);
            t.cv.wait(lock, [&] { return t.cancelled || t.ready[b]; });
            if (t.cancelled) raise<collectives::CollectiveAborted>("step stopped: another tower failed");
            ready = t.events[b];
          }
          const Bucket& bk = buckets_[b];
          const trace::Span span("reduction", trace::enabled() ? str("bucket ", b) : std::string());
          const collectives::ContextScope bucket({.purpose = "gradient bucket", .index = static_cast<int>(b)});
          comm_->all_reduce_sum_queued(i, {grads.data<float>() + bk.begin, bk.end - bk.begin}, ready.get());
        }
        comm_->wait_queued(i);
      } catch (...) {
        error = std::current_exception();
        try {
          comm_->wait_queued(i);  // nothing of this step stays queued (an aborted one throws)
        } catch (...) {
        }
      }
      {
        std::lock_guard lock(t.mu);
        t.error = error;
        t.busy = false;
      }
      t.cv.notify_all();
    }
  }

  ReducerSetup setup_;
  std::unique_ptr<collectives::Communicator> comm_;
  std::size_t bucket_bytes_;
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> bucket_of_;  // parameter -> bucket
  std::vector<std::unique_ptr<Tower>> towers_;
};

}  // namespace

std::unique_ptr<GradientReducer> make_bucketed_reducer(std::unique_ptr<collectives::Communicator> comm,
                                                       std::size_t bucket_bytes, const ReducerSetup& setup) {
  return std::make_unique<BucketedReducer>(std::move(comm), bucket_bytes, setup);
}

}  // namespace towerflow::tower
