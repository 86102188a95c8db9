// NCCL communicator: one NCCL rank per participant GPU, all in this process (ncclCommInitAll),
// each rank driven by its own tower thread on its own stream.
//
// Note [NCCL abort and shutdown]
// NCCL's documentation ("Error handling and communicator abort", "Finalizing a communicator",
// "Thread safety") fixes three rules this file follows:
// - A rank whose peer will never join blocks forever in its collective; only ncclCommAbort makes
//   the kernel return. abort() therefore aborts every rank's communicator itself, from the thread
//   that calls it (the failing tower's), not only the ranks that happen to be waiting: the failing
//   rank's own communicator may hold a launched collective too. A rank's communicator is used by
//   one thread at a time (NCCL's thread-safety rule), so each launch holds that rank's lock and
//   abort() takes it before aborting the rank.
// - ncclCommDestroy on a communicator that was not finalized finalizes it, and finalizing is
//   collective: destroying rank 0, then rank 1, from one thread waits in rank 0 for rank 1. One
//   thread that owns several ranks finalizes them inside ncclGroupStart/ncclGroupEnd, then
//   destroys each (a local operation once finalized).
// - A collective launch and a cudaFree on another thread can deadlock: launches hold
//   device_free_mutex() (core/memory/device_free_lock.h), as the CUDA sub-allocator's frees do.
// Waiting for a collective blocks the thread on an event made with cudaEventBlockingSync (no core
// spins per tower); an abort makes the kernel, and so the wait, return.
#include "core/collectives/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "core/collectives/process_group.h"
#include "core/log.h"
#include "core/memory/device_free_lock.h"

namespace towerflow::collectives {

namespace {

void cuda_check(cudaError_t status, const char* call, int ordinal) {
  if (status != cudaSuccess) {
    cudaGetLastError();
    raise<DeviceError>(call, " failed on CUDA device ", ordinal, ": ", cudaGetErrorString(status));
  }
}

void nccl_check(ncclResult_t status, const char* call, int ordinal) {
  if (status != ncclSuccess)
    raise<DeviceError>(call, " failed on CUDA device ", ordinal, ": ", ncclGetErrorString(status));
}

// What one participant asks for in one collective, compared across participants before launch.
struct Call {
  std::size_t count = 0;
  int root = 0;
};

}  // namespace

bool nccl_can_join(const std::vector<int>& gpu_ordinals) {
  std::set<int> distinct(gpu_ordinals.begin(), gpu_ordinals.end());
  return !gpu_ordinals.empty() && distinct.size() == gpu_ordinals.size();
}

struct NcclCommunicator::Impl {
  std::vector<Device> devices;
  std::vector<int> ordinals;
  ProcessGroup* processes = nullptr;  // null or one process: this process's GPUs only
  std::vector<ncclComm_t> comms;
  std::vector<cudaStream_t> streams;
  std::vector<cudaEvent_t> done;         // per participant, blocking-sync: see the Note
  std::vector<float*> scratch;           // one float per participant, for barrier()
  std::unique_ptr<std::mutex[]> rank_mu;  // per participant: one thread uses a rank at a time
  std::atomic<bool> aborted{false};
  bool comms_broken = false;  // under every rank_mu: some rank was aborted; reset() rebuilds

  // The host-side rendezvous of every collective (the count check of Communicator's contract).
  std::mutex mu;
  std::condition_variable cv;
  std::string reason;
  std::vector<Call> posted;
  std::vector<Call> round;  // the last complete round's calls
  int arrived = 0;
  std::uint64_t generation = 0;

  int n() const { return static_cast<int>(ordinals.size()); }
  bool across() const { return processes != nullptr && processes->size() > 1; }
  int total() const { return across() ? n() * processes->size() : n(); }  // NCCL ranks in all

  void init_comms() {
    comms.assign(ordinals.size(), nullptr);
    if (!across()) {
      nccl_check(ncclCommInitAll(comms.data(), n(), ordinals.data()), "ncclCommInitAll", ordinals.front());
    } else {
      // Across processes: rank 0's unique id, broadcast over the process group; this process's
      // ranks joined in one NCCL group (NCCL's "one process, several devices" rule).
      ncclUniqueId id{};
      if (processes->rank() == 0) nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId", ordinals.front());
      processes->broadcast(std::as_writable_bytes(std::span<ncclUniqueId>(&id, 1)), 0);
      const int first = processes->rank() * n();
      ncclResult_t r = ncclGroupStart();
      for (int p = 0; p < n() && r == ncclSuccess; ++p) {
        cuda_check(cudaSetDevice(ordinals[p]), "cudaSetDevice", ordinals[p]);
        r = ncclCommInitRank(&comms[p], total(), id, first + p);
      }
      const ncclResult_t end = ncclGroupEnd();
      nccl_check(r != ncclSuccess ? r : end, "ncclCommInitRank (across processes)", ordinals.front());
    }
    comms_broken = false;
  }

