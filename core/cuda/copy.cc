// Host <-> device and device <-> device copies, pinned host memory.
//
// Note [Copies order both streams]
// copy_between_devices reads memory that belongs to the source's stream and writes memory that
// belongs to the destination's. It runs on the destination's stream after an event recorded on
// the source's stream (so it sees every kernel queued there before the call), and the source's
// stream then waits for an event recorded after the copy (so a later kernel on the source, or a
// stream-ordered free and reuse of the source buffer, cannot overwrite bytes not yet copied).
// Neither host thread blocks.

#include <algorithm>
#include <cstring>
#include <mutex>
#include <set>
#include <utility>

#include "core/cuda/context_impl.h"
#include "core/cuda/copy.h"

namespace towerflow::gpu {

namespace {

const char* byte_ptr(const void* p) { return static_cast<const char*>(p); }
char* byte_ptr(void* p) { return static_cast<char*>(p); }

// Enables direct access between two GPUs once per pair, in both directions.
void enable_peer_access_once(int a, int b) {
  if (a == b) return;  // one GPU: nothing to enable
  static std::mutex mutex;
  static std::set<std::pair<int, int>> tried;
  std::lock_guard lock(mutex);
  if (!tried.insert({std::min(a, b), std::max(a, b)}).second) return;
  if (!can_access_peer(a, b)) return;  // cudaMemcpyPeerAsync then stages through the host itself
  for (auto [from, to] : {std::pair{a, b}, std::pair{b, a}}) {
    TW_CUDA_CHECK(cudaSetDevice(from));
    const cudaError_t status = cudaDeviceEnablePeerAccess(to, 0);
    if (status == cudaErrorPeerAccessAlreadyEnabled) {
      cudaGetLastError();
    } else {
      TW_CUDA_CHECK(status);
    }
  }
}

}  // namespace

bool can_access_peer(int ordinal_a, int ordinal_b) {
  if (ordinal_a == ordinal_b) return true;
  int yes_ab = 0, yes_ba = 0;
  TW_CUDA_CHECK(cudaDeviceCanAccessPeer(&yes_ab, ordinal_a, ordinal_b));
  TW_CUDA_CHECK(cudaDeviceCanAccessPeer(&yes_ba, ordinal_b, ordinal_a));
  return yes_ab != 0 && yes_ba != 0;
}

void copy_to_device(const GpuContext& ctx, void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  GpuContext::Impl& m = ctx.impl();
  auto scope = m.scope();
  std::lock_guard lock(m.staging_mu);  // the staging buffers are shared by every caller thread
  for (std::size_t off = 0; off < bytes; off += GpuContext::Impl::kStagingBytes) {
    const std::size_t len = std::min(GpuContext::Impl::kStagingBytes, bytes - off);
    const int i = m.next_staging;
    m.next_staging ^= 1;
    // Wait until the GPU has finished reading this buffer's previous contents.
    TW_CUDA_CHECK(cudaEventSynchronize(m.staging_done[i]));
    std::memcpy(m.staging[i], byte_ptr(src) + off, len);
    TW_CUDA_CHECK(cudaMemcpyAsync(byte_ptr(dst) + off, m.staging[i], len, cudaMemcpyHostToDevice,
                                  m.stream));
    TW_CUDA_CHECK(cudaEventRecord(m.staging_done[i], m.stream));
  }
}

void copy_to_host(const GpuContext& ctx, void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  GpuContext::Impl& m = ctx.impl();
  auto scope = m.scope();
  std::lock_guard lock(m.staging_mu);  // the staging buffers are shared by every caller thread
  // Two buffers in turn: while the GPU fills one, the host drains the other.
  int pending = -1;
  std::size_t pending_off = 0, pending_len = 0;
  auto drain = [&] {
    TW_CUDA_CHECK(cudaEventSynchronize(m.staging_done[pending]));
    std::memcpy(byte_ptr(dst) + pending_off, m.staging[pending], pending_len);
  };
  for (std::size_t off = 0; off < bytes; off += GpuContext::Impl::kStagingBytes) {
    const std::size_t len = std::min(GpuContext::Impl::kStagingBytes, bytes - off);
    const int i = m.next_staging;
    m.next_staging ^= 1;
    TW_CUDA_CHECK(cudaEventSynchronize(m.staging_done[i]));
    TW_CUDA_CHECK(cudaMemcpyAsync(m.staging[i], byte_ptr(src) + off, len, cudaMemcpyDeviceToHost,
                                  m.stream));
    TW_CUDA_CHECK(cudaEventRecord(m.staging_done[i], m.stream));
    if (pending >= 0) drain();
    pending = i;
    pending_off = off;
    pending_len = len;
  }
  drain();
}

void copy_device_to_device(const GpuContext& ctx, void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  auto scope = ctx.impl().scope();
  TW_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_of(ctx)));
}

void copy_between_devices(const GpuContext& dst_ctx, void* dst, const GpuContext& src_ctx,
                          const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  if (&dst_ctx == &src_ctx) return copy_device_to_device(dst_ctx, dst, src, bytes);
  enable_peer_access_once(dst_ctx.ordinal(), src_ctx.ordinal());
  GpuEvent source_ready(src_ctx);
  source_ready.record();
  source_ready.make_wait(dst_ctx);
  {
    auto scope = dst_ctx.impl().scope();
    if (dst_ctx.ordinal() == src_ctx.ordinal()) {
      // Virtual devices on one GPU: an ordinary device-to-device copy.
      TW_CUDA_CHECK(
          cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_of(dst_ctx)));
    } else {
      // Direct over NVLink/PCIe when peer access is enabled, else the driver stages via the host.
      TW_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_ctx.ordinal(), src, src_ctx.ordinal(), bytes,
                                        stream_of(dst_ctx)));
    }
  }
  GpuEvent copied(dst_ctx);
  copied.record();
  copied.make_wait(src_ctx);
  // Destroying the events here is fine: CUDA keeps a recorded event's work alive until done.
}

void copy_to_device_async(const GpuContext& ctx, void* dst, const void* pinned_src,
                          std::size_t bytes) {
  if (bytes == 0) return;
  auto scope = ctx.impl().scope();
  TW_CUDA_CHECK(
      cudaMemcpyAsync(dst, pinned_src, bytes, cudaMemcpyHostToDevice, stream_of(ctx)));
}

void copy_to_host_async(const GpuContext& ctx, void* pinned_dst, const void* src,
                        std::size_t bytes) {
  if (bytes == 0) return;
  auto scope = ctx.impl().scope();
  TW_CUDA_CHECK(
      cudaMemcpyAsync(pinned_dst, src, bytes, cudaMemcpyDeviceToHost, stream_of(ctx)));
}

void memset_device(const GpuContext& ctx, void* dst, int value, std::size_t bytes) {
  if (bytes == 0) return;
  auto scope = ctx.impl().scope();
  TW_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, stream_of(ctx)));
}

// ---- PinnedBuffer ------------------------------------------------------------------------------

PinnedBuffer::PinnedBuffer(std::size_t bytes) : bytes_(bytes) {
  // Portable: usable for transfers to every GPU, whichever is current now.
  TW_CUDA_CHECK(cudaHostAlloc(&ptr_, std::max<std::size_t>(bytes, 1), cudaHostAllocPortable));
}

PinnedBuffer::~PinnedBuffer() {
  if (ptr_ != nullptr) cudaFreeHost(ptr_);
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    if (ptr_ != nullptr) cudaFreeHost(ptr_);
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

}  // namespace towerflow::gpu
