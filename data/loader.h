#pragma once
// Loader: shuffles, shards, augments and batches a Dataset on background threads, a bounded
// number of batches ahead of the trainer.
//
//   data::Loader loader{train, {.batch = 512, .augment = data::cifar_augment(), .seed = 1}};
//   for (int epoch = 0; epoch < 30; ++epoch)
//     for (const data::Batch& batch : loader) {   // epochs 0, 1, 2, ...
//       trainer.forward_backward(batch);          // a tower::Trainer: split, run every tower, reduce
//       sgd.step();                               // its optimizer (optim::Sgd) applies the gradients
//     }
//
// Epochs. Each pass (begin()) runs one epoch: the one given to set_epoch(), else the one after
// the previous pass (the first is 0). The epoch's order is a permutation of the dataset drawn
// from (seed, epoch), the same on every rank. set_epoch(e, k) starts epoch e at step k (resuming
// a run mid-epoch gives exactly the batches the interrupted run would have produced from there).
//
// Global batches and shards. Step s of an epoch takes the global batch of rows
// [s*batch, (s+1)*batch) of the epoch's order; rank r of world_size gets the r-th contiguous
// slice of it (batch / world_size rows; batch must divide evenly). With drop_last the final
// partial global batch is dropped; with keep-last it is split over the ranks as evenly as
// possible, so a rank may get fewer rows, or none, in that step; every rank makes the same number
// of steps. Over one epoch the ranks' slices together cover every row of the epoch exactly once
// (drop_last: those of the full batches). With a shard function, rank r gets instead the rows
// shard(global_n, epoch, step) names, [begin, end) ranges of each global batch in order (the tower
// trainer's tower::Trainer::shard gives each process its towers' rows, weighted and auto splits
// too); the batch then need not divide by world_size. A shard function may change its answer
// between steps, but not for a step whose batch may already be cut: up to lookahead() steps past
// the one in use.
//
// Determinism. A batch's contents are a pure function of (dataset, options except threads,
// prefetch and allocator, epoch, step): the same for any number of worker threads.
//
// Threads and memory. `threads` workers produce whole batches in parallel, into a pool of
// max(prefetch, threads) + 1 buffers allocated once with `allocator` and recycled, so steady state
// allocates nothing; threads = 0 produces each batch on the caller's thread inside next(). The
// Batch a pass yields stays valid until the iterator is advanced (or next()/stop() is called);
// its buffer is then reused. The Loader itself is used from one thread.
//
// Errors. Bad options throw InvalidArgument from the constructor. A worker's exception (e.g. a
// DataError for a bad file found while reading) is rethrown by the next() that reaches that
// batch, after the workers have stopped. Destroying the loader or calling stop() mid-epoch cancels
// the pass promptly (workers check between samples); the destructor then joins the workers.
//
// Epoch boundaries: when a pass ends, the workers go on producing the first batches of the next
// epoch, so a following begin() for that epoch (from step 0) starts with batches ready. Any other
// begin() (set_epoch to another epoch or step, or a pass abandoned mid-epoch) discards them.

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "data/augment.h"
#include "data/batch.h"
#include "data/dataset.h"

namespace towerflow::data {

struct LoaderOptions {
  int batch = 128;                  // the global batch, over all ranks
  Augment augment = {};             // default: normalisation only (eval_transform())
  MixOptions mix = {};              // mixup / CutMix of training batches (augment.h); default: none
  bool shuffle = true;
  std::uint64_t seed = 0;
  bool drop_last = true;            // false: keep the final partial batch
  int rank = 0, world_size = 1;     // this process's shard
  // This rank's rows of step `step` of `epoch`, a global batch of global_n rows (see above);
  // empty: the even slice.
  std::function<std::vector<std::pair<int, int>>(int global_n, std::int64_t epoch, std::int64_t step)> shard = {};
  int threads = 2;                  // background workers; 0: produce on the caller's thread
  int prefetch = 4;                 // batches produced ahead of the consumer (the queue bound)
  HostAllocator allocator = {};     // batch buffers; empty: aligned_host_allocator()
};

class Loader {
 public:
  // The dataset must outlive the loader.
  Loader(const Dataset& dataset, LoaderOptions options);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  std::int64_t steps_per_epoch() const { return steps_; }
  int local_batch() const { return local_batch_; }  // rows per rank in a full step
  // The most batches past the one in use that may already be cut (0 with threads = 0).
  int lookahead() const { return options_.threads == 0 ? 0 : static_cast<int>(pool_.size()) - 1; }
  const Dataset& dataset() const { return dataset_; }
  const LoaderOptions& options() const { return options_; }

