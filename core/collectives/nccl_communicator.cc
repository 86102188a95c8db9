// NCCL communicator: the binding of NcclRanks (nccl_ranks.h: the locking, rendezvous, waiting,
// abort and reset logic, free of CUDA) to NCCL and the CUDA runtime. One NCCL rank per
// participant GPU, each driven by its own tower thread on its own stream; the communicators are
// non-blocking (Note [Waiting without hanging] in nccl_ranks.cc).
//
// Note [Eager NCCL connections]
// NCCL >= 2.22 connects its channels lazily, inside the first collective of each algorithm
// (NCCL_RUNTIME_CONNECT, default 1): that collective waits there for every peer, and its ring,
// tree and NVLS buffers are allocated then, after the trainer has reserved the device's memory
// (Note [Growth and back-off] in bfc_allocator.cc), where they may not fit. Before its first NCCL
// call this file sets NCCL_RUNTIME_CONNECT=0 (without overwriting a value the user set), so the
// connections and their buffers are made while the communicators are created, which the
// trainer does before it builds the replicas.
#include "core/collectives/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <set>

#include "core/collectives/nccl_ranks.h"
#include "core/collectives/process_group.h"
#include "core/log.h"

namespace towerflow::collectives {

namespace {

std::string cuda_error(const char* call, int ordinal, cudaError_t status) {
  cudaGetLastError();
  return str(call, " on CUDA device ", ordinal, ": ", cudaGetErrorString(status));
}

void cuda_check(cudaError_t status, const char* call, int ordinal) {
  if (status != cudaSuccess) raise<DeviceError>(cuda_error(call, ordinal, status), " failed");
}

NcclState nccl_state(ncclResult_t r, const char* call, int ordinal) {
  if (r == ncclSuccess) return NcclState::success();
  if (r == ncclInProgress) return NcclState::in_progress();
  return NcclState::failed(str(call, " on CUDA device ", ordinal, ": ", ncclGetErrorString(r), " (",
                               ncclGetLastError(nullptr), ")"));
}

// NcclBackend over NCCL and the CUDA runtime: a stream, an event and a scratch float per rank.
class CudaNcclBackend final : public NcclBackend {
 public:
  explicit CudaNcclBackend(std::vector<int> ordinals) : ordinals_(std::move(ordinals)) {
    setenv("NCCL_RUNTIME_CONNECT", "0", /*overwrite=*/0);  // Note [Eager NCCL connections]
    const std::size_t n = ordinals_.size();
    comms_.assign(n, nullptr);
    streams_.assign(n, nullptr);
    done_.assign(n, nullptr);
    scratch_.assign(n, nullptr);
    try {
      for (std::size_t i = 0; i < n; ++i) {
        const int o = ordinals_[i];
        cuda_check(cudaSetDevice(o), "cudaSetDevice", o);
        cuda_check(cudaStreamCreateWithFlags(&streams_[i], cudaStreamNonBlocking), "cudaStreamCreateWithFlags", o);
        // Polled (cudaEventQuery), never waited on: no blocking-sync flag.
        cuda_check(cudaEventCreateWithFlags(&done_[i], cudaEventDisableTiming), "cudaEventCreateWithFlags", o);
        cuda_check(cudaMalloc(reinterpret_cast<void**>(&scratch_[i]), sizeof(float)), "cudaMalloc", o);
      }
    } catch (...) {
      release();
      throw;
    }
  }
  ~CudaNcclBackend() override { release(); }

  int ranks() const override { return static_cast<int>(ordinals_.size()); }

  std::vector<std::byte> unique_id() override {
    ncclUniqueId id{};
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess)
      raise<DeviceError>("ncclGetUniqueId failed on CUDA device ", ordinals_.front(), ": ", ncclGetErrorString(r));
    std::vector<std::byte> bytes(sizeof id);
    std::memcpy(bytes.data(), &id, sizeof id);
    return bytes;
  }

