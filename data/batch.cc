#include "data/batch.h"

#include <memory>
#include <mutex>
#include <new>
#include <utility>

#include "core/error.h"
#include "core/memory/allocator.h"

namespace towerflow::data {

HostAllocator aligned_host_allocator() {
  constexpr std::align_val_t kAlign{64};
  return HostAllocator{
      .allocate = [](std::size_t bytes) { return ::operator new(bytes == 0 ? 1 : bytes, kAlign); },
      .deallocate = [](void* p, std::size_t) { ::operator delete(p, kAlign); },
      .name = "aligned host",
  };
}

HostAllocator host_allocator_from(Allocator& allocator) {
  Allocator* a = &allocator;
  return HostAllocator{
      .allocate = [a](std::size_t bytes) { return a->allocate(bytes); },
      .deallocate = [a](void* p, std::size_t) { a->deallocate(p); },
      .name = allocator.name(),
  };
}

HostAllocator host_allocator_from(SubAllocator& sub_allocator) {
  // Sub-allocators do not synchronise themselves (their pool's lock normally does), so calls
  // through this adapter are serialised here.
  SubAllocator* s = &sub_allocator;
  auto mutex = std::make_shared<std::mutex>();
  return HostAllocator{
      .allocate =
          [s, mutex](std::size_t bytes) {
            std::lock_guard lock(*mutex);
            void* p = s->alloc(bytes);
            if (p == nullptr)
              raise<OutOfMemory>("the ", s->name(), " sub-allocator could not provide a batch buffer of ",
                                 bytes, " bytes; use a smaller LoaderOptions::batch or fewer prefetched batches (LoaderOptions::prefetch)");
            return p;
          },
      .deallocate =
          [s, mutex](void* p, std::size_t bytes) {
            std::lock_guard lock(*mutex);
            s->free(p, bytes);
          },
      .name = sub_allocator.name(),
  };
}

FloatBuffer::FloatBuffer(std::size_t count, HostAllocator allocator) : allocator_(std::move(allocator)) {
  TW_CHECK(allocator_.allocate && allocator_.deallocate, "HostAllocator '", allocator_.name,
           "' lacks allocate or deallocate");
  data_ = static_cast<float*>(allocator_.allocate(count * sizeof(float)));
  TW_CHECK(data_ != nullptr, "HostAllocator '", allocator_.name, "' returned null for ", count * sizeof(float),
           " bytes");
  size_ = count;
}

FloatBuffer::~FloatBuffer() { release(); }

FloatBuffer::FloatBuffer(FloatBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      allocator_(std::move(other.allocator_)) {}

FloatBuffer& FloatBuffer::operator=(FloatBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    allocator_ = std::move(other.allocator_);
  }
  return *this;
}

void FloatBuffer::release() {
  if (data_ != nullptr) allocator_.deallocate(data_, size_ * sizeof(float));
  data_ = nullptr;
  size_ = 0;
}

}  // namespace towerflow::data