  // The epoch (and first step) the next pass runs; takes effect at the next begin()/start().
  void set_epoch(std::int64_t epoch, std::int64_t start_step = 0);
  std::int64_t next_epoch() const { return next_epoch_; }

  // Explicit form of the range-for: start() begins a pass; next() returns its batches in order,
  // then nullptr; stop() cancels it (as the destructor does, and start() unless it continues into
  // the epoch the workers are already producing).
  void start();
  const Batch* next();
  void stop();

  class Iterator {
   public:
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    const Batch& operator*() const { return *current_; }
    const Batch* operator->() const { return current_; }
    Iterator& operator++() {
      current_ = loader_->next();
      return *this;
    }
    bool operator==(std::default_sentinel_t) const { return current_ == nullptr; }

   private:
    friend class Loader;
    Iterator(Loader* loader, const Batch* current) : loader_(loader), current_(current) {}
    Loader* loader_;
    const Batch* current_;
  };
  Iterator begin();
  std::default_sentinel_t end() { return {}; }

 private:
  struct Slot {
    int buffer = -1;
    bool done = false;
    std::exception_ptr error;
  };
  // The batches of a pass form a stream of positions 0, 1, 2, ... that run through the end of an
  // epoch into the next: position p is step (base_step_ + p) % steps_ of epoch
  // base_epoch_ + (base_step_ + p) / steps_.
  std::int64_t epoch_of(std::int64_t position) const { return base_epoch_ + (base_step_ + position) / steps_; }
  std::int64_t step_of(std::int64_t position) const { return (base_step_ + position) % steps_; }
  void shuffle_into(std::int64_t epoch);
  void worker_main();
  void produce(std::int64_t position, Batch& batch, std::vector<std::uint8_t>& scratch);
  void cancel_locked(std::unique_lock<std::mutex>& lock);

  const Dataset& dataset_;
  LoaderOptions options_;
  ImageShape shape_;
  Augmenter augmenter_;
  int local_batch_;
  // Rows a batch buffer holds: the rank's rows of a full batch, or with a shard function, whose
  // share of a partial batch may be larger, the whole global batch.
  int capacity() const { return options_.shard ? options_.batch : local_batch_; }
  std::int64_t steps_;
  std::int64_t next_epoch_ = 0, next_start_step_ = 0;

  std::vector<Batch> pool_;
  // The permutations of the consumer's epoch and of the one after it (which the workers may
  // already be producing), by the epoch's parity.
  std::array<std::vector<std::int64_t>, 2> orders_;
  std::vector<std::uint8_t> sync_scratch_;  // for threads = 0

  // Shared with the workers, under mutex_.
  std::mutex mutex_;
  std::condition_variable work_cv_, ready_cv_;
  std::vector<int> free_;                 // buffers no one holds
  std::vector<Slot> slots_;               // position p lives in slots_[p % slots_.size()]
  bool active_ = false, shutdown_ = false;
  std::int64_t base_epoch_ = 0, base_step_ = 0;
  std::int64_t claim_ = 0, consume_ = 0;  // the next positions to produce and to hand out
  std::int64_t epoch_ = 0;                // the epoch the consumer is in
  std::int64_t epoch_limit_ = 0;          // workers produce positions of epochs up to this one
  int busy_ = 0;                          // workers producing a batch
  int held_ = -1;                         // the buffer the consumer holds
  std::atomic<bool> cancel_{false};
  std::vector<std::thread> workers_;
};

}  // namespace towerflow::data
