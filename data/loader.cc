#include "data/loader.h"

#include <algorithm>
#include <atomic>

#include "core/error.h"
#include "core/trace.h"
#include "data/rng.h"

namespace towerflow::data {

namespace {

void validate(const Dataset& dataset, const LoaderOptions& o) {
  if (o.world_size < 1) raise<InvalidArgument>("world size ", o.world_size, " must be at least 1");
  if (o.rank < 0 || o.rank >= o.world_size)
    raise<InvalidArgument>("rank ", o.rank, " is out of range for world size ", o.world_size, "; use 0..",
                           o.world_size - 1);
  if (o.batch < 1) raise<InvalidArgument>("batch size ", o.batch, " must be at least 1");
  if (!o.shard && o.batch % o.world_size != 0) {
    const int down = o.batch / o.world_size * o.world_size;
    raise<InvalidArgument>("global batch ", o.batch, " cannot be split evenly over ", o.world_size,
                           " ranks; use LoaderOptions::batch = ", down > 0 ? str(down, " or ") : std::string(),
                           down + o.world_size);
  }
  if (o.threads < 0) raise<InvalidArgument>("loader threads ", o.threads, " must be >= 0 (0: no background thread)");
  choose_mix(o.mix, dataset.shape(), 0, 0, 0);  // InvalidArgument for a bad alpha, before any worker starts
  if (o.prefetch < 1) raise<InvalidArgument>("loader prefetch ", o.prefetch, " must be at least 1 batch");
  if (dataset.size() < 1) raise<InvalidArgument>("dataset ", dataset.describe(), " is empty");
  if (o.drop_last && dataset.size() < o.batch)
    raise<InvalidArgument>("dataset ", dataset.describe(), " has fewer images than one batch of ", o.batch,
                           ", so dropping the last partial batch leaves nothing; use a batch of at most ",
                           dataset.size(), " or keep the last batch (drop_last = false)");
}

int shard_rows(const std::vector<std::pair<int, int>>& ranges) {
  int n = 0;
  for (auto [b, e] : ranges) n += e - b;
  return n;
}

}  // namespace

Loader::Loader(const Dataset& dataset, LoaderOptions options)
    : dataset_(dataset),
      options_(std::move(options)),
      shape_(dataset.shape()),
      augmenter_((validate(dataset, options_), options_.augment), shape_),
      local_batch_(options_.shard ? shard_rows(options_.shard(options_.batch, 0, 0)) : options_.batch / options_.world_size),
      steps_(options_.drop_last ? dataset.size() / options_.batch
                                : (dataset.size() + options_.batch - 1) / options_.batch) {
  if (!options_.allocator.allocate) options_.allocator = aligned_host_allocator();
  const int buffers = options_.threads == 0 ? 1 : std::max(options_.prefetch, options_.threads) + 1;
  pool_.reserve(buffers);
  free_.reserve(buffers);
  for (int i = 0; i < buffers; ++i) {
    Batch b;
    b.h = shape_.h;
    b.w = shape_.w;
    b.c = shape_.c;
    b.images = FloatBuffer(static_cast<std::size_t>(capacity()) * shape_.bytes(), options_.allocator);
    b.labels.reserve(capacity());
    b.indices.reserve(capacity());
    pool_.push_back(std::move(b));
    free_.push_back(i);
  }
  slots_.resize(buffers);
  for (auto& order : orders_) order.resize(static_cast<std::size_t>(dataset.size()));
  if (options_.threads == 0) sync_scratch_.resize(shape_.bytes());
  for (int t = 0; t < options_.threads; ++t) workers_.emplace_back([this] { worker_main(); });
}

Loader::~Loader() {
  {
    std::unique_lock lock(mutex_);
    cancel_locked(lock);
    shutdown_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void Loader::set_epoch(std::int64_t epoch, std::int64_t start_step) {
  if (epoch < 0) raise<InvalidArgument>("epoch ", epoch, " must be >= 0");
  // start_step == steps_ is an empty pass (a run saved right at the end of an epoch).
  if (start_step < 0 || start_step > steps_)
    raise<InvalidArgument>("start step ", start_step, " of epoch ", epoch, " is out of range; an epoch has ", steps_,
                           " steps (0..", steps_ - 1, ", or ", steps_, " for an empty pass)");
  next_epoch_ = epoch;
  next_start_step_ = start_step;
}

void Loader::stop() {
  std::unique_lock lock(mutex_);
  cancel_locked(lock);
}

// Cancels the running pass: workers abandon their batch at the next sample, and every buffer
// goes back to the free list once none of them is busy.
void Loader::cancel_locked(std::unique_lock<std::mutex>& lock) {
  if (!active_) return;
  cancel_ = true;
  ready_cv_.wait(lock, [this] { return busy_ == 0; });
  active_ = false;
  cancel_ = false;
  held_ = -1;
  free_.clear();
  for (int i = 0; i < static_cast<int>(pool_.size()); ++i) free_.push_back(i);
  for (auto& s : slots_) s = Slot{};
}

// The epoch's order, the same on every rank: Fisher-Yates from (seed, epoch).
void Loader::shuffle_into(std::int64_t epoch) {
  auto& order = orders_[static_cast<std::size_t>(epoch & 1)];
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::int64_t>(i);
  if (!options_.shuffle) return;
  SampleRng rng(options_.seed, RngStream::Shuffle, static_cast<std::uint64_t>(epoch));
  for (std::size_t i = order.size() - 1; i > 0; --i)
    std::swap(order[i], order[rng.below(static_cast<std::uint32_t>(i + 1))]);
}

void Loader::start() {
  const std::int64_t epoch = next_epoch_, step = next_start_step_;
  next_epoch_ = epoch + 1;
  next_start_step_ = 0;
  bool continuing;
  {
    std::unique_lock lock(mutex_);
    // The previous pass ended at the start of exactly this epoch: keep what the workers made.
    continuing = active_ && epoch == epoch_ + 1 && step == 0 && epoch_of(consume_) == epoch && step_of(consume_) == 0;
    if (!continuing) cancel_locked(lock);
  }
  if (continuing) {
    // Epoch - 1 is fully consumed, so no worker reads its order any more: reuse it for epoch + 1.
    shuffle_into(epoch + 1);
    std::lock_guard lock(mutex_);
    epoch_ = epoch;
    epoch_limit_ = epoch + 1;
  } else {
    shuffle_into(epoch);
    shuffle_into(epoch + 1);
    std::lock_guard lock(mutex_);
    base_epoch_ = epoch_ = epoch;
    base_step_ = step;
    claim_ = consume_ = 0;
    epoch_limit_ = epoch + 1;
    active_ = true;
  }
  work_cv_.notify_all();
}

Loader::Iterator Loader::begin() {
  start();
  return Iterator(this, next());
}

const Batch* Loader::next() {
  std::unique_lock lock(mutex_);
  if (held_ >= 0) {  // the consumer is done with the previous batch
    free_.push_back(held_);
    held_ = -1;
    work_cv_.notify_one();
  }
  if (!active_ || epoch_of(consume_) > epoch_) return nullptr;  // the epoch is over
  const std::int64_t position = consume_;
  if (options_.threads == 0) {
    const int buffer = free_.back();
    free_.pop_back();
    held_ = buffer;
    ++consume_;
    lock.unlock();
    try {
      produce(position, pool_[buffer], sync_scratch_);
    } catch (...) {
      stop();
      throw;
    }
    return &pool_[buffer];
  }
  Slot& slot = slots_[static_cast<std::size_t>(position % static_cast<std::int64_t>(slots_.size()))];
  ready_cv_.wait(lock, [&] { return slot.done; });
  ++consume_;
  held_ = slot.buffer;
  std::exception_ptr error = slot.error;
  slot = Slot{};
  if (error) {
    cancel_locked(lock);
    std::rethrow_exception(error);
  }
  return &pool_[held_];
}

void Loader::worker_main() {
  static std::atomic<int> workers{0};
  trace::set_thread_name(str("loader ", workers++));
  std::vector<std::uint8_t> scratch(shape_.bytes());
  std::unique_lock lock(mutex_);
  for (;;) {
    work_cv_.wait(lock, [this] {
      return shutdown_ || (active_ && !cancel_ && !free_.empty() && epoch_of(claim_) <= epoch_limit_);
    });
    if (shutdown_) return;
    const std::int64_t position = claim_++;
    const int buffer = free_.back();
    free_.pop_back();
    ++busy_;
    lock.unlock();
    std::exception_ptr error;
    try {
      const trace::Span span("data", "load batch");
      produce(position, pool_[buffer], scratch);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    --busy_;
    Slot& slot = slots_[static_cast<std::size_t>(position % static_cast<std::int64_t>(slots_.size()))];
    slot.buffer = buffer;
    slot.error = error;
    slot.done = true;
    // The consumer waits for its position, and cancel_locked() for busy_ == 0.
    ready_cv_.notify_all();
  }
}

// Reads only state that is fixed while the position is in flight (the position's epoch's order,
// written before any worker could claim a position of that epoch).
void Loader::produce(std::int64_t position, Batch& batch, std::vector<std::uint8_t>& scratch) {
  const std::int64_t epoch = epoch_of(position), step = step_of(position);
  const auto& order = orders_[static_cast<std::size_t>(epoch & 1)];
  const std::int64_t n = dataset_.size();
  const std::int64_t global_begin = step * options_.batch;
  const auto global_n = static_cast<int>(std::min<std::int64_t>(options_.batch, n - global_begin));
  // This rank's rows: the shard function's, or an even split of the global batch (exact for
  // full batches).
  std::vector<std::pair<int, int>> ranges;
  if (options_.shard) {
    ranges = options_.shard(global_n, epoch, step);
    for (auto [b, e] : ranges)
      if (b < 0 || e < b || e > global_n)
        raise<InvalidArgument>("the loader's shard function gave rows [", b, ", ", e, ") of a global batch of ",
                               global_n, "; ranges must lie within it");
    if (shard_rows(ranges) > global_n)
      raise<InvalidArgument>("the loader's shard function gave ", shard_rows(ranges), " rows of a global batch of ",
                             global_n, "; ranges must not overlap");
  } else {
    const int r = options_.rank, w = options_.world_size;
    ranges.emplace_back(static_cast<int>(static_cast<std::int64_t>(global_n) * r / w),
                        static_cast<int>(static_cast<std::int64_t>(global_n) * (r + 1) / w));
  }
  batch.n = shard_rows(ranges);
  batch.epoch = epoch;
  batch.index_in_epoch = step;
  batch.global_n = global_n;
  batch.global_offset = ranges.empty() ? 0 : ranges.front().first;
  batch.labels.resize(static_cast<std::size_t>(batch.n));
  batch.indices.resize(static_cast<std::size_t>(batch.n));
  const std::size_t stride = shape_.bytes();
  // Mixing: the same choice on every rank, each row with the global batch's previous row.
  const MixChoice mix = global_n >= 2 ? choose_mix(options_.mix, shape_, options_.seed, epoch, step) : MixChoice{};
  const bool mixing = mix.kind != MixChoice::Kind::None;
  batch.mix = mixing ? mix.lambda : 1.0f;
  batch.mix_labels.resize(mixing ? static_cast<std::size_t>(batch.n) : 0);
  std::vector<std::uint8_t> partner_pixels(mixing ? stride : 0);
  std::vector<float> partner(mixing ? stride : 0);
  int j = 0;  // this rank's row
  for (auto [first, last] : ranges) {
    for (int g = first; g < last; ++g, ++j) {
      if (cancel_.load(std::memory_order_relaxed)) return;
      const std::int64_t index = order[static_cast<std::size_t>(global_begin + g)];
      const std::int32_t label = dataset_.read(index, scratch);
      if (label < 0 || label >= dataset_.num_classes())
        raise<DataError>(dataset_.describe(), " item ", index, " has label ", label, ", expected 0..",
                         dataset_.num_classes() - 1);
      batch.labels[static_cast<std::size_t>(j)] = label;
      batch.indices[static_cast<std::size_t>(j)] = index;
      float* own = batch.images.data() + static_cast<std::size_t>(j) * stride;
      augmenter_.apply(scratch.data(), own, options_.seed, epoch, index);
      if (mixing) {
        const std::int64_t other = order[static_cast<std::size_t>(global_begin + (g + global_n - 1) % global_n)];
        batch.mix_labels[static_cast<std::size_t>(j)] = dataset_.read(other, partner_pixels);
        augmenter_.apply(partner_pixels.data(), partner.data(), options_.seed, epoch, other);
        apply_mix(mix, shape_, own, partner.data());
      }
    }
  }
}

}  // namespace towerflow::data