  NcclState init(std::span<const std::byte> id_bytes, int total_ranks, int first_rank) override {
    ncclUniqueId id{};
    if (id_bytes.size() != sizeof id)
      return NcclState::failed(str("the NCCL unique id has ", id_bytes.size(), " bytes; NCCL expects ", sizeof id));
    std::memcpy(&id, id_bytes.data(), sizeof id);
    std::fill(comms_.begin(), comms_.end(), nullptr);
    // One group over this process's ranks (NCCL's rule for several devices in one thread); each
    // rank non-blocking, so the group returns ncclInProgress and async_error(p) says when it is done.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclGroupStart();
    for (int p = 0; p < ranks() && (r == ncclSuccess || r == ncclInProgress); ++p) {
      const cudaError_t c = cudaSetDevice(ordinals_[p]);
      if (c != cudaSuccess) {
        ncclGroupEnd();
        return NcclState::failed(cuda_error("cudaSetDevice", ordinals_[p], c));
      }
      r = ncclCommInitRankConfig(&comms_[p], total_ranks, id, first_rank + p, &config);
    }
    const ncclResult_t end = ncclGroupEnd();
    if (r != ncclSuccess && r != ncclInProgress) return nccl_state(r, "ncclCommInitRankConfig", ordinals_.front());
    return nccl_state(end, "ncclGroupEnd (ncclCommInitRankConfig)", ordinals_.front());
  }

  NcclState all_reduce(int p, std::span<float> data, const QueueEvent* ready) override {
    if (const NcclState s = use(p); !s.ok()) return s;
    if (ready != nullptr) {
      try {
        ready->make_stream_wait(streams_[p]);
      } catch (const std::exception& e) {
        return NcclState::failed(e.what());
      }
    }
    return nccl_state(ncclAllReduce(data.data(), data.data(), data.size(), ncclFloat, ncclSum, comms_[p], streams_[p]),
                      "ncclAllReduce", ordinals_[p]);
  }
  NcclState broadcast(int p, std::span<float> data, int root) override {
    if (const NcclState s = use(p); !s.ok()) return s;
    return nccl_state(ncclBroadcast(data.data(), data.data(), data.size(), ncclFloat, root, comms_[p], streams_[p]),
                      "ncclBroadcast", ordinals_[p]);
  }
  NcclState all_gather(int p, std::span<const float> send, std::span<float> out) override {
    if (const NcclState s = use(p); !s.ok()) return s;
    return nccl_state(ncclAllGather(send.data(), out.data(), send.size(), ncclFloat, comms_[p], streams_[p]),
                      "ncclAllGather", ordinals_[p]);
  }
  NcclState barrier(int p) override {
    if (const NcclState s = use(p); !s.ok()) return s;
    return nccl_state(ncclAllReduce(scratch_[p], scratch_[p], 1, ncclFloat, ncclSum, comms_[p], streams_[p]),
                      "ncclAllReduce (barrier)", ordinals_[p]);
  }

  NcclState record_done(int p) override {
    if (const NcclState s = use(p); !s.ok()) return s;
    const cudaError_t c = cudaEventRecord(done_[p], streams_[p]);
    return c == cudaSuccess ? NcclState::success() : NcclState::failed(cuda_error("cudaEventRecord", ordinals_[p], c));
  }
  NcclState query_done(int p) override {
    const cudaError_t c = cudaEventQuery(done_[p]);
    if (c == cudaSuccess) return NcclState::success();
    if (c == cudaErrorNotReady) return NcclState::in_progress();
    return NcclState::failed(cuda_error("cudaEventQuery (NCCL collective)", ordinals_[p], c));
  }
  NcclState async_error(int p) override {
    ncclResult_t e = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comms_[p], &e);
    if (r != ncclSuccess) return nccl_state(r, "ncclCommGetAsyncError", ordinals_[p]);
    return nccl_state(e, "NCCL communicator", ordinals_[p]);
  }

