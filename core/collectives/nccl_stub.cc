// The NCCL communicator of a build without CUDA: every entry point says how to get one.
#include "core/collectives/nccl_communicator.h"

namespace towerflow::collectives {

struct NcclCommunicator::Impl {};

namespace {
[[noreturn]] void no_nccl() {
  raise<DeviceError>("this build has no CUDA support, so no NCCL communicator; rebuild with "
                     "-DTOWERFLOW_CUDA=ON (CUDA toolkit and NCCL installed), or reduce on a "
                     "parameter device");
}
}  // namespace

NcclCommunicator::NcclCommunicator(std::vector<Device> devices, std::vector<int>, ProcessGroup*)
    : devices_(std::move(devices)) {
  no_nccl();
}
NcclCommunicator::~NcclCommunicator() = default;
void NcclCommunicator::all_reduce_sum(int, std::span<float>) { no_nccl(); }
void NcclCommunicator::all_reduce_sum_after(int, std::span<float>, const QueueEvent*) { no_nccl(); }
void NcclCommunicator::all_reduce_sum_queued(int, std::span<float>, const QueueEvent*) { no_nccl(); }
void NcclCommunicator::wait_queued(int) { no_nccl(); }
void NcclCommunicator::broadcast(int, std::span<float>, int) { no_nccl(); }
void NcclCommunicator::all_gather(int, std::span<const float>, std::span<float>) { no_nccl(); }
void NcclCommunicator::barrier(int) { no_nccl(); }
void NcclCommunicator::abort(const std::string&) {}
void NcclCommunicator::reset() {}
std::string NcclCommunicator::name() const { return "NCCL (not built)"; }

bool nccl_can_join(const std::vector<int>&) { return false; }

}  // namespace towerflow::collectives
