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

// Note [Huge pages for regions]
// A training step streams through tens of MiB of activations and gradients; with 4 KiB pages each
// pass over an 8 MiB tensor touches 2048 pages, more than the second-level TLB holds across a
// step, and under a hypervisor every TLB miss walks two page tables. Regions of 2 MiB or more
// therefore start on a 2 MiB boundary and are advised MADV_HUGEPAGE, so that where the kernel's
// transparent huge pages are "madvise" (a common default) or "always" they are backed by 2 MiB
// pages. Elsewhere the advice is ignored and the region is as before.
constexpr std::size_t kHugePage = std::size_t{2} << 20;

std::size_t round_to_pages(std::size_t bytes) {
  const std::size_t page = page_size();
  return (bytes + page - 1) / page * page;
}

class HostSubAllocator final : public SubAllocator {
 public:
  void* alloc(std::size_t bytes) override {
    if (bytes == 0 || bytes > SIZE_MAX / 2) return nullptr;
    const std::size_t len = round_to_pages(bytes);
    if (len < kHugePage) {
      void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      return p == MAP_FAILED ? nullptr : p;
    }
    // Note [Huge pages for regions]: len + one huge page mapped, the head and tail cut off so
    // that the region starts on a huge-page boundary.
    void* raw = mmap(nullptr, len + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return nullptr;
    const std::uintptr_t start = reinterpret_cast<std::uintptr_t>(raw);
    const std::uintptr_t aligned = (start + kHugePage - 1) / kHugePage * kHugePage;
    const std::size_t head = aligned - start;
    if (head != 0) munmap(raw, head);
    if (kHugePage - head != 0) munmap(reinterpret_cast<void*>(aligned + len), kHugePage - head);
    void* p = reinterpret_cast<void*>(aligned);
    madvise(p, len, MADV_HUGEPAGE);  // advice: a kernel without transparent huge pages ignores it
    return p;
  }
  void free(void* ptr, std::size_t bytes) override {
    if (ptr != nullptr) munmap(ptr, round_to_pages(bytes));
  }
  std::string name() const override { return "host"; }
};

}  // namespace

std::unique_ptr<SubAllocator> make_host_sub_allocator() { return std::make_unique<HostSubAllocator>(); }

}  // namespace towerflow