  void abort(int p) override {
    if (comms_[p] == nullptr) return;
    cudaSetDevice(ordinals_[p]);
    const ncclResult_t r = ncclCommAbort(comms_[p]);  // frees the communicator: not used until init()
    if (r != ncclSuccess)
      log_warning(str("ncclCommAbort on CUDA device ", ordinals_[p], ": ", ncclGetErrorString(r)));
  }
  NcclState finalize_all() override {
    ncclResult_t r = ncclGroupStart();
    for (int p = 0; p < ranks() && (r == ncclSuccess || r == ncclInProgress); ++p) {
      cudaSetDevice(ordinals_[p]);
      r = ncclCommFinalize(comms_[p]);
    }
    const ncclResult_t end = ncclGroupEnd();
    if (r != ncclSuccess && r != ncclInProgress) return nccl_state(r, "ncclCommFinalize", ordinals_.front());
    return nccl_state(end, "ncclGroupEnd (ncclCommFinalize)", ordinals_.front());
  }
  void destroy(int p) override {
    if (comms_[p] == nullptr) return;
    cudaSetDevice(ordinals_[p]);
    const ncclResult_t r = ncclCommDestroy(comms_[p]);
    if (r != ncclSuccess)
      log_warning(str("ncclCommDestroy on CUDA device ", ordinals_[p], ": ", ncclGetErrorString(r)));
    comms_[p] = nullptr;
  }
  std::string version() const override {
    int v = 0;
    ncclGetVersion(&v);
    return str("NCCL ", v / 10000, ".", (v / 100) % 100, ".", v % 100);
  }

 private:
  NcclState use(int p) {
    const cudaError_t c = cudaSetDevice(ordinals_[p]);
    return c == cudaSuccess ? NcclState::success() : NcclState::failed(cuda_error("cudaSetDevice", ordinals_[p], c));
  }
  void release() {
    for (std::size_t i = 0; i < ordinals_.size(); ++i) {
      cudaSetDevice(ordinals_[i]);
      if (scratch_[i]) cudaFree(scratch_[i]);
      if (done_[i]) cudaEventDestroy(done_[i]);
      if (streams_[i]) cudaStreamDestroy(streams_[i]);
      scratch_[i] = nullptr;
      done_[i] = nullptr;
      streams_[i] = nullptr;
    }
    cudaGetLastError();
  }

  std::vector<int> ordinals_;
  std::vector<ncclComm_t> comms_;
  std::vector<cudaStream_t> streams_;
  std::vector<cudaEvent_t> done_;  // per rank: recorded after the last queued collective
  std::vector<float*> scratch_;    // one float per rank, for barrier()
};

}  // namespace

bool nccl_can_join(const std::vector<int>& gpu_ordinals) {
  std::set<int> distinct(gpu_ordinals.begin(), gpu_ordinals.end());
  return !gpu_ordinals.empty() && distinct.size() == gpu_ordinals.size();
}

struct NcclCommunicator::Impl {
  std::unique_ptr<NcclRanks> ranks;
};

NcclCommunicator::NcclCommunicator(std::vector<Device> devices, std::vector<int> gpu_ordinals,
                                   ProcessGroup* processes)
    : devices_(std::move(devices)), impl_(std::make_unique<Impl>()) {
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
  impl_->ranks = std::make_unique<NcclRanks>(
      devices_, std::make_unique<CudaNcclBackend>(std::move(gpu_ordinals)), processes,
      NcclRanksOptions{.timeout = collective_timeout(NcclRanksOptions{}.timeout)});
}

NcclCommunicator::~NcclCommunicator() = default;

std::string NcclCommunicator::name() const { return impl_->ranks->name(); }
void NcclCommunicator::all_reduce_sum(int p, std::span<float> data) { impl_->ranks->all_reduce_sum(p, data); }
void NcclCommunicator::all_reduce_sum_after(int p, std::span<float> data, const QueueEvent* ready) {
  impl_->ranks->all_reduce_sum_after(p, data, ready);
}
void NcclCommunicator::all_reduce_sum_queued(int p, std::span<float> data, const QueueEvent* ready) {
  impl_->ranks->all_reduce_sum_queued(p, data, ready);
}
void NcclCommunicator::wait_queued(int p) { impl_->ranks->wait_queued(p); }
void NcclCommunicator::broadcast(int p, std::span<float> data, int root) { impl_->ranks->broadcast(p, data, root); }
void NcclCommunicator::all_gather(int p, std::span<const float> send, std::span<float> out) {
  impl_->ranks->all_gather(p, send, out);
}
void NcclCommunicator::barrier(int p) { impl_->ranks->barrier(p); }
void NcclCommunicator::abort(const std::string& reason) { impl_->ranks->abort(reason); }
void NcclCommunicator::reset() { impl_->ranks->reset(); }

}  // namespace towerflow::collectives
