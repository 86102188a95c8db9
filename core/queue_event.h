#pragma once
// QueueEvent: a point in a device's queue of work, recorded by its tensor backend
// (Backend::record_event, core/tensor/backend_impl.h) so that a consumer elsewhere can order
// itself after the work queued before it: a collective on another stream (the NCCL
// communicator's), or the host. A GPU backend's event is a CUDA event recorded on the device's
// compute stream; a CPU backend finishes every call before it returns and records none (null).
//
// Contract: once recorded, the point does not move; synchronize() and make_stream_wait() may be
// called from any thread, any number of times, while the event lives. No CUDA header here: a
// stream is passed as the opaque cudaStream_t.

namespace towerflow {

class QueueEvent {
 public:
  virtual ~QueueEvent() = default;
  // Blocks the calling thread until the point has been reached (the work before it is done).
  virtual void synchronize() const = 0;
  // Makes `cuda_stream` (a cudaStream_t of any device) wait, on the GPU, until the point has been
  // reached; the host does not block. Throws DeviceError for an event that is not a CUDA event.
  virtual void make_stream_wait(void* cuda_stream) const = 0;
  // Milliseconds from `earlier` to this point on the device's clock, once both are reached
  // (waits for this one). Only for events recorded for timing (Backend::record_timing_event) on
  // the same device; -1 where the implementation cannot time.
  virtual double milliseconds_since(const QueueEvent& earlier) const {
    (void)earlier;
    return -1;
  }
};

}  // namespace towerflow
