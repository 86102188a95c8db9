#define EIGEN_USE_THREADS
#include "core/cpu/context.h"

#include <algorithm>
#include <exception>
#include <mutex>
#include <unsupported/Eigen/CXX11/Tensor>

#include "core/error.h"

namespace towerflow::cpu {

struct CpuContext::Impl {
  // Eigen's pool runs threads-1 workers: the calling thread does a share of every parallel loop.
  explicit Impl(int threads)
      : pool(std::max(1, threads - 1)), device(&pool, std::max(1, threads)) {}
  Eigen::ThreadPool pool;
  Eigen::ThreadPoolDevice device;
};

CpuContext::CpuContext(int threads) : threads_(std::max(1, threads)) {
  impl_ = std::make_unique<Impl>(threads_);
}

CpuContext::~CpuContext() = default;

Eigen::ThreadPoolDevice& CpuContext::eigen() const { return impl_->device; }

void CpuContext::parallel_for(std::int64_t n, std::int64_t min_chunk,
                              const std::function<void(std::int64_t, std::int64_t)>& fn) const {
  if (n <= 0) return;
  min_chunk = std::max<std::int64_t>(1, min_chunk);
  std::int64_t chunks = std::min<std::int64_t>(threads_, n / min_chunk);
  if (chunks <= 1) {
    fn(0, n);
    return;
  }
  Eigen::Barrier barrier(static_cast<unsigned>(chunks - 1));
  std::exception_ptr first_error;
  std::mutex error_mu;
  auto run = [&](std::int64_t c) {
    std::int64_t begin = c * n / chunks, end = (c + 1) * n / chunks;  // balanced: each >= min_chunk
    try {
      if (begin < end) fn(begin, end);
    } catch (...) {
      std::lock_guard lock(error_mu);
      if (!first_error) first_error = std::current_exception();
    }
  };
  for (std::int64_t c = 1; c < chunks; ++c)
    impl_->pool.Schedule([&, c] {
      run(c);
      barrier.Notify();
    });
  run(0);
  barrier.Wait();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace towerflow::cpu
