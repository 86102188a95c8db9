// NCCL communicator: one NCCL rank per participant GPU, all in this process (ncclCommInitAll),
// each rank driven by its own tower thread on its own stream.
#include "core/collectives/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <mutex>
#include <set>
#include <thread>

namespace towerflow::collectives {

namespace {

void cuda_check(cudaError_t status, const char* call, int ordinal) {
  if (status != cudaSuccess)
    raise<DeviceError>(call, " failed on CUDA device ", ordinal, ": ", cudaGetErrorString(status));
}

void nccl_check(ncclResult_t status, const char* call, int ordinal) {
  if (status != ncclSuccess)
    raise<DeviceError>(call, " failed on CUDA device ", ordinal, ": ", ncclGetErrorString(status));
}

}  // namespace

bool nccl_can_join(const std::vector<int>& gpu_ordinals) {
  std::set<int> distinct(gpu_ordinals.begin(), gpu_ordinals.end());
  return !gpu_ordinals.empty() && distinct.size() == gpu_ordinals.size();
}

struct NcclCommunicator::Impl {
  std::vector<int> ordinals;
  std::vector<ncclComm_t> comms;
  std::vector<cudaStream_t> streams;
  std::atomic<bool> aborted{false};
  std::atomic<bool> comms_broken{false};
  std::mutex mu;
  std::string reason;

  void init_comms() {
    comms.assign(ordinals.size(), nullptr);
    nccl_check(ncclCommInitAll(comms.data(), static_cast<int>(ordinals.size()), ordinals.data()),
               "ncclCommInitAll", ordinals.front());
    comms_broken = false;
  }

  [[noreturn]] void throw_aborted() {
    std::lock_guard lock(mu);
    raise<CollectiveAborted>("collective aborted: ", reason.empty() ? "another participant failed" : reason);
  }

  // Waits for participant p's stream; on abort, aborts p's NCCL communicator (which makes the
  // kernel return) and throws.
  void wait(int p) {
    for (;;) {
      cudaError_t s = cudaStreamQuery(streams[p]);
      if (s == cudaSuccess) break;
      if (s != cudaErrorNotReady) cuda_check(s, "cudaStreamQuery", ordinals[p]);
      if (aborted.load(std::memory_order_acquire)) {
        comms_broken = true;
        ncclCommAbort(comms[p]);
        comms[p] = nullptr;
        throw_aborted();
      }
      std::this_thread::yield();
    }
    if (aborted.load(std::memory_order_acquire)) throw_aborted();
  }

  void enter(int p) {
    if (aborted.load(std::memory_order_acquire)) throw_aborted();
    cuda_check(cudaSetDevice(ordinals[p]), "cudaSetDevice", ordinals[p]);
  }
};

NcclCommunicator::NcclCommunicator(std::vector<Device> devices, std::vector<int> gpu_ordinals)
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
  impl_->ordinals = std::move(gpu_ordinals);
  impl_->streams.resize(devices_.size());
  for (std::size_t i = 0; i < devices_.size(); ++i) {
    cuda_check(cudaSetDevice(impl_->ordinals[i]), "cudaSetDevice", impl_->ordinals[i]);
    cuda_check(cudaStreamCreateWithFlags(&impl_->streams[i], cudaStreamNonBlocking),
               "cudaStreamCreateWithFlags", impl_->ordinals[i]);
  }
  impl_->init_comms();
}

NcclCommunicator::~NcclCommunicator() {
  if (!impl_) return;
  for (std::size_t i = 0; i < impl_->comms.size(); ++i) {
    if (impl_->comms[i]) ncclCommDestroy(impl_->comms[i]);
    cudaSetDevice(impl_->ordinals[i]);
    if (impl_->streams[i]) cudaStreamDestroy(impl_->streams[i]);
  }
}

std::string NcclCommunicator::name() const {
  int version = 0;
  ncclGetVersion(&version);
  return str("NCCL ", version / 10000, ".", (version / 100) % 100, ".", version % 100, " (",
             devices_.size(), " GPUs)");
}

void NcclCommunicator::all_reduce_sum(int p, std::span<float> data) {
  TW_CHECK(p >= 0 && p < size(), "participant ", p, " of ", size());
  impl_->enter(p);
  nccl_check(ncclAllReduce(data.data(), data.data(), data.size(), ncclFloat, ncclSum,
                           impl_->comms[p], impl_->streams[p]),
             "ncclAllReduce", impl_->ordinals[p]);
  impl_->wait(p);
}

void NcclCommunicator::broadcast(int p, std::span<float> data, int root) {
  TW_CHECK(p >= 0 && p < size(), "participant ", p, " of ", size());
  if (root < 0 || root >= size())
    raise<InvalidArgument>("broadcast root ", root, " is not a participant; use 0..", size() - 1);
  impl_->enter(p);
  nccl_check(ncclBroadcast(data.data(), data.data(), data.size(), ncclFloat, root, impl_->comms[p],
                           impl_->streams[p]),
             "ncclBroadcast", impl_->ordinals[p]);
  impl_->wait(p);
}

void NcclCommunicator::all_gather(int p, std::span<const float> send, std::span<float> out) {
  TW_CHECK(p >= 0 && p < size(), "participant ", p, " of ", size());
  if (out.size() != send.size() * static_cast<std::size_t>(size()))
    raise<InvalidArgument>("all_gather: the output holds ", out.size(), " floats but ", size(),
                           " participants sending ", send.size(), " each need ",
                           send.size() * static_cast<std::size_t>(size()));
  impl_->enter(p);
  nccl_check(ncclAllGather(send.data(), out.data(), send.size(), ncclFloat, impl_->comms[p],
                           impl_->streams[p]),
             "ncclAllGather", impl_->ordinals[p]);
  impl_->wait(p);
}

void NcclCommunicator::barrier(int p) {
  // A one-element all-reduce on a scratch value is NCCL's barrier.
  TW_CHECK(p >= 0 && p < size(), "participant ", p, " of ", size());
  impl_->enter(p);
  float* scratch = nullptr;
  cuda_check(cudaMallocAsync(reinterpret_cast<void**>(&scratch), sizeof(float), impl_->streams[p]),
             "cudaMallocAsync", impl_->ordinals[p]);
  cuda_check(cudaMemsetAsync(scratch, 0, sizeof(float), impl_->streams[p]), "cudaMemsetAsync",
             impl_->ordinals[p]);
  nccl_check(ncclAllReduce(scratch, scratch, 1, ncclFloat, ncclSum, impl_->comms[p],
                           impl_->streams[p]),
             "ncclAllReduce (barrier)", impl_->ordinals[p]);
  cudaFreeAsync(scratch, impl_->streams[p]);
  impl_->wait(p);
}

void NcclCommunicator::abort(const std::string& reason) {
  {
    std::lock_guard lock(impl_->mu);
    if (impl_->reason.empty()) impl_->reason = reason;
  }
  impl_->aborted.store(true, std::memory_order_release);
}

void NcclCommunicator::reset() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->reason.clear();
  }
  if (impl_->comms_broken) {
    for (std::size_t i = 0; i < impl_->comms.size(); ++i)
      if (impl_->comms[i]) ncclCommAbort(impl_->comms[i]);
    impl_->init_comms();
  }
  impl_->aborted.store(false, std::memory_order_release);
}

}  // namespace towerflow::collectives
