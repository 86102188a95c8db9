// The best-fit-with-coalescing (BFC) allocator: one per logical device, over a SubAllocator.
//
// Note [BFC layout]
// The pool is a list of regions obtained from the sub-allocator. Each region is cut into chunks
// that tile it exactly, linked to their neighbours (prev/next stay inside one region: chunks of
// different regions never merge, because the sub-allocator must get back exactly what it gave).
// Every chunk size is a multiple of 256 bytes and every chunk starts 256-aligned (regions are at
// least page-aligned), so every pointer handed out is 256-aligned.
//
// Free chunks sit in 21 size-class bins: bin i holds sizes in [256 << i, 256 << (i + 1)), the last
// bin everything from 256 MiB up. Inside a bin, free chunks are ordered by (size, address). A
// request rounded to r looks in r's bin for the first chunk of size >= r, then takes the smallest
// chunk of the next non-empty bin (a bitmap finds it in one instruction): that is exactly the best
// fit, with ties broken towards low addresses (which keeps the pool compact). The chosen chunk is
// split when it is larger than r, so a live chunk is always exactly its rounded request: the
// in-use statistic is then the sum of rounded requests, which callers can tally independently.
// Freeing a chunk merges it with a free neighbour on either side at once, so no two free chunks
// are ever adjacent.
//
// Note [Growth and back-off]
// With growth, the first region is initial_region_bytes and each later one doubles the previous,
// capped at what remains of the limit. Pure doubling leaves the newest region mostly idle when the
// pool peaks: up to half of a grown pool serves nothing (TensorFlow's allow_growth pools show
// this). So a new region is also capped at growth_cap (a quarter by default) of the pool so far,
// but never below initial_region_bytes: small pools still double quickly, and large ones grow in
// steps of a quarter, so the idle tail stays near 20% while a pool of 16 GiB still takes only
// about forty regions. A request larger than the cap gets a region that fits it. Without growth, the first
// allocation reserves the whole limit as one region. When the sub-allocator refuses a region (the
// device is shared with other processes or virtual devices), the pool backs off in 10% steps down
// to the request itself; if even that fails, it frees its empty regions and tries once more
// before it reports out-of-memory.
//
// Note [Why one mutex]
// A single lock around a few hundred nanoseconds of bookkeeping is what TensorFlow's BFC does,
// and it is simple to reason about. Towers allocate mostly from different devices, hence
// different allocators, so the lock is rarely contended across towers.

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory_resource>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "core/memory/allocator.h"
#include "core/memory/stats.h"

namespace towerflow {
namespace {

constexpr std::size_t kGranule = kAllocatorAlignment;
constexpr int kNumBins = 21;
constexpr std::uint32_t kNone = std::numeric_limits<std::uint32_t>::max();

constexpr std::size_t round_up(std::size_t bytes) { return (bytes + kGranule - 1) & ~(kGranule - 1); }
constexpr std::size_t round_down(std::size_t bytes) { return bytes & ~(kGranule - 1); }

// The bin of a chunk of `size` bytes (a multiple of 256, at least 256).
int bin_of(std::size_t size) {
  const int b = static_cast<int>(std::bit_width(size / kGranule)) - 1;
  return std::min(b, kNumBins - 1);
}
std::size_t bin_min_size(int b) { return kGranule << b; }

// Live allocations: pointer -> chunk handle. Open addressing with linear probing and
// backward-shift deletion, so an allocate/free pair costs no heap allocation.
class PointerMap {
 public:
  PointerMap() { rehash(64); }

