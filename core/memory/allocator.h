#pragma once
// Allocator: the interface every logical device's memory goes through.
//
// Contract: allocate() returns memory aligned to kAllocatorAlignment (256 bytes) or throws
// OutOfMemory (a message naming the device, the request, the limit and the pool's state).
// allocate(0) returns a valid, unique, non-null pointer that must still be deallocated.
// deallocate() of a pointer this allocator did not hand out, or of one already freed, throws
// InvalidArgument and changes nothing. Every method is thread-safe: towers allocate concurrently.

#include <cstddef>
#include <cstdint>
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
  // Frees regions with no live allocation; returns the bytes given back.
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
};

std::unique_ptr<Allocator> make_bfc_allocator(std::unique_ptr<SubAllocator> sub, BfcOptions opts);
std::unique_ptr<SubAllocator> make_host_sub_allocator();

}  // namespace towerflow
