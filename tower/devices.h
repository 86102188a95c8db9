#pragma once
// The devices a data-parallel run trains on when the program does not name them: the policy
// cifar10_train applies, for any program that embeds the trainer.
//
//   const auto towers = tw::tower::default_towers();   // every GPU, or two CPU towers
//   tw::tower::Trainer trainer{tw::models::factory("resnet20"), towers, {}};

#include <vector>

#include "core/device.h"
#include "core/platform/options.h"

namespace towerflow::tower {

struct TowerDefaults {
  bool has_gpu = false;           // this process sees a GPU
  int processes_on_host = 1;      // the job's processes on this host (ProcessGroup::local_size)
  int hardware_threads = 1;       // of this host
  bool two_cpu_towers = true;     // false: the program names its devices itself
};

// `opts` with the defaults of a data-parallel run filled in where `opts` leaves them unset:
// - Without a GPU, two logical CPU devices (device_count CPU=2, each with half of the host's
//   threads), so that the towers' path runs as on a machine with two GPUs; not where `opts` says
//   how many CPU devices there are (device_count "CPU", CPU virtual devices), nor without
//   two_cpu_towers.
// - Processes sharing a host share its threads: with processes_on_host > 1 and intra_op_threads
//   unset (or 0), each logical CPU device gets hardware_threads / processes_on_host / (CPU
//   devices of this process), at least 1.
ProcessOptions with_tower_defaults(ProcessOptions opts, const TowerDefaults& defaults);

// The towers by default: initialises the device registry with with_tower_defaults(opts) for this
// machine (its GPUs, its hardware threads, and the job's processes on this host) and returns every
// logical GPU, or without one every logical CPU device. InvalidArgument as initialise_devices.
std::vector<Device> default_towers(const ProcessOptions& opts = {});

}  // namespace towerflow::tower
