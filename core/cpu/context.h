#pragma once
// CpuContext: the intra-op threads of one logical CPU device, shared by every CPU kernel.
//
// Contract: parallel_for blocks until every chunk has run; chunks run on the context's threads-1
// workers and on the calling thread. Exceptions thrown by a chunk are rethrown on the caller
// after all chunks have finished. A context is used by one tower thread at a time (each logical
// device has its own context), but distinct contexts run concurrently. A parallel_for inside a
// chunk of the same context runs on the thread that calls it. Between loops the workers wait
// spinning for a short while, then sleep (Note [Waking the workers] in context.cc).

#include <cstdint>
#include <functional>
#include <memory>

namespace towerflow::cpu {

class CpuContext {
 public:
  explicit CpuContext(int threads);
  ~CpuContext();
  CpuContext(const CpuContext&) = delete;
  CpuContext& operator=(const CpuContext&) = delete;

  int threads() const { return threads_; }

  // Runs fn(begin, end) over [0, n) in at most threads() contiguous chunks, each at least
  // min_chunk long (so small loops stay on the calling thread).
  void parallel_for(std::int64_t n, std::int64_t min_chunk,
                    const std::function<void(std::int64_t, std::int64_t)>& fn) const;

 private:
  struct Impl;
  int threads_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace towerflow::cpu