  // Waits for participant p's collective across processes: polls the event (sleeping between
  // polls, as the blocking-sync event does) and the process group, and aborts the NCCL
  // communicators when another rank has failed or the group's timeout has passed.
  cudaError_t wait_across(int p) {
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    for (;;) {
      const cudaError_t status = cudaEventQuery(done[p]);
      if (status != cudaErrorNotReady) return status;
      try {
        processes->check_peers();
        if (Clock::now() - start > processes->timeout())
          raise<PeerFailed>("an NCCL collective across processes did not complete within ",
                            processes->timeout().count() / 1000.0, " s on rank ", processes->rank(), " (",
                            devices[p], "): another rank died, hangs or is far behind");
      } catch (const std::exception& e) {
        {
          std::lock_guard lock(mu);
          if (reason.empty()) reason = e.what();
          aborted.store(true, std::memory_order_release);
        }
        cv.notify_all();
        abort_comms();
        throw;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  [[noreturn]] void throw_aborted() {
    std::lock_guard lock(mu);
    raise<CollectiveAborted>("collective aborted: ",
                             reason.empty() ? "another participant failed" : reason);
  }

  // Every participant posts its call; returns once all have, with every participant's call (the
  // same vector on every participant, so all reach the same verdict). Throws CollectiveAborted
  // when aborted before the round completes.
  std::vector<Call> rendezvous(int p, Call call) {
    std::unique_lock lock(mu);
    if (aborted.load(std::memory_order_acquire)) {
      lock.unlock();
      throw_aborted();
    }
    const std::uint64_t g = generation;
    posted[p] = call;
    if (++arrived == n()) {
      round = posted;
      arrived = 0;
      ++generation;
      cv.notify_all();
    } else {
      cv.wait(lock, [&] { return generation != g || aborted.load(std::memory_order_acquire); });
      if (generation == g) {
        lock.unlock();
        throw_aborted();
      }
    }
    return round;  // not overwritten before every participant of this round has read it
  }

  // Runs `launch` on participant p's communicator and stream, holding the rank's lock and the
  // device-free lock (Note [NCCL abort and shutdown]), then blocks until the stream has passed it.
  template <typename Launch>
  void run(int p, const char* what, Launch launch) {
    {
      std::lock_guard rank_lock(rank_mu[p]);
      if (aborted.load(std::memory_order_acquire) || comms[p] == nullptr) throw_aborted();
      cuda_check(cudaSetDevice(ordinals[p]), "cudaSetDevice", ordinals[p]);
      {
        std::lock_guard free_lock(device_free_mutex());
        nccl_check(launch(comms[p], streams[p]), what, ordinals[p]);
      }
      cuda_check(cudaEventRecord(done[p], streams[p]), "cudaEventRecord", ordinals[p]);
    }
    const cudaError_t status = across() ? wait_across(p) : cudaEventSynchronize(done[p]);
    if (aborted.load(std::memory_order_acquire)) {
      cudaGetLastError();
      throw_aborted();
    }
    cuda_check(status, "cudaEventSynchronize (NCCL collective)", ordinals[p]);
  }

  // Aborts every rank's communicator: Note [NCCL abort and shutdown].
  void abort_comms() {
    for (int p = 0; p < n(); ++p) {
      std::lock_guard rank_lock(rank_mu[p]);
      comms_broken = true;
      if (comms[p] == nullptr) continue;
      cudaSetDevice(ordinals[p]);
      const ncclResult_t r = ncclCommAbort(comms[p]);
      if (r != ncclSuccess)
        log_warning(str("ncclCommAbort on ", devices[p], ": ", ncclGetErrorString(r)));
      comms[p] = nullptr;
    }
  }

  void check_participant(int p) const {
    if (p < 0 || p >= n())
      raise<InvalidArgument>("participant ", p, " does not exist; this NCCL communicator has ",
                             n(), " (0..", n() - 1, ")");
  }
};

NcclCommunicator::NcclCommunicator(std::vector<Device> devices, std::vector<int> gpu_ordinals,
                                   ProcessGroup* processes)
    : devices_(std::move(devices)), impl_(std::make_unique<Impl>()) {
  impl_->processes = processes;
  if (devices_.empty())
    raise<InvalidArgument>("a communicator needs at least one device; got an empty device list");
  for (const Device& d : devices_)
    if (!d.is_gpu())
      raise<InvalidArgument>("NCCL joins GPUs only, but the device list has ", d,
                             "; use the local communicator for CPU devices");
  if (gpu_ordinals.empty())
    for (const Device& d : devices_) gpu_ordinals.push_back(d.index);
  if (gpu_ordinals.size() != devices_.size())
    raise<InvalidArgument>("NCCL communicator: ", gpu_ordinals.size(), " CUDA ordinals for ",
                           devices_.size(), " devices; give one per device");
  if (!nccl_can_join(gpu_ordinals))
    raise<DeviceError>("NCCL cannot join logical devices that share a physical GPU (CUDA ordinals ",
                       [&] {
                         std::string s;
                         for (int o : gpu_ordinals) s += (s.empty() ? "" : ",") + std::to_string(o);
                         return s;
                       }(),
                       "); reduce on a parameter device instead");
  Impl& m = *impl_;
  m.devices = devices_;
  m.ordinals = std::move(gpu_ordinals);
  const std::size_t n = devices_.size();
  m.streams.assign(n, nullptr);
  m.done.assign(n, nullptr);
  m.scratch.assign(n, nullptr);
  m.posted.resize(n);
  m.rank_mu = std::make_unique<std::mutex[]>(n);
  auto release = [&] {
    for (std::size_t i = 0; i < n; ++i) {
      cudaSetDevice(m.ordinals[i]);
      if (m.scratch[i]) cudaFree(m.scratch[i]);
      if (m.done[i]) cudaEventDestroy(m.done[i]);
      if (m.streams[i]) cudaStreamDestroy(m.streams[i]);
    }
  };
  try {
    for (std::size_t i = 0; i < n; ++i) {
      const int o = m.ordinals[i];
      cuda_check(cudaSetDevice(o), "cudaSetDevice", o);
      cuda_check(cudaStreamCreateWithFlags(&m.streams[i], cudaStreamNonBlocking),
                 "cudaStreamCreateWithFlags", o);
      cuda_check(cudaEventCreateWithFlags(&m.done[i],
                                          cudaEventBlockingSync | cudaEventDisableTiming),
                 "cudaEventCreateWithFlags", o);
      cuda_check(cudaMalloc(reinterpret_cast<void**>(&m.scratch[i]), sizeof(float)), "cudaMalloc",
                 o);
    }
    m.init_comms();
  } catch (...) {
    release();
    impl_.reset();
    throw;
  }
}

NcclCommunicator::~NcclCommunicator() {
  if (!impl_) return;
  Impl& m = *impl_;
  // Note [NCCL abort and shutdown]: finalize every live rank in one group, then destroy each.
  bool live = false;
  for (ncclComm_t c : m.comms) live = live || c != nullptr;
  if (live && !m.comms_broken) {
    ncclResult_t r = ncclGroupStart();
    for (int p = 0; p < m.n() && r == ncclSuccess; ++p) {
      cudaSetDevice(m.ordinals[p]);
      r = ncclCommFinalize(m.comms[p]);
    }
    const ncclResult_t end = ncclGroupEnd();
    if (r != ncclSuccess || end != ncclSuccess) {
      log_warning(str("ncclCommFinalize failed (", ncclGetErrorString(r != ncclSuccess ? r : end),
                      "); aborting the NCCL communicators instead"));
      m.abort_comms();
    }
  } else if (live) {
    m.abort_comms();  // a broken clique cannot finalize: its peers are gone
  }
  for (int p = 0; p < m.n(); ++p) {
    cudaSetDevice(m.ordinals[p]);
    if (m.comms[p]) ncclCommDestroy(m.comms[p]);
    if (m.scratch[p]) cudaFree(m.scratch[p]);
    if (m.done[p]) cudaEventDestroy(m.done[p]);
    if (m.streams[p]) cudaStreamDestroy(m.streams[p]);
  }
  cudaGetLastError();
}

std::string NcclCommunicator::name() const {
  int version = 0;
  ncclGetVersion(&version);
  return str("NCCL ", version / 10000, ".", (version / 100) % 100, ".", version % 100, " (", devices_.size(),
             impl_->across() ? str(" GPUs in each of ", impl_->processes->size(), " processes)") : std::string(" GPUs)"));
}

void NcclCommunicator::all_reduce_sum(int p, std::span<float> data) {
  all_reduce_sum_after(p, data, nullptr);
}

void NcclCommunicator::all_reduce_sum_after(int p, std::span<float> data,
                                            const QueueEvent* ready) {
  impl_->check_participant(p);
  const std::vector<Call> calls = impl_->rendezvous(p, {.count = data.size()});
  for (int i = 0; i < size(); ++i)
    if (calls[i].count != data.size())
      raise<InvalidArgument>("all_reduce_sum: participant ", i, " (", devices_[i], ") sums ",
                             calls[i].count, " floats but participant ", p, " (", devices_[p],
                             ") sums ", data.size(), "; every participant must pass the same count");
  if (ready != nullptr) ready->make_stream_wait(impl_->streams[p]);
  impl_->run(p, "ncclAllReduce", [&](ncclComm_t comm, cudaStream_t stream) {
    return ncclAllReduce(data.data(), data.data(), data.size(), ncclFloat, ncclSum, comm, stream);
  });
}

void NcclCommunicator::broadcast(int p, std::span<float> data, int root) {
  impl_->check_participant(p);
  const int total = impl_->total();
  if (root < 0 || root >= total)
    raise<InvalidArgument>("broadcast root ", root, " is not a participant; use 0..", total - 1);
  const std::vector<Call> calls = impl_->rendezvous(p, {.count = data.size(), .root = root});
  for (int i = 0; i < size(); ++i)
    if (calls[i].count != data.size() || calls[i].root != root)
      raise<InvalidArgument>("broadcast: participant ", i, " (", devices_[i], ") expects ",
                             calls[i].count, " floats from root ", calls[i].root,
                             " but participant ", p, " (", devices_[p], ") expects ", data.size(),
                             " from root ", root,
                             "; every participant must pass the same count and root");
  impl_->run(p, "ncclBroadcast", [&](ncclComm_t comm, cudaStream_t stream) {
    return ncclBroadcast(data.data(), data.data(), data.size(), ncclFloat, root, comm, stream);
  });
}

void NcclCommunicator::all_gather(int p, std::span<const float> send, std::span<float> out) {
  impl_->check_participant(p);
  const std::size_t total = static_cast<std::size_t>(impl_->total());
  if (out.size() != send.size() * total)
    raise<InvalidArgument>("all_gather: the output holds ", out.size(), " floats but ", total,
                           " participants sending ", send.size(), " each need ", send.size() * total);
  const std::vector<Call> calls = impl_->rendezvous(p, {.count = send.size()});
  for (int i = 0; i < size(); ++i)
    if (calls[i].count != send.size())
      raise<InvalidArgument>("all_gather: participant ", i, " (", devices_[i], ") sends ",
                             calls[i].count, " floats but participant ", p, " (", devices_[p],
                             ") sends ", send.size(), "; every participant must send the same count");
  impl_->run(p, "ncclAllGather", [&](ncclComm_t comm, cudaStream_t stream) {
    return ncclAllGather(send.data(), out.data(), send.size(), ncclFloat, comm, stream);
  });
}

void NcclCommunicator::barrier(int p) {
  // The host rendezvous plus a one-element all-reduce, so the GPUs pass the barrier too.
  impl_->check_participant(p);
  impl_->rendezvous(p, {.count = 1});
  float* scratch = impl_->scratch[p];
  impl_->run(p, "ncclAllReduce (barrier)", [&](ncclComm_t comm, cudaStream_t stream) {
    return ncclAllReduce(scratch, scratch, 1, ncclFloat, ncclSum, comm, stream);
  });
}

void NcclCommunicator::abort(const std::string& reason) {
  Impl& m = *impl_;
  {
    std::lock_guard lock(m.mu);
    if (m.reason.empty()) m.reason = reason;
    m.aborted.store(true, std::memory_order_release);
  }
  m.cv.notify_all();  // participants waiting for the others on the host
  m.abort_comms();    // participants waiting on the GPU: Note [NCCL abort and shutdown]
}

void NcclCommunicator::reset() {
  Impl& m = *impl_;
  if (m.comms_broken) {
    m.abort_comms();  // any rank not aborted yet
    m.init_comms();
  }
  std::lock_guard lock(m.mu);
  m.reason.clear();
  m.arrived = 0;
  m.aborted.store(false, std::memory_order_release);
}

}  // namespace towerflow::collectives
