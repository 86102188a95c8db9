#pragma once
// Allocator: the interface every logical device's memory goes through.
//
// Contract: allocate() returns memory aligned to kAllocatorAlignment (256 bytes) or throws
// OutOfMemory (a message naming the device, the request and its rounded size, the limit, what is
// in use, the largest free block and the flag that would help; a per-bin dump is appended with
// BfcOptions::dump_on_oom or TOWERFLOW_ALLOCATOR_DUMP=1). A failed allocate() leaves every
// allocation as it was (it may have returned empty regions to the sub-allocator).
// Requests are rounded up to a multiple of 256 bytes; the statistics count rounded sizes.
// allocate(0) returns a valid, unique, non-null pointer (one 256-byte granule) that must still be
// deallocated. deallocate(nullptr) does nothing. deallocate() of a pointer this allocator did not
// hand out, of an interior pointer, or of one already freed, throws InvalidArgument and changes
// nothing. Every method is thread-safe: towers allocate concurrently (one lock per allocator).
// An allocator must outlive every pointer it handed out; destroying it with live allocations
// logs a warning and releases their memory.
//
// make_bfc_allocator: touches nothing until the first allocate(). With allow_growth the pool
// starts with one region of initial_region_bytes and adds regions that double (see growth_cap) up
// to limit_bytes; without, the first allocate() reserves the whole limit as one region. A region
// the sub-allocator refuses is retried in 10% smaller steps down to the request, then after
// releasing empty regions, before OutOfMemory. Throws InvalidArgument for a null sub-allocator,
// a limit under 256 bytes, a zero initial region or a negative growth_cap.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/device.h"

namespace towerflow {

inline constexpr std::size_t kAllocatorAlignment = 256;

struct AllocatorStats {
  std::size_t bytes_in_use = 0;         // sum of live allocations' rounded sizes
  std::size_t peak_bytes_in_use = 0;    // since creation or the last reset_peak()
  std::size_t bytes_limit = 0;          // the most this allocator may obtain
  std::size_t pool_bytes = 0;           // bytes obtained from the sub-allocator (regions)
  std::size_t largest_free_block = 0;   // the largest request that would succeed without growth
  std::size_t num_allocs = 0;           // allocations made so far (not live ones)
  std::size_t live_allocs = 0;          // allocations not yet freed
  std::size_t num_regions = 0;
  double fragmentation = 0.0;           // 1 - largest_free_block / free bytes in the pool (0 if none free)
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* ptr) = 0;
  virtual AllocatorStats stats() const = 0;
  virtual void reset_peak() = 0;
  virtual std::string name() const = 0;  // e.g. "/gpu:0 BFC over cudaMalloc"
  // Returns regions with no live allocation to the sub-allocator; returns the bytes given back.
  // (Freed memory otherwise stays in the pool for reuse: a steady-state step makes no region.)
  virtual std::size_t release_free_regions() { return 0; }
  // A per-bin dump of the pool for out-of-memory reports and debugging.
  virtual std::string debug_dump() const { return {}; }
};

// SubAllocator: obtains and returns raw regions (aligned host memory, cudaMalloc, cudaHostAlloc).
// alloc() returns nullptr when the region cannot be had (the BFC allocator then backs off).
class SubAllocator {
 public:
  virtual ~SubAllocator() = default;
  virtual void* alloc(std::size_t bytes) = 0;
  virtual void free(void* ptr, std::size_t bytes) = 0;
  virtual std::string name() const = 0;  // "host", "cudaMalloc", "cudaHostAlloc"
};

struct BfcOptions {
  std::string device_name;                    // for messages: "/gpu:0"
  std::size_t limit_bytes = 0;                // hard limit of the pool
  bool allow_growth = true;                   // grow in doubling regions, else reserve the limit on first use
  std::size_t initial_region_bytes = 2 << 20; // first region with growth
  double growth_cap = 0.25;                   // with growth, each new region doubles the last but is
                                              // at most max(initial_region_bytes, growth_cap * pool
                                              // bytes) unless the request needs more: the idle tail of
                                              // a growing pool stays near a quarter of it, not half.
                                              // 0: pure doubling (TensorFlow's behaviour)
  bool dump_on_oom = false;                   // append debug_dump() to out-of-memory messages
                                              // (also TOWERFLOW_ALLOCATOR_DUMP=1)
  // When set, the first allocate() calls it, under the allocator's lock and before it obtains any
  // region, and its result (at least 256 bytes, else InvalidArgument) becomes the limit: for a
  // default that depends on the device's state at first use (a GPU's free memory). Until then
  // limit_bytes is the limit stats() report, an upper bound. What it throws, that allocate()
  // throws, and the next allocate() calls it again.
  std::function<std::size_t()> limit_at_first_use;
};

std::unique_ptr<Allocator> make_bfc_allocator(std::unique_ptr<SubAllocator> sub, BfcOptions opts);
std::unique_ptr<SubAllocator> make_host_sub_allocator();

}  // namespace towerflow
