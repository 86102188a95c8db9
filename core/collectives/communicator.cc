#include "core/collectives/communicator.h"

#include <set>

#include "core/collectives/local_communicator.h"
#include "core/collectives/nccl_communicator.h"

namespace towerflow::collectives {

std::unique_ptr<Communicator> make_communicator(const std::vector<Device>& devices,
                                                CommunicatorKind kind,
                                                const std::vector<int>& gpu_ordinals,
                                                ProcessGroup* processes) {
  if (devices.empty())
    raise<InvalidArgument>("a communicator needs at least one device; got an empty device list");
  for (const Device& d : devices)
    if (d.kind != devices.front().kind)
      raise<InvalidArgument>("a communicator joins devices of one kind, but the list mixes ",
                             devices.front(), " and ", d, "; reduce mixed devices on a parameter device");
  if (kind == CommunicatorKind::Auto)
    kind = devices.front().is_cpu() ? CommunicatorKind::Local : CommunicatorKind::Nccl;
  if (kind == CommunicatorKind::Local) {
    if (!devices.front().is_cpu())
      raise<InvalidArgument>("the local communicator works on host memory; ", devices.front(),
                             " is a GPU: use NCCL (CommunicatorKind::Nccl) or a parameter device");
    return std::make_unique<LocalCommunicator>(devices);
  }
  return std::make_unique<NcclCommunicator>(devices, gpu_ordinals, processes);
}

}  // namespace towerflow::collectives