  void insert(std::uintptr_t key, std::uint32_t value) {
    if ((count_ + 1) * 2 > slots_.size()) rehash(slots_.size() * 2);
    std::size_t i = home(key);
    while (slots_[i].key != 0) i = (i + 1) & mask_;
    slots_[i] = {key, value};
    ++count_;
  }
  // Removes key and returns its value, or returns kNone (changing nothing) when it is absent.
  std::uint32_t erase(std::uintptr_t key) {
    std::size_t i = home(key);
    while (slots_[i].key != key) {
      if (slots_[i].key == 0) return kNone;
      i = (i + 1) & mask_;
    }
    const std::uint32_t value = slots_[i].value;
    // Backward shift: pull later entries of the probe run into the hole when their home slot
    // does not lie cyclically in (hole, j].
    for (std::size_t j = (i + 1) & mask_; slots_[j].key != 0; j = (j + 1) & mask_) {
      const std::size_t h = home(slots_[j].key);
      const bool stays = (i <= j) ? (i < h && h <= j) : (i < h || h <= j);
      if (!stays) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = {};
    --count_;
    return value;
  }

 private:
  struct Slot {
    std::uintptr_t key = 0;
    std::uint32_t value = 0;
  };
  std::size_t home(std::uintptr_t key) const {
    // Fibonacci hashing of the 256-byte granule number; the top bits index the table.
    return static_cast<std::size_t>(((key >> 8) * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  void rehash(std::size_t capacity) {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(capacity, Slot{});
    mask_ = capacity - 1;
    shift_ = 64 - std::countr_zero(capacity);
    count_ = 0;
    for (const Slot& s : old)
      if (s.key != 0) insert(s.key, s.value);
  }
  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
  int shift_ = 64;
  std::size_t count_ = 0;
};

// Memory for the bins' tree nodes: every node has the same size, so a free list over slabs
// serves them in a few instructions (the pool resources of <memory_resource> search size classes
// on every call). Used only under the allocator's lock.
class NodeArena final : public std::pmr::memory_resource {
 private:
  struct FreeNode {
    FreeNode* next;
  };
  void* do_allocate(std::size_t bytes, std::size_t align) override {
    if (node_bytes_ == 0) node_bytes_ = std::max(bytes, sizeof(FreeNode));
    if (bytes > node_bytes_ || align > alignof(std::max_align_t))
      return std::pmr::new_delete_resource()->allocate(bytes, align);
    if (free_ == nullptr) {
      constexpr std::size_t kNodesPerSlab = 256;
      const std::size_t stride = (node_bytes_ + alignof(std::max_align_t) - 1) / alignof(std::max_align_t) *
                                 alignof(std::max_align_t);
      slabs_.push_back(std::make_unique<std::max_align_t[]>(stride * kNodesPerSlab / sizeof(std::max_align_t)));
      char* base = reinterpret_cast<char*>(slabs_.back().get());
      for (std::size_t i = kNodesPerSlab; i-- > 0;) free_ = new (base + i * stride) FreeNode{free_};
    }
    FreeNode* n = free_;
    free_ = n->next;
    return n;
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t align) override {
    if (bytes > node_bytes_ || align > alignof(std::max_align_t)) {
      std::pmr::new_delete_resource()->deallocate(p, bytes, align);
      return;
    }
    free_ = new (p) FreeNode{free_};
  }
  bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override { return this == &other; }

  std::size_t node_bytes_ = 0;
  FreeNode* free_ = nullptr;
  std::vector<std::unique_ptr<std::max_align_t[]>> slabs_;
};

struct FreeKey {
  std::size_t size;
  char* ptr;
  std::uint32_t handle;
  bool operator<(const FreeKey& o) const { return size != o.size ? size < o.size : ptr < o.ptr; }
};
using Bin = std::pmr::set<FreeKey>;

struct Chunk {
  char* ptr = nullptr;
  std::size_t size = 0;
  std::uint32_t prev = kNone;  // neighbours inside the same region
  std::uint32_t next = kNone;
  bool in_use = false;
  Bin::iterator bin_pos;  // where a free chunk sits in its bin: erasing by position skips a search
};

struct Region {
  char* base;
  std::size_t size;
  std::uint32_t first;  // the chunk at base: its handle never changes (see merge_and_bin)
};

class BfcAllocator final : public Allocator {
 public:
  BfcAllocator(std::unique_ptr<SubAllocator> sub, BfcOptions opts)
      : sub_(std::move(sub)), opts_(std::move(opts)) {
    if (!sub_) raise<InvalidArgument>("make_bfc_allocator for ", opts_.device_name, ": the sub-allocator is null");
    if (opts_.limit_bytes < kGranule)
      raise<InvalidArgument>("memory limit of ", opts_.device_name, " is ", opts_.limit_bytes,
                             " bytes; it must be at least ", kGranule,
                             " bytes (set it with ProcessOptions::memory_limit_mb or ProcessOptions::per_process_gpu_memory_fraction)");
    if (opts_.allow_growth && opts_.initial_region_bytes == 0)
      raise<InvalidArgument>("initial region of ", opts_.device_name,
                             " is 0 bytes; use a positive BfcOptions::initial_region_bytes (default 2 MiB)");
    if (!(opts_.growth_cap >= 0.0))
      raise<InvalidArgument>("growth cap of ", opts_.device_name, " is ", opts_.growth_cap,
                             "; use a fraction of the pool such as 0.25, or 0 for pure doubling");
    set_limit(opts_.limit_bytes);
    limit_pending_ = static_cast<bool>(opts_.limit_at_first_use);
    for (auto& bin : bins_) bin = std::make_unique<Bin>(&node_pool_);
  }

  ~BfcAllocator() override {
    if (live_ != 0)
      log_warning(str("allocator of ", opts_.device_name, " destroyed with ", live_, " live allocations (",
                      format_bytes(in_use_), "); their memory is released now"));
    for (const Region& r : regions_) sub_->free(r.base, r.size);
  }

  void* allocate(std::size_t bytes) override {
    // allocate(0) still takes one granule so that the pointer is unique and must be freed.
    const std::size_t rounded = bytes > std::numeric_limits<std::size_t>::max() - kGranule
                                    ? std::numeric_limits<std::size_t>::max()
                                    : std::max(kGranule, round_up(bytes));
    std::lock_guard lock(mu_);
    if (limit_pending_) {  // before any region exists, so the new limit bounds the whole pool
      const std::size_t limit = opts_.limit_at_first_use();
      if (limit < kGranule)
        raise<InvalidArgument>("memory limit of ", opts_.device_name, " at first use is ", limit,
                               " bytes; it must be at least ", kGranule,
                               " bytes (set it with ProcessOptions::memory_limit_mb or ProcessOptions::per_process_gpu_memory_fraction)");
      set_limit(limit);
      limit_pending_ = false;
    }
    std::uint32_t h = rounded <= limit_ ? find_free(rounded) : kNone;
    bool region_refused = false;
    if (h == kNone && rounded <= limit_ && extend(rounded, &region_refused)) h = find_free(rounded);
    if (h == kNone) throw_oom(bytes, rounded, region_refused);
    return take(h, rounded);
  }

  void deallocate(void* ptr) override {
    if (ptr == nullptr) return;
    std::lock_guard lock(mu_);
    const auto key = reinterpret_cast<std::uintptr_t>(ptr);
    const std::uint32_t h = live_map_.erase(key);
    if (h == kNone) throw_bad_free(ptr);
    Chunk& c = chunks_[h];
    c.in_use = false;
    in_use_ -= c.size;
    --live_;
    merge_and_bin(h);
  }

  AllocatorStats stats() const override {
    std::lock_guard lock(mu_);
    return stats_locked();
  }

  void reset_peak() override {
    std::lock_guard lock(mu_);
    peak_ = in_use_;
  }

  std::string name() const override { return str(opts_.device_name, " BFC over ", sub_->name()); }

  std::size_t release_free_regions() override {
    std::lock_guard lock(mu_);
    return release_free_regions_locked();
  }

  std::string debug_dump() const override {
    std::lock_guard lock(mu_);
    return debug_dump_locked();
  }

 private:
  // The limit and the growth sizes that derive from it; only while the pool has no region.
  void set_limit(std::size_t limit_bytes) {
    limit_ = round_down(limit_bytes);
    initial_region_ = std::min(limit_, std::max(kGranule, round_up(opts_.initial_region_bytes)));
    next_region_ = initial_region_;
  }

  std::uint32_t new_chunk(const Chunk& c) {
    if (free_handles_.empty()) {
      chunks_.push_back(c);
      return static_cast<std::uint32_t>(chunks_.size() - 1);
    }
    const std::uint32_t h = free_handles_.back();
    free_handles_.pop_back();
    chunks_[h] = c;
    return h;
  }
  void delete_chunk(std::uint32_t h) { free_handles_.push_back(h); }

  void bin_insert(std::uint32_t h) {
    Chunk& c = chunks_[h];
    const int b = bin_of(c.size);
    c.bin_pos = bins_[b]->insert(FreeKey{c.size, c.ptr, h}).first;
    nonempty_ |= 1u << b;
  }
  void bin_erase(std::uint32_t h) {
    const Chunk& c = chunks_[h];
    const int b = bin_of(c.size);
    bins_[b]->erase(c.bin_pos);
    if (bins_[b]->empty()) nonempty_ &= ~(1u << b);
  }

  // The best-fitting free chunk for `rounded` bytes, still in its bin, or kNone.
  std::uint32_t find_free(std::size_t rounded) const {
    const int b = bin_of(rounded);
    std::uint32_t mask = nonempty_ & (~0u << b);
    if (mask & (1u << b)) {
      const Bin& bin = *bins_[b];
      auto it = bin.lower_bound(FreeKey{rounded, nullptr, 0});
      if (it != bin.end()) return it->handle;
      mask &= ~(1u << b);
    }
    // Every chunk of a higher bin is large enough; the first one is the smallest.
    if (mask == 0) return kNone;
    return bins_[std::countr_zero(mask)]->begin()->handle;
  }

  // Takes free chunk h for a request of `rounded` bytes: unbins it, splits off the rest.
  void* take(std::uint32_t h, std::size_t rounded) {
    bin_erase(h);
    if (chunks_[h].size > rounded) {
      Chunk rest;
      rest.ptr = chunks_[h].ptr + rounded;
      rest.size = chunks_[h].size - rounded;
      rest.prev = h;
      rest.next = chunks_[h].next;
      const std::uint32_t r = new_chunk(rest);  // may move chunks_: index afresh below
      if (chunks_[r].next != kNone) chunks_[chunks_[r].next].prev = r;
      chunks_[h].next = r;
      chunks_[h].size = rounded;
      bin_insert(r);
    }
    Chunk& c = chunks_[h];
    c.in_use = true;
    in_use_ += c.size;
    peak_ = std::max(peak_, in_use_);
    ++live_;
    ++num_allocs_;
    live_map_.insert(reinterpret_cast<std::uintptr_t>(c.ptr), h);
    return c.ptr;
  }

  // Merges the newly free chunk h with free neighbours and bins the result. The surviving chunk
  // is always the lower one, so a region's first chunk keeps its handle.
  void merge_and_bin(std::uint32_t h) {
    const std::uint32_t n = chunks_[h].next;
    if (n != kNone && !chunks_[n].in_use) {
      bin_erase(n);
      absorb_next(h);
    }
    const std::uint32_t p = chunks_[h].prev;
    if (p != kNone && !chunks_[p].in_use) {
      bin_erase(p);
      absorb_next(p);
      h = p;
    }
    bin_insert(h);
  }
  void absorb_next(std::uint32_t h) {
    const std::uint32_t n = chunks_[h].next;
    chunks_[h].size += chunks_[n].size;
    chunks_[h].next = chunks_[n].next;
    if (chunks_[h].next != kNone) chunks_[chunks_[h].next].prev = h;
    delete_chunk(n);
  }

  // Obtains a new region big enough for `rounded` (see Note [Growth and back-off]).
  bool extend(std::size_t rounded, bool* refused) {
    auto attempt = [&]() -> bool {
      const std::size_t remaining = limit_ - pool_bytes_;
      if (rounded > remaining) return false;
      std::size_t want;
      if (!opts_.allow_growth && regions_.empty()) {
        want = remaining;
      } else {
        want = next_region_;
        if (opts_.growth_cap > 0) {
          const auto cap = static_cast<std::size_t>(opts_.growth_cap * static_cast<double>(pool_bytes_));
          // In whole initial regions: capped sizes such as 2.4 MiB would leave tails that
          // power-of-two tensors cannot use.
          want = std::min(want, std::max(initial_region_, cap / initial_region_ * initial_region_));
        }
        want = std::clamp(want, rounded, remaining);
      }
      for (;;) {
        if (void* p = sub_->alloc(want)) {
          add_region(static_cast<char*>(p), want);
          return true;
        }
        *refused = true;
        if (want == rounded) return false;
        want = std::max(rounded, round_down(want / 10 * 9));
      }
    };
    if (attempt()) return true;
    // Empty regions count against the limit (and the device) without serving this request.
    return release_free_regions_locked() > 0 && attempt();
  }

  void add_region(char* base, std::size_t size) {
    if (reinterpret_cast<std::uintptr_t>(base) % kGranule != 0) {
      sub_->free(base, size);
      TW_CHECK(false, "sub-allocator ", sub_->name(), " returned a region at ", static_cast<void*>(base),
               " that is not ", kGranule, "-byte aligned");
    }
    Chunk c;
    c.ptr = base;
    c.size = size;
    const std::uint32_t h = new_chunk(c);
    Region r{base, size, h};
    regions_.insert(std::upper_bound(regions_.begin(), regions_.end(), r,
                                     [](const Region& a, const Region& b) { return a.base < b.base; }),
                    r);
    pool_bytes_ += size;
    next_region_ = size <= limit_ / 2 ? size * 2 : limit_;
    bin_insert(h);
    if (!opts_.allow_growth && regions_.size() == 1 && size < limit_)
      log_warning(str(opts_.device_name, ": reserved ", format_bytes(size), " of its ", format_bytes(limit_),
                      " limit; the device refused more"));
  }

  std::size_t release_free_regions_locked() {
    std::size_t released = 0;
    std::vector<Region> kept;
    for (const Region& r : regions_) {
      const Chunk& c = chunks_[r.first];
      if (!c.in_use && c.size == r.size) {
        bin_erase(r.first);
        delete_chunk(r.first);
        sub_->free(r.base, r.size);
        pool_bytes_ -= r.size;
        released += r.size;
      } else {
        kept.push_back(r);
      }
    }
    regions_ = std::move(kept);
    return released;
  }

  std::size_t largest_free_locked() const {
    if (nonempty_ == 0) return 0;
    return bins_[31 - std::countl_zero(nonempty_)]->rbegin()->size;
  }

  AllocatorStats stats_locked() const {
    AllocatorStats s;
    s.bytes_in_use = in_use_;
    s.peak_bytes_in_use = peak_;
    s.bytes_limit = limit_;
    s.pool_bytes = pool_bytes_;
    s.largest_free_block = largest_free_locked();
    s.num_allocs = num_allocs_;
    s.live_allocs = live_;
    s.num_regions = regions_.size();
    const std::size_t free_bytes = pool_bytes_ - in_use_;
    s.fragmentation = free_bytes == 0 ? 0.0
                                      : 1.0 - static_cast<double>(s.largest_free_block) /
                                                  static_cast<double>(free_bytes);
    return s;
  }

  [[noreturn]] void throw_oom(std::size_t bytes, std::size_t rounded, bool region_refused) const {
    const AllocatorStats s = stats_locked();
    const bool is_gpu = opts_.device_name.find("gpu") != std::string::npos ||
                        opts_.device_name.find("GPU") != std::string::npos;
    // The device's entry (a name such as "/gpu:1 (test)" keeps only its device part).
    const std::string device = opts_.device_name.substr(0, opts_.device_name.find(' '));
    const std::string limit_field = str("ProcessOptions::memory_limit_mb[", device, "]");
    const std::string raise_limit =
        is_gpu ? str("raise the limit with ", limit_field, " or ProcessOptions::per_process_gpu_memory_fraction")
               : str("raise the limit with ", limit_field);
    std::string why, fix;
    if (rounded > limit_) {
      why = "the request alone exceeds the limit";
      fix = raise_limit + ", or use a smaller FitOptions::batch";
    } else if (region_refused) {
      why = str("the device refused a new region (other processes or devices on it hold memory; the pool "
                "is ", format_bytes(s.pool_bytes), " of its limit)");
      fix = is_gpu ? "set ProcessOptions::allow_growth = true so that each pool takes only what it needs, "
                     "lower ProcessOptions::per_process_gpu_memory_fraction or the ProcessOptions::memory_limit_mb "
                     "of the devices sharing this GPU, or use a smaller FitOptions::batch"
                   : "lower the ProcessOptions::memory_limit_mb of the devices sharing this host, or use a "
                     "smaller FitOptions::batch";
    } else if (s.bytes_in_use + rounded <= limit_) {
      why = "the free memory is fragmented: no free block is large enough";
      fix = "use a smaller FitOptions::batch, or " + raise_limit;
    } else {
      why = "the limit is reached";
      fix = "use a smaller FitOptions::batch, or " + raise_limit;
    }
    std::string msg = str("out of memory on ", opts_.device_name, ": cannot allocate ", bytes, " bytes (",
                          format_bytes(rounded), " rounded); ", why, ". Limit ", format_bytes(limit_),
                          ", in use ", format_bytes(s.bytes_in_use), " in ", s.live_allocs,
                          s.live_allocs == 1 ? " allocation" : " allocations", ", pool ",
                          format_bytes(s.pool_bytes), " in ", s.num_regions,
                          s.num_regions == 1 ? " region" : " regions", ", largest free block ",
                          format_bytes(s.largest_free_block), ". To fix: ", fix, ".");
    const char* env = std::getenv("TOWERFLOW_ALLOCATOR_DUMP");
    if (opts_.dump_on_oom || (env != nullptr && std::string(env) == "1"))
      msg += "\n" + debug_dump_locked();
    else
      msg += " (TOWERFLOW_ALLOCATOR_DUMP=1 adds a per-bin dump of the pool.)";
    throw OutOfMemory(msg);
  }

  [[noreturn]] void throw_bad_free(void* ptr) const {
    const char* p = static_cast<char*>(ptr);
    for (const Region& r : regions_) {
      if (p >= r.base && p < r.base + r.size)
        raise<InvalidArgument>("deallocate(", ptr, ") on ", opts_.device_name,
                               ": the pointer lies in this pool but is not a live allocation (freed twice, "
                               "or not the start of an allocation); nothing was changed");
    }
    raise<InvalidArgument>("deallocate(", ptr, ") on ", opts_.device_name,
                           ": the pointer was not allocated by this allocator (free it with the allocator "
                           "of the device that made it); nothing was changed");
  }

  std::string debug_dump_locked() const {
    struct BinInfo {
      std::size_t free_chunks = 0, free_bytes = 0, largest_free = 0, used_chunks = 0, used_bytes = 0;
    };
    BinInfo info[kNumBins];
    for (const Region& r : regions_) {
      for (std::uint32_t h = r.first; h != kNone; h = chunks_[h].next) {
        const Chunk& c = chunks_[h];
        BinInfo& bi = info[bin_of(c.size)];
        if (c.in_use) {
          ++bi.used_chunks;
          bi.used_bytes += c.size;
        } else {
          ++bi.free_chunks;
          bi.free_bytes += c.size;
          bi.largest_free = std::max(bi.largest_free, c.size);
        }
      }
    }
    std::string out = str("allocator ", name(), ": ", format_stats(stats_locked()), "\n");
    for (int b = 0; b < kNumBins; ++b) {
      const BinInfo& bi = info[b];
      if (bi.free_chunks == 0 && bi.used_chunks == 0) continue;
      out += str("  bin ", b, " [", format_bytes(bin_min_size(b)), ", ",
                 b + 1 < kNumBins ? format_bytes(bin_min_size(b + 1)) : std::string("inf"), "): ",
                 bi.used_chunks, " in use (", format_bytes(bi.used_bytes), "), ", bi.free_chunks, " free (",
                 format_bytes(bi.free_bytes), ", largest ", format_bytes(bi.largest_free), ")\n");
    }
    for (const Region& r : regions_) {
      std::size_t chunks = 0, used = 0;
      for (std::uint32_t h = r.first; h != kNone; h = chunks_[h].next) {
        ++chunks;
        if (chunks_[h].in_use) used += chunks_[h].size;
      }
      out += str("  region ", static_cast<void*>(r.base), " ", format_bytes(r.size), ": ", chunks,
                 " chunks, ", format_bytes(used), " in use\n");
    }
    return out;
  }

  std::unique_ptr<SubAllocator> sub_;
  const BfcOptions opts_;
  std::size_t limit_ = 0;
  std::size_t initial_region_ = 0;
  std::size_t next_region_ = 0;
  bool limit_pending_ = false;  // opts_.limit_at_first_use is still to be called

  mutable std::mutex mu_;
  std::vector<Chunk> chunks_;
  std::vector<std::uint32_t> free_handles_;
  std::vector<Region> regions_;  // sorted by base
  NodeArena node_pool_;
  std::unique_ptr<Bin> bins_[kNumBins];
  std::uint32_t nonempty_ = 0;  // bit b set when bin b has a free chunk
  PointerMap live_map_;

  std::size_t in_use_ = 0;
  std::size_t peak_ = 0;
  std::size_t pool_bytes_ = 0;
  std::size_t num_allocs_ = 0;
  std::size_t live_ = 0;
};

}  // namespace

std::unique_ptr<Allocator> make_bfc_allocator(std::unique_ptr<SubAllocator> sub, BfcOptions opts) {
  return std::make_unique<BfcAllocator>(std::move(sub), std::move(opts));
}

}  // namespace towerflow
