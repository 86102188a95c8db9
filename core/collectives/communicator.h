#pragma once
// Communicator: the collectives that towers use to combine gradients and share parameters.
//
// A communicator joins a fixed group of participants (one per tower: a logical device). Every
// collective is called by *every* participant, each from its own thread, with its own participant
// index and its own buffer; a call returns on a participant once that participant's part of the
// result is in its buffer (the local CPU implementation: once the whole collective is complete).
// Participants must issue the same sequence of collectives with the same element counts; a count
// that differs between participants raises InvalidArgument on every participant.
//
// Buffers are float32 and live on the participant's device (host memory for CPU devices, device
// memory for GPUs in the NCCL implementation). Results are bit-identical on every participant:
// every element is summed in the same fixed order (participant 0, 1, ..., n-1) once and copied.
//
// Failure: if one participant cannot take part (its tower threw), the owner calls abort(); every
// participant blocked in or later entering a collective throws CollectiveAborted instead of
// hanging. After every participant has left, reset() makes the communicator usable again.
//
// Implementations: LocalCommunicator (CPU devices in one process, shared memory), the NCCL
// communicator (GPUs of one process, or of every process of a job; CUDA builds only), and the
// hierarchical communicator (process_group.h), whose participants are every process's devices.

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "core/queue_event.h"

namespace towerflow::collectives {

// Thrown by a collective that was aborted because another participant failed.
class CollectiveAborted : public Error {
 public:
  using Error::Error;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  // Participants of this process, in order: participant i runs on devices()[i].
  virtual const std::vector<Device>& devices() const = 0;
  int size() const { return static_cast<int>(devices().size()); }

  // data <- sum over participants of data (in place).
  virtual void all_reduce_sum(int participant, std::span<float> data) = 0;
  // The same for a buffer whose producing work may still be queued on the participant's device:
  // the collective reads `data` only after `ready` has been reached (null: nothing is pending).
  // Note [Bucketed reduction during backward] in tower/reducer_bucketed.cc records one such event
  // per bucket on the tower's compute stream. The default waits for the event on the calling
  // thread and then runs all_reduce_sum; the NCCL communicator makes its own stream wait for it on the
  // GPU instead, so neither the host nor the compute stream stalls.
  virtual void all_reduce_sum_after(int participant, std::span<float> data,
                                    const QueueEvent* ready) {
    if (ready != nullptr) ready->synchronize();
    all_reduce_sum(participant, data);
  }
  // Queues data <- sum over participants (as all_reduce_sum_after) and returns without waiting for the
  // result where the implementation can (NCCL: on its stream); the buffer must stay alive and untouched
  // until wait_queued(participant) returns. Default: all_reduce_sum_after, synchronously.
  virtual void all_reduce_sum_queued(int participant, std::span<float> data, const QueueEvent* ready) {
    all_reduce_sum_after(participant, data, ready);
  }
  // Returns once every collective this participant queued has completed (raising as the collectives would).
  virtual void wait_queued(int participant) {}
  // data <- root's data on every participant.
  virtual void broadcast(int participant, std::span<float> data, int root) = 0;
  // out[i * send.size() .. (i+1) * send.size()) <- participant i's send, on every participant.
  // out.size() must be size() * send.size().
  virtual void all_gather(int participant, std::span<const float> send, std::span<float> out) = 0;
  // Returns once every participant has called barrier().
  virtual void barrier(int participant) = 0;

  // Makes every current and future collective throw CollectiveAborted(reason) until reset().
  // Callable from any thread; idempotent.
  virtual void abort(const std::string& reason) = 0;
  // Clears an abort. Call only when no participant is inside a collective.
  virtual void reset() = 0;

  // "local shared-memory (2 CPU participants)", "NCCL 2.x (4 GPUs)".
  virtual std::string name() const = 0;

  // The last collectives each participant entered (up to 64 each, oldest first), as a JSON array
  // with one object per participant: {"participant", "device", "recent": [{"seq", "op", "bytes",
  // "step" and "purpose" (where known), "started_s" (since the communicator was made),
  // "waited_s", "done"}]}; "[]" where the implementation keeps none.
  virtual std::string recent_collectives() const { return "[]"; }
};

// Which implementation make_communicator() picks.
enum class CommunicatorKind {
  Auto,   // Local for CPU devices; NCCL for distinct physical GPUs
  Local,  // host memory, one process
  Nccl,   // GPU memory, one process, one participant per physical GPU
};

// Builds a communicator for the given devices, which must all be of one kind. For GPUs,
// gpu_ordinals[i] is the CUDA ordinal of devices[i] (the registry's physical_index; empty means
// the logical index). Throws InvalidArgument for an empty or mixed list or a repeated device, and
// DeviceError when NCCL is asked for in a build without CUDA ("rebuild with -DTOWERFLOW_CUDA=ON")
// or for virtual devices that share one physical GPU (NCCL cannot run two ranks on one GPU: use
// the parameter-device reduction there).
// With `processes` (more than one), an NCCL communicator spans every process's GPUs (see
// nccl_communicator.h); the local communicator ignores it (wrap it with
// make_hierarchical_communicator).
class ProcessGroup;
std::unique_ptr<Communicator> make_communicator(const std::vector<Device>& devices,
                                                CommunicatorKind kind = CommunicatorKind::Auto,
                                                const std::vector<int>& gpu_ordinals = {},
                                                ProcessGroup* processes = nullptr);

// True when NCCL can join these GPUs: a CUDA build and distinct physical ordinals.
bool nccl_can_join(const std::vector<int>& gpu_ordinals);

}  // namespace towerflow::collectives
