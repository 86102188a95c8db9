#pragma once
// Batch: what the loader hands to the trainer, a host-side block of images and labels.
//
// Contract: images are float32 in NHWC order (channels last, the layout the kernels use),
// already augmented and normalised; labels are class indices in [0, num_classes). A batch holds
// this rank's share of one global batch: `n` rows out of `global_n`, starting at row
// `global_offset` of the global batch. `n` may be smaller than the loader's per-rank batch (or 0)
// only in the last step of an epoch with keep-last.
//
// The image buffer comes from a pluggable HostAllocator so the trainer can supply pinned memory
// for fast, asynchronous host-to-GPU copies; the default is 64-byte aligned pageable memory.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace towerflow {
class Allocator;
class SubAllocator;
}  // namespace towerflow

namespace towerflow::data {

// Where batch buffers come from. allocate(bytes) returns memory aligned to at least 64 bytes or
// throws; deallocate(ptr, bytes) gives it back. Both may be called from the loader's threads
// (never concurrently for the same pointer); the allocator must outlive every loader using it.
struct HostAllocator {
  std::function<void*(std::size_t)> allocate;
  std::function<void(void*, std::size_t)> deallocate;
  std::string name = "host";
};

// 64-byte aligned pageable memory (operator new with alignment). The default.
HostAllocator aligned_host_allocator();
// Wraps an Allocator from core/memory (e.g. a BFC pool over pinned host memory). Not owned.
HostAllocator host_allocator_from(Allocator& allocator);
// Wraps a SubAllocator from core/memory, e.g. make_pinned_host_sub_allocator(). Not owned; calls
// to it are serialised. Throws OutOfMemory when the sub-allocator returns no region.
HostAllocator host_allocator_from(SubAllocator& sub_allocator);

// A fixed-size float array in memory from a HostAllocator. Move-only.
class FloatBuffer {
 public:
  FloatBuffer() = default;
  FloatBuffer(std::size_t count, HostAllocator allocator);
  ~FloatBuffer();
  FloatBuffer(FloatBuffer&& other) noexcept;
  FloatBuffer& operator=(FloatBuffer&& other) noexcept;
  FloatBuffer(const FloatBuffer&) = delete;
  FloatBuffer& operator=(const FloatBuffer&) = delete;

  float* data() { return data_; }
  const float* data() const { return data_; }
  std::size_t size() const { return size_; }  // in floats
  std::size_t bytes() const { return size_ * sizeof(float); }
  float& operator[](std::size_t i) { return data_[i]; }
  const float& operator[](std::size_t i) const { return data_[i]; }
  float* begin() { return data_; }
  float* end() { return data_ + size_; }
  const float* begin() const { return data_; }
  const float* end() const { return data_ + size_; }
  std::span<const float> span() const { return {data_, size_}; }
  const std::string& allocator_name() const { return allocator_.name; }

 private:
  void release();
  float* data_ = nullptr;
  std::size_t size_ = 0;
  HostAllocator allocator_;
};

struct Batch {
  int n = 0, h = 0, w = 0, c = 0;      // this rank's rows and the image shape
  FloatBuffer images;                   // capacity for the full per-rank batch; the first n*h*w*c are valid
  std::vector<std::int32_t> labels;     // n labels
  std::vector<std::int64_t> indices;    // n dataset indices (which items these rows came from)
  std::int64_t epoch = 0;
  std::int64_t index_in_epoch = 0;      // the step: 0 .. steps_per_epoch()-1
  int global_n = 0;                     // rows of the global batch over all ranks (for loss scaling)
  int global_offset = 0;                // where this rank's rows start in the global batch
  // Mixed images (LoaderOptions::mix): row i's target is mix * onehot(labels[i]) + (1 - mix) *
  // onehot(mix_labels[i]); mix_labels is empty and mix 1 for a batch that was not mixed.
  std::vector<std::int32_t> mix_labels;
  float mix = 1;

  std::size_t image_floats() const { return static_cast<std::size_t>(h) * w * c; }
  // Row i's pixels, h*w*c floats (HWC).
  std::span<const float> image(int i) const {
    return {images.data() + static_cast<std::size_t>(i) * image_floats(), image_floats()};
  }
  // All valid rows: n*h*w*c floats.
  std::span<const float> valid_images() const { return {images.data(), n * image_floats()}; }
};

}  // namespace towerflow::data
