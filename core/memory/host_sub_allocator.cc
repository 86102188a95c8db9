// Aligned host memory for CPU devices' pools.
//
// Regions come from mmap rather than malloc: a region is large and long-lived, mmap gives
// page-aligned memory (so every 256-byte chunk offset stays aligned), untouched pages cost nothing
// until first written (a no-growth pool that reserves its whole limit does not commit it), and
// munmap returns the memory to the system at once when the pool releases a region.

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>

#include "core/memory/allocator.h"

namespace towerflow {
namespace {

std::size_t page_size() {
  static const std::size_t kPage = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return kPage;
}

std::size_t round_to_pages(std::size_t bytes) {
  const std::size_t page = page_size();
  return (bytes + page - 1) / page * page;
}

class HostSubAllocator final : public SubAllocator {
 public:
  void* alloc(std::size_t bytes) override {
    if (bytes == 0 || bytes > SIZE_MAX / 2) return nullptr;
    void* p = mmap(nullptr, round_to_pages(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    return p == MAP_FAILED ? nullptr : p;
  }
  void free(void* ptr, std::size_t bytes) override {
    if (ptr != nullptr) munmap(ptr, round_to_pages(bytes));
  }
  std::string name() const override { return "host"; }
};

}  // namespace

std::unique_ptr<SubAllocator> make_host_sub_allocator() { return std::make_unique<HostSubAllocator>(); }

}  // namespace towerflow
