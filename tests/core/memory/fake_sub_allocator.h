#pragma once
// A sub-allocator for tests: real host memory, with a budget past which it refuses regions (as a
// GPU shared with other processes does), and a record of what it was asked.

#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/memory/allocator.h"

namespace towerflow::testing {

struct SubAllocatorLog {
  std::mutex mu;
  std::size_t budget = static_cast<std::size_t>(-1);  // bytes it will hand out in total
  std::size_t held = 0;                                // bytes handed out and not yet returned
  std::vector<std::size_t> granted;                    // sizes of granted regions, in order
  std::vector<std::size_t> refused;                    // sizes of refused requests, in order
  std::size_t frees = 0;
  std::map<std::uintptr_t, std::size_t> regions;       // live regions: base -> size
};

class FakeSubAllocator final : public SubAllocator {
 public:
  explicit FakeSubAllocator(std::shared_ptr<SubAllocatorLog> log) : log_(std::move(log)) {}
  void* alloc(std::size_t bytes) override {
    std::lock_guard lock(log_->mu);
    if (log_->held + bytes > log_->budget) {
      log_->refused.push_back(bytes);
      return nullptr;
    }
    void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (p == nullptr) return nullptr;
    log_->held += bytes;
    log_->granted.push_back(bytes);
    log_->regions[reinterpret_cast<std::uintptr_t>(p)] = bytes;
    return p;
  }
  void free(void* ptr, std::size_t bytes) override {
    std::lock_guard lock(log_->mu);
    log_->held -= bytes;
    ++log_->frees;
    log_->regions.erase(reinterpret_cast<std::uintptr_t>(ptr));
    std::free(ptr);
  }
  std::string name() const override { return "fake"; }

 private:
  std::shared_ptr<SubAllocatorLog> log_;
};

}  // namespace towerflow::testing
